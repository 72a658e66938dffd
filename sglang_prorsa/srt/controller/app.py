"""The front's HTTP app: the thin generation relay plus the controller's routes, on one address.

    POST /generate, /v1/completions, /v1/chat/completions   relayed to a pair (or an instance): ``front/relay.py``
    POST /lifecycle, /lifecycle/config; GET /lifecycle/*, /prorsa/forecast          the lifecycle control plane
    GET  /prorsa/instances, /prorsa/decision, /prorsa/metrics, /metrics, /health
    POST /prorsa/switch {"instance", "new_role"}, /prorsa/control_tick, /prorsa/register
    GET/POST /workers, GET/DELETE /workers/{id}        sglang-router 0.3.2's worker API (``workers.py``)
    GET  /v1/models, /get_model_info, /get_server_info      answered by an active instance
    SGLang's control routes (weights, pause/continue, flush, memory, abort, health_generate, /v1/loads): fanned
    out to every instance (``control_ops.py``; weight-update groups and tensor updates: ``weight_sync.py``);
    GET /get_load: per-instance loads
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from sglang_prorsa import __version__
from sglang_prorsa.config import Mode, ProrsaConfig
from sglang_prorsa.policy.role_switch.capacity import CannotDecide
from sglang_prorsa.srt.common.auth import AuthKeys, admin, mark_admin_routes, mount
from sglang_prorsa.srt.common.auth import install as install_auth
from sglang_prorsa.srt.common.http_utils import coded_error, field_error, json_body
from sglang_prorsa.srt.common.messages import Code
from sglang_prorsa.srt.common.registry import Registry, State, UnknownInstance
from sglang_prorsa.srt.controller import workers
from sglang_prorsa.srt.controller.control_ops import ControlOps
from sglang_prorsa.srt.controller.control_ops import mount as mount_control_ops
from sglang_prorsa.srt.controller.health import Health
from sglang_prorsa.srt.controller.http import Http
from sglang_prorsa.srt.controller.loop import ControlLoop
from sglang_prorsa.srt.controller.metrics import merge_prometheus
from sglang_prorsa.srt.controller.orchestrator import Orchestrator, SwitchRefused
from sglang_prorsa.srt.controller.router_pools import RouterPools
from sglang_prorsa.srt.front.asgi import GenerationFastPath
from sglang_prorsa.srt.front.relay import Relay
from sglang_prorsa.srt.lifecycle_routes import control_plane_for, make_router

logger = logging.getLogger("sglang_prorsa.front")

GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
INFO_PATHS = ("/v1/models", "/get_model_info", "/get_server_info")


class Front:
    """Everything the front process owns, built once from the frozen configuration."""

    def __init__(self, config: ProrsaConfig, registry: Registry | None = None, processes: dict | None = None,
                 specs: dict | None = None, keys: AuthKeys = AuthKeys()) -> None:
        self.config = config
        self.keys = keys
        self.registry = registry or Registry()
        self.processes = processes or {}  # instance id -> ServerProcess, for the instances this front started
        self.specs = specs or {}  # instance id -> InstanceSpec (to restart one)
        self.http = Http(keys)
        router = RouterPools(config.prorsa_router, self.http) if config.prorsa_router else None
        self.orchestrator = Orchestrator(self.registry, self.http, router)
        self.control_plane = control_plane_for(config)  # S from --prorsa-horizon, fixed: one S everywhere
        self.health = Health(self.registry, self.orchestrator, self.http, self.processes, self.specs)
        self.loop = ControlLoop(config, self.registry, self.orchestrator, self.control_plane, self.http, self.health)
        self.relay = Relay(self.registry, pd=config.mode is not Mode.COLOCATED)
        self.ops = ControlOps(self)

    async def any_active(self, path: str) -> tuple[int, Any]:
        for inst in self.registry:
            if inst.state is State.ACTIVE:
                return await self.http.get(inst.url + path)
        return 503, {"error": "no active instance", "code": Code.NO_INSTANCE.value}


def build_app(front: Front) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        front.control_plane.start()  # the forecast refreshes in its own thread, never on this event loop
        front.loop.start()
        await front.orchestrator.push_peers()
        await front.orchestrator.sync_router()
        yield
        front.health.stop()  # first: no instance restarts any more, and one still loading ends its process
        await front.loop.stop()
        await front.health.restarts_ended()
        front.control_plane.stop()
        await front.relay.close()
        await front.http.close()

    app = FastAPI(title="sglang-prorsa front", lifespan=lifespan)
    mount(app, make_router(front.control_plane))
    mark_admin_routes(app, {("POST", "/lifecycle/config")})
    for path in GENERATION_PATHS:
        app.add_route(path, front.relay.handle, methods=["POST"])

    @app.get("/health")
    async def health():
        active = sum(i.state is State.ACTIVE for i in front.registry)
        return {"status": "ok", "instances": len(front.registry), "active": active}

    @app.get("/prorsa/info")
    async def info():
        return {"sglang_prorsa": __version__, "mode": front.config.mode.value,
                "auto_switch": front.config.switching, "horizon_s": front.config.prorsa_horizon_s,
                "control_interval_s": front.config.control_interval_s, "router": front.config.prorsa_router or None,
                "kv_store": {"kind": front.config.prorsa_kv_store,
                             "mooncake_master": front.config.prorsa_mooncake_master or None}}

    @app.get("/prorsa/instances")
    async def instances():
        return {"instances": [i.describe() for i in front.registry], "switches": list(front.orchestrator.history),
                "version": front.registry.version, "failures": _failures(front)}

    @app.get("/prorsa/decision")
    async def decision():
        return front.loop.decision()

    @app.post("/prorsa/control_tick")
    @admin
    async def control_tick():
        try:
            return await front.loop.tick()
        except CannotDecide as e:  # e.g. no instance attached yet: nothing to allocate, and why
            return coded_error(409, Code(e.code), str(e))

    @app.post("/prorsa/switch")
    @admin
    @json_body
    async def switch(body: dict[str, Any]):
        inst, role = body.get("instance"), body.get("new_role")
        if not isinstance(inst, str) or inst not in front.registry.instances:
            return field_error("instance", f"must be one of {sorted(front.registry.instances)}, got {inst!r}")
        if role not in ("prefill", "decode"):
            return field_error("new_role", f"must be 'prefill' or 'decode', got {role!r}")
        try:
            return await front.orchestrator.switch(inst, role)
        except SwitchRefused as e:
            return coded_error(e.status, e.code, str(e))
        except UnknownInstance:
            return field_error("instance", f"no instance {inst!r}")

    @app.post("/prorsa/register")
    @admin
    @json_body
    async def register(body: dict[str, Any]):
        problem = _check_registration(body)
        if problem:
            return field_error(*problem)
        inst, new = await workers.join(front, body["instance_id"], body["url"], body["role"],
                                       body.get("bootstrap_host") or "127.0.0.1", body.get("bootstrap_port"),
                                       gpus=body.get("gpus"), switching=bool(body.get("switching", False)),
                                       switches=body.get("switches"))
        return {"instance": inst.describe(), "new": new, "version": front.registry.version}

    workers.mount(app, front)  # sglang-router's worker API: GET/POST /workers, GET/DELETE /workers/{id}

    @app.get("/prorsa/metrics")
    async def prorsa_metrics():
        return PlainTextResponse(_front_metrics(front))

    @app.get("/metrics")
    async def metrics():
        texts = [_front_metrics(front)]
        for inst in front.registry:
            if inst.state in (State.DEAD, State.STARTING):
                continue
            for path in ("/prorsa/metrics", "/metrics"):  # ours, and SGLang's when it runs with --enable-metrics
                try:
                    status, text = await front.http.get_text(inst.url + path)
                except (OSError, asyncio.TimeoutError):
                    continue
                if status == 200:
                    texts.append(merge_prometheus(text, inst.instance_id))
        return PlainTextResponse(merge_prometheus("\n".join(texts), None))

    for path in INFO_PATHS:
        app.add_api_route(path, _info_handler(front, path), methods=["GET"])

    @app.get("/get_load")
    async def get_load():
        """Per-instance load, the shape of sglang-router's /get_loads."""
        return {"loads": [{"instance": i.instance_id, "url": i.url, "role": i.role, "status": i.state.value,
                           "running": i.running, "queued": i.queued, "inflight": i.inflight,
                           "kv_footprint_tokens": i.kv_footprint_tokens} for i in front.registry]}

    mount_control_ops(app, front.ops)
    install_auth(app, front.keys)
    return app


