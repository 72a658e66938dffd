"""Helpers shared by unit tests."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
