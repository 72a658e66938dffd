"""The RL trainer's control surface through the front (issue 13): SGLang's routes, fanned out to every instance.

Each call is sent, with its body unchanged, to every live instance whatever its role or state, and answered once
all have answered: SGLang's own response shape (from the first instance) when every instance succeeded, else
``{"success": false, "message": ..., "instances": {...}}`` with each instance's status and answer, under the first
failing status. Every answer also lists the per-instance results under ``instances``. Two calls cannot take one body
for all (``weight_sync.py``): a weight-update group gives each instance its own ``rank_offset``, and tensors passed
by CUDA-IPC handle are refused when there is more than one instance.

Switch safety: a control operation takes the orchestrator's lock, so it waits for a switch in flight to finish and no
switch starts while it runs; a pause holds switches until ``/continue_generation``, a memory release until
``/resume_memory_occupation`` (the controller then also holds its allocation: paused generation is not low demand).
The lifecycle tracker hears of each operation (a pause suspends trajectories, an abort-all ends their requests, a
weight update marks a step boundary).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from sglang_prorsa.srt.common.auth import admin
from sglang_prorsa.srt.common.messages import Code
from sglang_prorsa.srt.common.registry import State
from sglang_prorsa.srt.controller import weight_sync

logger = logging.getLogger(__name__)

OP_TIMEOUT_S = 1800.0  # a weight update of a large model from disk takes minutes


@dataclass(frozen=True)
class ControlOp:
    path: str
    methods: tuple[str, ...] = ("POST",)
    holds: str | None = None  # a state that holds switches after this op succeeds, until `releases` clears it
    releases: str | None = None
    lifecycle: str | None = None  # what the tracker hears: pause | continue | abort | weights
    admin: bool = True


OPS: tuple[ControlOp, ...] = (
    ControlOp("/update_weights_from_disk", lifecycle="weights"),
    ControlOp("/update_weights_from_tensor", lifecycle="weights"),
    ControlOp("/update_weights_from_distributed", lifecycle="weights"),
    ControlOp("/update_weights_from_ipc", lifecycle="weights"),
    # SGLang 0.5.23 loads tensor and distributed updates only inside a session: begin, update(s), end. The session
    # holds switches, as a pause does, so no instance changes role with half-loaded weights.
    ControlOp("/begin_weight_update", holds="weight update session"),
    ControlOp("/end_weight_update", releases="weight update session"),
    ControlOp("/weights_checker", methods=("GET", "POST")),
    ControlOp("/init_weights_update_group"),  # each instance its own rank_offset (weight_sync.py)
    ControlOp("/destroy_weights_update_group"),
    ControlOp("/update_weight_version", lifecycle="weights"),
    ControlOp("/pause_generation", holds="generation paused", lifecycle="pause"),
    ControlOp("/continue_generation", releases="generation paused", lifecycle="continue"),
    ControlOp("/flush_cache", methods=("GET", "POST")),
    ControlOp("/release_memory_occupation", methods=("GET", "POST"), holds="memory released"),
    ControlOp("/resume_memory_occupation", methods=("GET", "POST"), releases="memory released"),
    ControlOp("/abort_request", lifecycle="abort"),
    ControlOp("/load_lora_adapter"),
    ControlOp("/unload_lora_adapter"),
    ControlOp("/health_generate", methods=("GET",), admin=False),
    ControlOp("/v1/loads", methods=("GET",), admin=False),
)


class ControlOps:
    def __init__(self, front: Any) -> None:
        self.front = front
        self.held: set[str] = set()
        self.calls = 0

    @property
    def holding(self) -> str | None:
        return ", ".join(sorted(self.held)) or None

    def targets(self) -> list[Any]:
        return [i for i in self.front.registry if i.state not in (State.DEAD, State.STARTING)]

    async def run(self, op: ControlOp, method: str, body: bytes, headers: dict[str, str], query: str = "") -> Response:
        orchestrator = self.front.orchestrator
        async with orchestrator.lock:  # no switch in flight, none starting
            orchestrator.held_by = op.path
            try:
                targets = self.targets()
                planned = await weight_sync.plan(self.front, op.path, body, targets)
                if isinstance(planned, Response):  # refused before any instance saw it
                    return planned
                results = await self._fan_out(op, method, body, headers, query, targets, planned)
            finally:
                orchestrator.held_by = self.holding
        ok = all(200 <= r["status"] < 300 for r in results.values())
        if ok:
            if op.holds:
                self.held.add(op.holds)
            if op.releases:
                self.held.discard(op.releases)
            orchestrator.held_by = self.holding
            self._tell_lifecycle(op, body)
        self.calls += 1
        return _combine(results, ok, planned.answer if planned is not None else None)

    async def _fan_out(self, op: ControlOp, method: str, body: bytes, headers: dict[str, str], query: str,
                       targets: list[Any], planned: weight_sync.Plan | None) -> dict[str, dict]:
        session = self.front.relay.session()
        # The query string goes along as it came: SGLang's own parameters live there (``/flush_cache?timeout=S``
        # waits up to S seconds for the scheduler to be idle instead of refusing at once, SGLang 0.5.23).
        path = op.path + (f"?{query}" if query else "")

        async def one(inst) -> dict:
            data = planned.bodies.get(inst.instance_id, body) if planned is not None else body
            try:
                async with session.request(method, inst.url + path, data=data or None, headers=headers,
                                           timeout=_timeout()) as r:
                    raw = await r.read()
                    return {"status": r.status, "raw": raw, "content_type": r.headers.get("Content-Type", "")}
            except Exception as e:  # the instance did not answer: reported, never a 500 of ours
                return {"status": 502, "raw": None, "error": f"{type(e).__name__}: {e}"}

        answers = await asyncio.gather(*(one(i) for i in targets))
        return {inst.instance_id: a for inst, a in zip(targets, answers)}

    def _tell_lifecycle(self, op: ControlOp, body: bytes) -> None:
        engine = self.front.control_plane.engine
        try:
            payload = _json(body) or {}
            if op.lifecycle == "pause":
                engine.generation_paused(str(payload.get("mode", "abort")))
            elif op.lifecycle == "continue":
                engine.generation_continued()
            elif op.lifecycle == "abort" and payload.get("abort_all"):
                engine.requests_aborted(None)
            elif op.lifecycle == "weights":
                engine.weights_updated(payload.get("weight_version"))
        except Exception:  # the tracker's view is best effort; the operation itself succeeded
            logger.exception("lifecycle event for %s not recorded", op.path)


def _timeout():
    import aiohttp

    return aiohttp.ClientTimeout(total=OP_TIMEOUT_S)


def _json(raw: bytes | None) -> Any:
    import orjson

    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:2000].decode(errors="replace")


def _combine(results: dict[str, dict], ok: bool, extra: dict[str, Any] | None = None) -> Response:
    per_instance = {iid: {"status": r["status"], "body": _json(r.get("raw")) if r.get("raw") is not None
                          else r.get("error")} for iid, r in results.items()}
    if not results:
        return JSONResponse({"success": False, "message": "no live instance", "code": Code.NO_INSTANCE.value,
                             "instances": {}}, status_code=503)
    if ok:
        first = per_instance[next(iter(per_instance))]["body"]
        body = dict(first) if isinstance(first, dict) else {"success": True}
        body.update(extra or {}, instances=per_instance)
        return JSONResponse(body)
    failed = {iid: r for iid, r in per_instance.items() if not 200 <= r["status"] < 300}
    status = next(iter(failed.values()))["status"]
    codes = {r["body"].get("code") if isinstance(r["body"], dict) else None for r in failed.values()}
    code = codes.pop() if len(codes) == 1 and None not in codes else Code.UPSTREAM.value  # one shared cause: say it
    return JSONResponse({"success": False, "message": f"{len(failed)} of {len(results)} instances failed",
                         "code": code, **(extra or {}), "instances": per_instance}, status_code=status)


def mount(app: FastAPI, ops: ControlOps) -> None:
    for op in OPS:
        app.add_api_route(op.path, _handler(ops, op), methods=list(op.methods))


def _handler(ops: ControlOps, op: ControlOp):
    async def handler(request: Request):
        body = await request.body()
        if body and request.method == "POST":
            parsed = _json(body)
            if not isinstance(parsed, dict):
                return JSONResponse({"error": "field 'body': must be a JSON object", "field": "body",
                                     "code": Code.INVALID.value}, status_code=400)
        headers = {"Content-Type": "application/json"}
        auth = request.headers.get("authorization")
        if auth:
            headers["Authorization"] = auth
        else:
            headers.update(ops.front.keys.admin_headers() if op.admin else ops.front.keys.generation_headers())
        return await ops.run(op, request.method, body, headers, request.url.query)

    handler.__name__ = "control" + op.path.replace("/", "_")
    return admin(handler) if op.admin else handler
