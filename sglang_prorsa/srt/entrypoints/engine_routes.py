"""HTTP routes one engine instance adds beside SGLang's own (``/pd_role_switch`` flips an idle instance only).

    POST /prorsa/migrate_out   cancel every request here, persist the KV of those that have it, return their records
    POST /prorsa/switch_role   the busy switch: stop admitting, migrate out, wait until quiet, rebuild the role
                               through SGLang's own teardown/init (weights stay resident); report quiesce/persist/rebuild
    POST /prorsa/admission     {"accept": true|false}: reopen (or close) admission after a migrate_out without a switch
    POST /prorsa/kv/load       load a persisted prefix from the KV store into this instance's prefix cache
    GET  /prorsa/status        role, idle, running/queued counts, KV footprint and capacity, counters
    GET  /prorsa/metrics       the same counters in Prometheus text format

From the first migrate_out until the switch finishes the instance answers new generation requests with 503 (it is
out of the routing pool by then; the front retries such a request on another pair). Quiet, before the rebuild, means
the scheduler is idle and no admitted generation request is still on its way to it. (Streaming responses count as
answered once their headers are sent; the adaptive front does not stream.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import aiohttp
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from sglang_prorsa.srt.entrypoints.http_utils import field_error, json_object
from sglang_prorsa.srt.role_switch.control_channel import ControlClient, ControlError
from sglang_prorsa.srt.role_switch.counters import prometheus_text
from sglang_prorsa.srt.role_switch.messages import LoadPrefix, MigrateOut, Status

logger = logging.getLogger(__name__)

GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
ROLES = ("prefill", "decode")


class EngineSwitchState:
    def __init__(self, control: ControlClient, self_url: str, cpu: bool) -> None:
        self.control = control
        self.self_url = self_url
        self.cpu = cpu
        self.switching = False
        # Off from the first migrate_out until a switch finishes: the instance has left the routing pool.
        self.admitting = True
        # Generation requests past the admission gate and not yet answered. A request can be between the HTTP layer
        # and the scheduler while the scheduler looks idle; quiet means both are empty.
        self.inflight_http = 0
        self.switches = 0
        self.last_switch: dict[str, Any] | None = None


async def wait_idle(state: EngineSwitchState, timeout_s: float) -> float:
    t0 = time.perf_counter()
    while True:
        st = await state.control.call(Status(), timeout_s=timeout_s)
        if st.idle and state.inflight_http == 0:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"instance not idle after {timeout_s} s ({st.running} running, {st.queued} queued)")
        await asyncio.sleep(0.02)


def make_engine_router(state: EngineSwitchState) -> APIRouter:
    router = APIRouter()

    @router.post("/prorsa/migrate_out")
    async def migrate_out(request: Request):
        state.admitting = False  # stop admitting first, so nothing lands behind the sweep
        result = await state.control.call(MigrateOut(reason="migrate_out"))
        return JSONResponse(result.to_json())

    @router.post("/prorsa/switch_role")
    async def switch_role(request: Request):
        body = await json_object(request)
        if isinstance(body, JSONResponse):
            return body
        new_role = body.get("new_role")
        if new_role not in ROLES:
            return field_error("new_role", f"must be one of {list(ROLES)}, got {new_role!r}")
        timeout_s = body.get("timeout_s", 120)
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not 0 < timeout_s <= 3600:
            return field_error("timeout_s", "must be a number of seconds in (0, 3600]")
        if state.switching:
            return JSONResponse({"error": "a switch is already running on this instance"}, status_code=409)
        state.switching = True
        state.admitting = False
        t0 = time.perf_counter()
        try:
            status = await state.control.call(Status())
            if status.role == new_role:
                return field_error("new_role", f"instance is already {new_role}", 409)
            records, persist_s, nbytes = [], 0.0, 0
            # Requests already on their way into the scheduler may land after the first sweep: sweep until quiet.
            for _ in range(20):
                result = await state.control.call(MigrateOut(reason=f"switch to {new_role}"))
                records += result.requests
                persist_s += result.persist_s
                nbytes += result.persisted_bytes
                try:
                    quiesce_s = await wait_idle(state, timeout_s=min(5.0, timeout_s))
                    break
                except TimeoutError:
                    continue
            else:
                raise TimeoutError("instance did not quiesce")
            t_rebuild = time.perf_counter()
            payload: dict[str, Any] = {"new_role": new_role}
            if state.cpu and new_role == "decode":
                payload["decode_cuda_graph_memory_gb"] = 0  # SGLang refuses the CPU flip to decode without it
            async with aiohttp.ClientSession() as s:
                async with s.post(state.self_url + "/pd_role_switch", json=payload,
                                  timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    sw = await r.json(content_type=None)
                    if r.status != 200:
                        return JSONResponse({"error": "SGLang refused the role switch", "sglang": sw,
                                             "requests": [x.to_json() for x in records]}, status_code=502)
            rebuild_s = time.perf_counter() - t_rebuild
            state.switches += 1
            out = {
                "old_role": status.role, "new_role": new_role, "requests": [x.to_json() for x in records],
                "timings": {"quiesce_s": quiesce_s, "persist_s": persist_s, "rebuild_s": rebuild_s,
                            "total_s": time.perf_counter() - t0},
                "persisted_bytes": nbytes,
            }
            state.last_switch = {k: v for k, v in out.items() if k != "requests"}
            return JSONResponse(out)
        except (ControlError, TimeoutError) as e:
            return JSONResponse({"error": f"switch failed: {e}"}, status_code=503)
        finally:
            state.switching = False
            state.admitting = True

    @router.post("/prorsa/admission")
    async def admission(request: Request):
        body = await json_object(request)
        if isinstance(body, JSONResponse):
            return body
        accept = body.get("accept")
        if not isinstance(accept, bool):
            return field_error("accept", "must be true or false")
        if state.switching:
            return JSONResponse({"error": "a switch is running; admission resumes when it ends"}, status_code=409)
        state.admitting = accept
        return JSONResponse({"admitting": state.admitting})

    @router.post("/prorsa/kv/load")
    async def kv_load(request: Request):
        body = await json_object(request)
        if isinstance(body, JSONResponse):
            return body
        ids, keys, bt = body.get("token_ids"), body.get("keys"), body.get("block_tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
            return field_error("token_ids", "must be a list of non-negative integers")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            return field_error("keys", "must be a list of strings")
        if not isinstance(bt, int) or isinstance(bt, bool) or bt <= 0:
            return field_error("block_tokens", "must be a positive integer")
        if len(keys) < -(-len(ids) // bt):
            return field_error("keys", f"{len(keys)} keys cannot cover {len(ids)} tokens in blocks of {bt}")
        r = await state.control.call(LoadPrefix(token_ids=ids, keys=keys, block_tokens=bt))
        return JSONResponse(vars(r))

    @router.get("/prorsa/status")
    async def status():
        st = await state.control.call(Status())
        d = vars(st).copy()
        d["switching"] = state.switching
        d["admitting"] = state.admitting
        d["switches"] = state.switches
        d["last_switch"] = state.last_switch
        return JSONResponse(d)

    @router.get("/prorsa/metrics")
    async def metrics():
        st = await state.control.call(Status())
        counters = dict(st.counters)
        counters["switches"] = state.switches
        gauges = {"kv_footprint_tokens": st.kv_footprint_tokens, "kv_capacity_tokens": st.kv_capacity_tokens,
                  "running_requests": st.running, "queued_requests": st.queued, "idle": int(st.idle)}
        return PlainTextResponse(prometheus_text(os.environ.get("SGLANG_PRORSA_INSTANCE", "0"), st.role, counters,
                                                 gauges))

    return router


def install_admission_gate(app: FastAPI, state: EngineSwitchState) -> None:
    @app.middleware("http")
    async def refuse_while_switching(request: Request, call_next):
        if request.url.path not in GENERATION_PATHS:
            return await call_next(request)
        if not state.admitting:
            return JSONResponse({"error": "instance is switching roles; send this request to another instance"},
                                status_code=503)
        state.inflight_http += 1
        try:
            return await call_next(request)
        finally:
            state.inflight_http -= 1