def serve_app(front: Front) -> Any:
    """What the front's server runs: the app, with generation requests sent straight to the relay when no API keys
    are configured (``front/asgi.py`` says why)."""
    app = build_app(front)
    return app if front.keys.enabled else GenerationFastPath(app, front.relay, GENERATION_PATHS)


def _info_handler(front: Front, path: str):
    async def handler():
        status, body = await front.any_active(path)
        return JSONResponse(body, status_code=status)

    return handler


def _check_registration(body: dict) -> tuple[str, str] | None:
    if not isinstance(body.get("instance_id"), str) or not body["instance_id"]:
        return "instance_id", "must be a non-empty string"
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return "url", "must be http://HOST:PORT"
    if body.get("role") not in ("prefill", "decode", "null"):
        return "role", "must be 'prefill', 'decode' or 'null'"
    port = body.get("bootstrap_port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        return "bootstrap_port", "must be a port number"
    if not isinstance(body.get("switching", False), bool):
        return "switching", "must be true or false"
    count = body.get("switches")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        return "switches", "must be a count >= 0"
    return None


def _failures(front: Front) -> dict[str, int]:
    """What has failed since the front started, as counts (one key per kind of failure; add new kinds here)."""
    return {"lost": front.health.lost_total, "restarts": front.health.restarts,
            "suspected_poison": front.relay.stats["suspected_poison"]}


def _front_metrics(front: Front) -> str:
    lines = [f"prorsa_front_{k}_total {v}" for k, v in sorted(front.relay.stats.items())]
    lines.append(f"prorsa_front_decisions_total {front.loop.decisions}")
    lines.append(f"prorsa_front_switches_total {len(front.orchestrator.history)}")
    for inst in front.registry:
        lab = f'instance="{inst.instance_id}",role="{inst.role}",state="{inst.state.value}"'
        lines += [f"prorsa_instance_switches{{{lab}}} {inst.switches}",
                  f"prorsa_instance_inflight_requests{{{lab}}} {inst.inflight}",
                  f"prorsa_instance_kv_footprint_tokens{{{lab}}} {inst.kv_footprint_tokens}"]
    return "\n".join(lines) + "\n"
