"""Poison containment in the relay (srt/front/relay.py, issue 29): an instance that dies while serving a request
(the connection drops after the request was sent) counts a death; the request is sent to one other instance with
the count (``X-Prorsa-Lost``), and a second death answers it with 502 ``suspected_poison`` instead of a third try.
A refused connection (an instance already gone) is no death: the request just goes elsewhere. Real loopback HTTP."""

from __future__ import annotations

import asyncio
import json

import orjson
from aiohttp import web
from test_asgi_fast_path import App, call
from unit_support import loopback_upstream

from sglang_prorsa.srt.common.messages import LOST_HEADER
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.app import GENERATION_PATHS
from sglang_prorsa.srt.front.asgi import GenerationFastPath
from sglang_prorsa.srt.front.relay import Relay


def run(behaviour: list[str]) -> tuple[int, dict, list[tuple[str, str | None]], dict]:
    """Three colocated instances, each ``die`` (drop the connection), ``ok`` or ``closed`` (no listener)."""
    seen: list[tuple[str, str | None]] = []

    def handler(name: str, what: str):
        async def generate(request: web.Request) -> web.StreamResponse:
            seen.append((name, request.headers.get(LOST_HEADER)))
            await request.read()
            if what == "die":
                request.transport.close()  # as an instance whose scheduler crashed: no answer, connection gone
                await asyncio.sleep(1)
            return web.json_response({"text": name})
        return generate

    async def scenario():
        async with loopback_upstream([("POST", "/generate", handler("a", behaviour[0]))]) as a, \
                loopback_upstream([("POST", "/generate", handler("b", behaviour[1]))]) as b, \
                loopback_upstream([("POST", "/generate", handler("c", behaviour[2]))]) as c:
            registry = Registry()
            for i, (name, url) in enumerate(zip("abc", (a, b, c))):
                inst = Instance(name, url if behaviour[i] != "closed" else "http://127.0.0.1:9", "null",
                                state=State.ACTIVE)
                inst.inflight = i  # picked in order a, b, c (least loaded first)
                registry.add(inst)
            relay = Relay(registry, pd=False)
            try:
                status, _, body = await call(GenerationFastPath(App(), relay, GENERATION_PATHS), "POST",
                                             "/generate", orjson.dumps({"input_ids": [1, 2]}))
            finally:
                await relay.close()
        return status, json.loads(body), seen, relay.stats

    return asyncio.run(scenario())


def reached(seen: list) -> list:
    """Distinct (instance, lost count) in order: a dropped connection is sent once more to the same instance (it may
    have been an idle pooled connection the server closed: ``http_utils.post_fresh``)."""
    return list(dict.fromkeys(seen))


def test_a_request_two_instances_died_serving_is_not_sent_to_a_third():
    status, body, seen, stats = run(["die", "die", "ok"])
    assert status == 502 and body["code"] == "suspected_poison", body
    assert reached(seen) == [("a", None), ("b", "1")]  # c never saw it; b was told one instance died before
    assert stats["suspected_poison"] == 1 and stats["retried"] == 1


def test_one_death_is_retried_once_elsewhere_with_the_count():
    status, body, seen, stats = run(["die", "ok", "ok"])
    assert status == 200 and body == {"text": "b"}
    assert reached(seen) == [("a", None), ("b", "1")]
    assert stats["suspected_poison"] == 0


def test_a_refused_connection_is_not_a_death():
    status, body, seen, stats = run(["closed", "die", "ok"])
    assert status == 200 and body == {"text": "c"}
    assert reached(seen) == [("b", None), ("c", "1")]
