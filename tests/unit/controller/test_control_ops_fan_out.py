"""The front's fan-out of SGLang's control routes (srt/controller/control_ops.py) over real loopback HTTP: every
live instance gets the call as it came -- body, method and query string (SGLang's ``/flush_cache?timeout=S``)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from aiohttp import web
from unit_support import loopback_upstream

from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.control_ops import OPS, ControlOps
from sglang_prorsa.srt.front.relay import Relay


def test_the_query_string_reaches_every_instance_and_a_refusal_keeps_its_status():
    flush = next(op for op in OPS if op.path == "/flush_cache")
    seen: list[tuple[str, str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.match_info.get("iid", ""), request.method, request.query_string))
        if request.query.get("timeout") == "-1":  # SGLang validates it (ge=0) with a 422
            return web.json_response({"detail": "timeout must be >= 0"}, status=422)
        return web.Response(text="Cache flushed.\n")

    async def scenario() -> tuple[int, dict, int]:
        async with loopback_upstream([("*", "/{iid}/flush_cache", answer)]) as url:
            registry = Registry()
            for iid in ("a", "b"):
                registry.add(Instance(iid, f"{url}/{iid}", "decode", state=State.ACTIVE))
            relay = Relay(registry, pd=True)
            front = SimpleNamespace(registry=registry, relay=relay, control_plane=SimpleNamespace(engine=None),
                                    orchestrator=SimpleNamespace(lock=asyncio.Lock(), held_by=None))
            ops = ControlOps(front)
            try:
                ok = await ops.run(flush, "POST", b"", {}, "timeout=30")
                bad = await ops.run(flush, "POST", b"", {}, "timeout=-1")
            finally:
                await relay.close()
        return ok.status_code, json.loads(ok.body), bad.status_code

    ok_status, ok_body, bad_status = asyncio.run(scenario())
    assert ok_status == 200 and set(ok_body["instances"]) == {"a", "b"}
    assert sorted(seen) == [("a", "POST", "timeout=-1"), ("a", "POST", "timeout=30"),
                            ("b", "POST", "timeout=-1"), ("b", "POST", "timeout=30")]
    assert bad_status == 422  # the instances' own refusal, not a 500 of ours
