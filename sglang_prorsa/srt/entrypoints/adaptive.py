"""``launch_server --pd-adaptive``: the front (router + Prorsa control plane) over engine instances it starts itself.

Each instance is a full SGLang server started through our launcher with ``--enable-pd-role-switch``, its own bootstrap
port and a role; the front routes ``/generate`` and the OpenAI endpoints to a prefill+decode pair, feeds the lifecycle
tracker from the requests it routes, and every control interval turns the forecast into a target ratio (Eq. 1) and
the planned switches into busy switches (``role_switch/executor.py``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from sglang_prorsa import __version__
from sglang_prorsa.srt import cpu_recipe
from sglang_prorsa.srt.entrypoints.http_utils import error, field_error, json_object
from sglang_prorsa.srt.entrypoints.instances import EngineInstance, InstancePool
from sglang_prorsa.srt.entrypoints.lifecycle_api import make_router
from sglang_prorsa.srt.entrypoints.pd_router import PDRouter, RouteError
from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane
from sglang_prorsa.srt.lifecycle.engine_api import trajectory_id_of
from sglang_prorsa.srt.role_switch.capacity import Role
from sglang_prorsa.srt.role_switch.controller import ControllerConfig, RoleSwitchController
from sglang_prorsa.srt.role_switch.executor import SwitchExecutor, SwitchRefused
from sglang_prorsa.srt.role_switch.planner import PlannerConfig
from sglang_prorsa.srt.role_switch.throughput import ThroughputConfig, ThroughputEstimator
from sglang_prorsa.srt.server_flags import ProrsaFlags
from sglang_prorsa.srt.utils.clock import WallClock

logger = logging.getLogger("sglang_prorsa.front")

# Prefill speed to assume before any busy interval has been measured (tokens/s/instance); CPU-sized.
PROFILED_THETA_P = 2000.0


class RouterHooks:
    """What the router tells the control plane about the requests it routes (engine side of paper §4.1.1)."""

    def __init__(self, control_plane: LifecycleControlPlane, throughput: ThroughputEstimator) -> None:
        self.cp = control_plane
        self.throughput = throughput

    def dispatched(self, tid: str | None, rid: str, prefill: EngineInstance, decode: EngineInstance,
                   prompt: int) -> None:
        self.throughput.start(prefill.instance_id, rid, max(prompt, 0))
        if tid:
            self.cp.engine.request_arrived(tid, prompt, instance=prefill.instance_id)
            self.cp.engine.prefill_started(tid, prefill.instance_id)

    def prefilled(self, tid: str | None, rid: str, prefill: EngineInstance, ok: bool) -> None:
        (self.throughput.finish if ok else self.throughput.abort)(prefill.instance_id, rid)
        if tid and ok:
            self.cp.engine.prefill_finished(tid, prefill.instance_id)

    def decoded(self, tid: str | None, rid: str, ok: bool) -> None:
        if tid and ok:
            self.cp.engine.decode_finished(tid)


class AdaptiveFront:
    def __init__(self, pool: InstancePool, flags: ProrsaFlags, tokenizer: Any = None) -> None:
        clock = WallClock()
        self.flags = flags
        self.pool = pool
        self.control_plane = LifecycleControlPlane(clock=clock)
        self.throughput = ThroughputEstimator(ThroughputConfig(profiled_theta=PROFILED_THETA_P), clock)
        self.router = PDRouter(pool, tokenizer, RouterHooks(self.control_plane, self.throughput))
        self.executor = SwitchExecutor(pool, self.router)
        planner = PlannerConfig(min_dwell_s=flags.prorsa_min_dwell_s, hysteresis=flags.prorsa_hysteresis)
        self.controller = RoleSwitchController(ControllerConfig(horizon_s=flags.prorsa_horizon_s, planner=planner),
                                               self.throughput, clock)
        self.interval_s = flags.prorsa_control_interval_s or flags.prorsa_horizon_s
        self.auto = not flags.prorsa_manual_switch
        self.decisions = 0

    async def refresh_reports(self) -> None:
        async def one(inst: EngineInstance) -> None:
            try:
                s = await self.router.session()
                async with s.get(inst.url + "/prorsa/status", timeout=5) as r:
                    st = await r.json()
                inst.kv_footprint_tokens = int(st.get("kv_footprint_tokens", 0))
                inst.kv_capacity_tokens = int(st.get("kv_capacity_tokens", 0))
            except Exception as e:  # keep the last report; the next tick tries again
                logger.warning("status of %s unavailable: %s", inst.instance_id, e)

        await asyncio.gather(*(one(i) for i in self.pool))

    async def control_tick(self) -> dict:
        """Forecast → Eq. 1 → plan → busy switches, once."""
        await self.refresh_reports()
        fc = self.control_plane.forecast()
        profile = self.throughput.profile_of(1024)
        decision = self.controller.step(fc.prefill_tokens, fc.decode_kv_tokens, self.pool.reports(), profile)
        self.decisions += 1
        done = []
        for sw in decision.plan.switches:
            try:
                done.append(await self.executor.switch(sw.instance_id, sw.dst))
            except SwitchRefused as e:
                logger.info("planned switch of %s skipped: %s", sw.instance_id, e)
        return {"decision": decision.to_dict(), "forecast": fc.to_dict(), "executed": done}

    async def control_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.control_tick()
            except Exception:
                logger.exception("control tick failed; retrying next interval")

    def metrics_text(self) -> str:
        lines = [f'prorsa_front_{k}_total {v}' for k, v in sorted(self.router.stats.items())]
        for inst in self.pool:
            lab = f'instance="{inst.instance_id}",role="{inst.role.value}"'
            lines += [f"prorsa_instance_switches_total{{{lab}}} {inst.switches}",
                      f"prorsa_instance_inflight_requests{{{lab}}} {inst.inflight_requests}",
                      f"prorsa_instance_kv_footprint_tokens{{{lab}}} {inst.kv_footprint_tokens}"]
        return "\n".join(lines) + "\n"


def build_app(front: AdaptiveFront) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(_ticker(front.control_plane.tick))]
        if front.auto:
            tasks.append(asyncio.create_task(front.control_loop()))
        yield
        for t in tasks:
            t.cancel()
        await front.router.close()

    app = FastAPI(title="sglang-prorsa adaptive front", lifespan=lifespan)
    app.include_router(make_router(front.control_plane))

    @app.get("/health")
    async def health():
        return {"status": "ok", "instances": len(front.pool.instances)}

    @app.get("/prorsa/info")
    async def info():
        return {"sglang_prorsa": __version__, "mode": "pd-adaptive", "auto_switch": front.auto,
                "control_interval_s": front.interval_s}

    @app.get("/prorsa/instances")
    async def instances():
        return {"instances": [i.describe() for i in front.pool], "switches": front.executor.history}

    @app.get("/prorsa/decision")
    async def decision():
        return {"decision": front.controller.last_decision(), "theta_p": front.throughput.snapshot()}

    @app.post("/prorsa/control_tick")
    async def control_tick():
        return await front.control_tick()

    @app.get("/prorsa/metrics")
    async def metrics():
        return PlainTextResponse(front.metrics_text())

    @app.post("/prorsa/switch")
    async def switch(request: Request):
        body = await json_object(request)
        if isinstance(body, JSONResponse):
            return body
        inst, role = body.get("instance"), body.get("new_role")
        if not isinstance(inst, str) or inst not in front.pool.instances:
            return field_error("instance", f"must be one of {sorted(front.pool.instances)}, got {inst!r}")
        if role not in ("prefill", "decode"):
            return field_error("new_role", f"must be 'prefill' or 'decode', got {role!r}")
        try:
            return await front.executor.switch(inst, Role(role))
        except SwitchRefused as e:
            return error(e.status, str(e))

    @app.post("/generate")
    async def generate(request: Request):
        body = await json_object(request)
        if isinstance(body, JSONResponse):
            return body
        problem = _check_generate(body)
        if problem:
            return error(422, problem)
        tid = trajectory_id_of(body, request.headers)
        try:
            if _is_batch(body):
                items = _split_batch(body)
                return await asyncio.gather(*(front.router.generate(b, tid) for b in items))
            return await front.router.generate(body, tid)
        except RouteError as e:
            return error(e.status, e.message, e.detail)

    for path in ("/v1/completions", "/v1/chat/completions"):
        app.add_api_route(path, _openai_handler(front, path), methods=["POST"])
    return app


def _openai_handler(front: AdaptiveFront, path: str):
    async def handler(request: Request):
        body = await json_object(request)
        if isinstance(body, JSONResponse):
            return body
        if body.get("stream"):
            return field_error("stream", "streaming is not supported by the adaptive front; send stream=false", 400)
        tid = trajectory_id_of(body, request.headers)
        body.pop("trajectory_id", None)
        try:
            return await front.router.passthrough(path, body, tid)
        except RouteError as e:
            return error(e.status, e.message, e.detail)

    return handler


def _is_batch(body: dict) -> bool:
    ids = body.get("input_ids")
    return isinstance(body.get("text"), list) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list))


def _split_batch(body: dict) -> list[dict]:
    key = "text" if isinstance(body.get("text"), list) else "input_ids"
    prompts = body[key]
    sp = body.get("sampling_params")
    out = []
    for i, p in enumerate(prompts):
        item = dict(body)
        item[key] = p
        if isinstance(sp, list):
            item["sampling_params"] = sp[i]
        out.append(item)
    return out


def _check_generate(body: dict) -> str | None:
    if body.get("stream"):
        return "field 'stream': streaming is not supported by the adaptive front; send stream=false"
    if ("text" in body) == ("input_ids" in body):
        return "exactly one of fields 'text' and 'input_ids' is required"
    sp = body.get("sampling_params", {})
    if _is_batch(body):
        n = len(body.get("text") or body.get("input_ids"))
        if isinstance(sp, list) and len(sp) != n:
            return f"field 'sampling_params': {len(sp)} entries for {n} prompts"
        sps = sp if isinstance(sp, list) else [sp]
    else:
        sps = [sp]
    for s in sps:
        if not isinstance(s, dict):
            return "field 'sampling_params': must be an object"
        mnt = s.get("max_new_tokens")
        if mnt is not None and (not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 0):
            return "field 'sampling_params.max_new_tokens': must be a non-negative integer"
    return None


async def _ticker(tick, interval_s: float = 0.25) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            tick()
        except Exception:
            logger.exception("lifecycle tick failed")


# -- process management ------------------------------------------------------------------------------------------

def instance_argv(sglang_argv: list[str], port: int, bootstrap_port: int, role: Role) -> list[str]:
    """The front's SGLang flags for one instance: host/port/role/bootstrap are the front's to choose."""
    drop = {"--host", "--port", "--disaggregation-mode", "--disaggregation-bootstrap-port"}
    out: list[str] = []
    skip = False
    for a in sglang_argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in drop:
            skip = "=" not in a
            continue
        out.append(a)
    if not cpu_recipe.given(out, "--disaggregation-transfer-backend"):
        out += ["--disaggregation-transfer-backend", "mooncake"]
    if not cpu_recipe.given(out, "--enable-pd-role-switch"):
        out.append("--enable-pd-role-switch")
    # SGLang decides at start-up whether an instance has a prefix cache, and a decode instance has none by default;
    # one that later switches to prefill would then recompute every resumed prefix instead of loading it.
    if not cpu_recipe.given(out, "--disaggregation-decode-enable-radix-cache"):
        out.append("--disaggregation-decode-enable-radix-cache")
    return out + ["--host", "127.0.0.1", "--port", str(port), "--disaggregation-mode", role.value,
                  "--disaggregation-bootstrap-port", str(bootstrap_port)]


def run_adaptive(flags: ProrsaFlags, sglang_argv: list[str]) -> None:
    import tempfile
    from pathlib import Path

    import uvicorn

    from sglang_prorsa.srt.utils import processes

    # uvicorn re-raises SIGTERM after its graceful shutdown; turning it into SystemExit lets `finally` stop the
    # instances this front started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host = cpu_recipe.flag_value(sglang_argv, "--host") or "127.0.0.1"
    port = int(cpu_recipe.flag_value(sglang_argv, "--port") or 30000)
    model = cpu_recipe.flag_value(sglang_argv, "--model-path")
    log_dir = Path(flags.prorsa_log_dir or tempfile.mkdtemp(prefix="prorsa-instances-"))
    started: list[processes.ServerProcess] = []
    instances: list[EngineInstance] = []
    master = None
    try:
        store_flags = ["--prorsa-kv-store", flags.prorsa_kv_store]
        if flags.prorsa_kv_store_path:
            store_flags += ["--prorsa-kv-store-path", flags.prorsa_kv_store_path]
        if flags.prorsa_kv_store == "mooncake":
            address = flags.prorsa_mooncake_master
            if not address:
                from sglang_prorsa.srt.disaggregation.mooncake_master import start_mooncake_master

                master = start_mooncake_master(log_dir=log_dir)
                address = master.address
                logger.info("Mooncake Store master on %s", address)
            store_flags += ["--prorsa-mooncake-master", address]
        for k in range(flags.prorsa_instances):
            role = Role.PREFILL if k < flags.prorsa_initial_prefill else Role.DECODE
            iport, bport = processes.free_port(), processes.free_port()
            srv = processes.start(instance_argv(sglang_argv, iport, bport, role) + store_flags, name=f"instance-{k}",
                                  port=iport, log_dir=log_dir, env={"SGLANG_PRORSA_INSTANCE": str(k)},
                                  die_with_parent=True)
            started.append(srv)
            instances.append(EngineInstance(str(k), srv.url, bport, role))
            logger.info("instance %d: %s on %s (bootstrap %d), log %s", k, role.value, srv.url, bport, srv.log_path)
        for srv in started:
            srv.wait_ready(timeout=600)
            logger.info("%s ready in %.1f s", srv.name, srv.ready_s)
        tokenizer = None
        if model:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model)
        front = AdaptiveFront(InstancePool(instances), flags, tokenizer)
        logger.info("adaptive front on http://%s:%d over %d instances (auto switching: %s)", host, port,
                    len(instances), front.auto)
        uvicorn.run(build_app(front), host=host, port=port, log_level="warning")
    finally:
        for srv in started:
            srv.stop(grace_s=5.0)
        if master is not None:
            master.stop()
        logger.info("instances stopped at %s", time.strftime("%H:%M:%S"))
