"""The front's ASGI entry (srt/front/asgi.py): generation POSTs go straight to the relay, over real loopback HTTP to
a real upstream; everything else reaches the app; a relay that raises answers a readable 500, never a dropped
connection."""

from __future__ import annotations

import asyncio
import json

import orjson
from aiohttp import web
from unit_support import loopback_upstream

from sglang_prorsa.srt.common.messages import ROUTE_HEADER
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.app import GENERATION_PATHS
from sglang_prorsa.srt.front.asgi import GenerationFastPath
from sglang_prorsa.srt.front.relay import Relay


async def call(app, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request through an ASGI app, as uvicorn would make it."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    sent = False
    out: dict = {"body": b""}

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        else:
            out["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["headers"], out["body"]


class App:
    """Stands for the FastAPI app: records what reaches it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.seen.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})


def test_generation_goes_to_the_relay_and_everything_else_to_the_app():
    upstream: list[dict] = []

    async def generate(request: web.Request) -> web.Response:
        upstream.append(await request.json())
        return web.json_response({"text": "ok", "output_ids": [7]})

    async def scenario():
        async with loopback_upstream([("POST", "/generate", generate)]) as url:
            registry = Registry()
            registry.add(Instance("c0", url, "null", state=State.ACTIVE))
            relay = Relay(registry, pd=False)
            app = App()
            entry = GenerationFastPath(app, relay, GENERATION_PATHS)
            try:
                relayed = await call(entry, "POST", "/generate", orjson.dumps({"input_ids": [1, 2, 3]}))
                malformed = await call(entry, "POST", "/generate", b"{not json")
                got = await call(entry, "GET", "/generate")
                other = await call(entry, "POST", "/prorsa/switch", b"{}")
            finally:
                await relay.close()
        return relayed, malformed, got, other, app.seen, relay.stats

    relayed, malformed, got, other, seen, stats = asyncio.run(scenario())
    assert relayed[0] == 200 and json.loads(relayed[2]) == {"text": "ok", "output_ids": [7]}
    assert relayed[1][ROUTE_HEADER.lower()] == "c0"
    assert upstream == [{"input_ids": [1, 2, 3]}]  # forwarded as it came (colocated: no bootstrap fields)
    assert malformed[0] == 400 and json.loads(malformed[2])["field"] == "body"
    assert got[0] == 405 and other[0] == 405
    assert seen == [("GET", "/generate"), ("POST", "/prorsa/switch")]  # only these reached the app
    assert stats["requests"] == 1


def test_a_relay_that_raises_answers_500_with_a_code():
    class Broken(Relay):
        async def handle(self, request):
            raise RuntimeError("bug")

    relay = Broken(Registry(), pd=True)
    entry = GenerationFastPath(App(), relay, GENERATION_PATHS)
    status, _, body = asyncio.run(call(entry, "POST", "/v1/chat/completions", b"{}"))
    assert status == 500 and json.loads(body)["code"] == "upstream"
    assert relay.stats["failed"] == 1


def test_a_failed_prefill_half_is_counted_and_logged(caplog):
    """A PD pair whose prefill half answers 500: the caller still gets the decode half's answer, and the front says
    the prefill half failed (its decode half may wait for KV; issue 14's 300 s wait left nothing in the log)."""

    async def generate(request: web.Request) -> web.Response:
        if request.headers.get("X-Prorsa-Role") == "prefill":
            return web.json_response({"error": "bootstrap failed"}, status=500)
        return web.json_response({"text": "ok"})

    async def scenario():
        async with loopback_upstream([("POST", "/generate", generate)]) as url:
            registry = Registry()
            registry.add(Instance("p0", url, "prefill", bootstrap_port=9, state=State.ACTIVE))
            registry.add(Instance("d0", url, "decode", state=State.ACTIVE))
            relay = Relay(registry, pd=True)
            try:
                answer = await call(GenerationFastPath(App(), relay, GENERATION_PATHS), "POST", "/generate",
                                    orjson.dumps({"input_ids": [1, 2]}))
                for _ in range(100):  # the prefill half is drained in its own task
                    if relay.stats["prefill_halves_failed"]:
                        break
                    await asyncio.sleep(0.01)
            finally:
                await relay.close()
        return answer, relay.stats

    with caplog.at_level("WARNING", logger="sglang_prorsa.srt.front.relay"):
        (status, headers, body), stats = asyncio.run(scenario())
    assert status == 200 and json.loads(body) == {"text": "ok"} and headers[ROUTE_HEADER.lower()] == "p0/d0"
    assert stats["prefill_halves_failed"] == 1
    assert any("prefill half on p0 answered 500" in r.getMessage() and "bootstrap failed" in r.getMessage()
               for r in caplog.records)
