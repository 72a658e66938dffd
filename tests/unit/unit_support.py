"""Helpers shared by unit tests."""

from __future__ import annotations

import importlib.util
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """A script of ``benchmarks/`` (not a package) imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@asynccontextmanager
async def loopback_upstream(routes: list[tuple[str, str, Handler]]) -> AsyncIterator[str]:
    """A real HTTP server on 127.0.0.1 (an ephemeral port) answering ``(method, path, handler)`` routes; yields its
    base URL and stops when the block exits."""
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


class StandInFront:
    """A front stand-in for trainer-side adapters: records every hint batch (``events``), every ``/generate`` body
    and its ``X-Trajectory-Id`` header; answers a ``/generate`` with ``max_new_tokens`` tokens 0, 1, 2, ..."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.bodies: list[dict] = []
        self.generate_headers: list[str | None] = []

    def routes(self) -> list[tuple[str, str, Handler]]:
        async def lifecycle(request: web.Request) -> web.Response:
            events = (await request.json())["events"]
            self.events += events
            return web.json_response({"received": len(events), "applied": len(events), "duplicates": 0,
                                      "rejected": 0, "rejections": []})

        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            self.bodies.append(body)
            self.generate_headers.append(request.headers.get("X-Trajectory-Id"))
            n = body["sampling_params"]["max_new_tokens"]
            return web.json_response({"text": "x" * n, "output_ids": list(range(n)), "meta_info": {
                "prompt_tokens": len(body["input_ids"]), "completion_tokens": n, "finish_reason": {"type": "length"}}})

        return [("POST", "/lifecycle", lifecycle), ("POST", "/generate", generate)]


def one_chunk_stitcher(rid: str = "r0"):
    """A stand-in for a continuation's stitcher (``engine/stitch.py``): one token kept, finished by the first chunk."""
    from types import SimpleNamespace

    stitcher = SimpleNamespace(ids=[1], finished=False, rid=rid, migrations=[], straddle_stop=False,
                               rebase=lambda: None)

    def update(chunk):
        stitcher.finished = True
        return chunk

    stitcher.update = update
    return stitcher
