"""``json_body``: every POST route of ours refuses a body that is not a JSON object the same way, before its handler."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from sglang_prorsa.srt.common.auth import admin
from sglang_prorsa.srt.common.http_utils import json_body


def client() -> tuple[TestClient, list[dict[str, Any]]]:
    app, seen = FastAPI(), []

    @app.post("/echo")
    @admin
    @json_body
    async def echo(body: dict[str, Any]):
        """Echo."""
        seen.append(body)
        return {"got": body}

    return TestClient(app), seen


def test_an_object_reaches_the_handler_and_the_route_keeps_its_name_and_auth_level():
    c, seen = client()
    r = c.post("/echo", json={"rooms": [1, 2]})
    assert r.status_code == 200 and r.json() == {"got": {"rooms": [1, 2]}} and seen == [{"rooms": [1, 2]}]
    route = next(r for r in c.app.routes if getattr(r, "path", "") == "/echo")
    assert route.endpoint.__name__ == "echo" and route.endpoint._auth_level.name == "ADMIN_OPTIONAL"


def test_malformed_json_and_non_objects_are_400_naming_the_body_and_never_reach_the_handler():
    c, seen = client()
    bad = c.post("/echo", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["field"] == "body" and bad.json()["code"] == "invalid"
    for body in ([1, 2], "x", 3, None):
        r = c.post("/echo", json=body)
        assert r.status_code == 400 and r.json()["field"] == "body", body
    assert seen == []


def test_our_clients_drop_idle_connections_before_sglangs_server_does():
    from sglang.srt.environ import envs

    from sglang_prorsa.srt.common.http_utils import UPSTREAM_KEEPALIVE_S

    assert UPSTREAM_KEEPALIVE_S < envs.SGLANG_TIMEOUT_KEEP_ALIVE.get()


class _Session:
    """``post`` fails with the given exceptions in turn, then answers ``"answer"``."""

    def __init__(self, *failures: BaseException, closed: bool = False) -> None:
        self.failures, self.calls, self.closed = list(failures), 0, closed

    async def post(self, url, **kwargs):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "answer"


def test_post_fresh_sends_again_only_after_a_connection_the_server_had_closed():
    import asyncio

    import aiohttp
    import pytest

    from sglang_prorsa.srt.common.http_utils import post_fresh

    stale = _Session(aiohttp.ServerDisconnectedError())
    assert asyncio.run(post_fresh(stale, "http://x/generate", data=b"{}")) == "answer" and stale.calls == 2
    twice = _Session(aiohttp.ServerDisconnectedError(), aiohttp.ServerDisconnectedError())
    with pytest.raises(aiohttp.ServerDisconnectedError):
        asyncio.run(post_fresh(twice, "http://x/generate"))
    assert twice.calls == 2  # once more, not forever
    refused = _Session(aiohttp.ClientConnectionError("refused"))
    with pytest.raises(aiohttp.ClientConnectionError):
        asyncio.run(post_fresh(refused, "http://x/generate"))
    assert refused.calls == 1  # an instance that is down is not asked again here (the relay picks another)
    closing = _Session(aiohttp.ServerDisconnectedError(), closed=True)  # our front shutting down
    with pytest.raises(aiohttp.ServerDisconnectedError):  # a ClientError its callers handle, not "Session is closed"
        asyncio.run(post_fresh(closing, "http://x/generate"))
    assert closing.calls == 1
