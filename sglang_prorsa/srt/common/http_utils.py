"""JSON request/response helpers shared by our HTTP routes: every client error names the field it is about, and
every refusal carries a typed code (``srt/messages.Code``)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import aiohttp
from fastapi import Request
from fastapi.responses import JSONResponse

from sglang_prorsa.srt.common.messages import Code

# How long our clients keep an idle connection to an instance for reuse. SGLang's server closes idle keep-alive
# connections after 5 s (SGLANG_TIMEOUT_KEEP_ALIVE, 0.5.23); a client that keeps them longer sends, now and then, a
# request on a connection the server is closing at that moment and gets ServerDisconnectedError -- for a PD prefill
# half sent alongside its decode half, that loses the half and the decode half waits minutes for KV that never comes.
UPSTREAM_KEEPALIVE_S = 4.0
# How long our listeners (the front, the standalone control plane) keep an idle connection open. Above the pools
# of the clients trainers use (aiohttp keeps one 15 s, httpx 5 s): a client must drop an idle connection before the
# server does, or a request it sends just as the server closes that connection is reset, and a POST is not retried
# (uvicorn's 5 s default raced the demo's own pool on a CPU-starved host: one request in ~5,000 failed ReadError).
SERVER_KEEPALIVE_S = 75.0


async def post_fresh(session: Any, url: str, **kwargs: Any) -> Any:
    """``session.post``, sent once more when the first try fails before any answer because the server had already
    closed the pooled connection (the request never reached it; the second try opens a new connection). An error
    once the answer began is not retried: the instance then had the request. When the second try finds nothing
    listening, the first failure is what is raised: the instance died holding the request."""
    try:
        return await session.post(url, **kwargs)
    except aiohttp.ServerDisconnectedError as first:
        if session.closed:  # our side is shutting down: nothing to retry on
            raise
        try:
            return await session.post(url, **kwargs)
        except aiohttp.ClientConnectorError:
            raise first from None  # the server is gone: it died with the request (``died_serving``), not idle


def died_serving(e: BaseException) -> bool:
    """The instance went away after it had the request (the connection dropped, the answer broke off), unlike a
    connection it refused, which it never had."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return False
    return isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError))


def field_error(field: str, message: str, status: int = 422, detail: Any = None) -> JSONResponse:
    body: dict[str, Any] = {"error": f"field '{field}': {message}", "field": field, "code": Code.INVALID.value}
    if detail is not None:
        body["detail"] = detail
    return JSONResponse(body, status_code=status)


def coded_error(status: int, code: Code, message: str, *, field: str | None = None, detail: Any = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message, "code": code.value}
    if field is not None:
        body["field"] = field
    if detail is not None:
        body["detail"] = detail
    return JSONResponse(body, status_code=status)


def error(status: int, message: str, detail: Any = None) -> JSONResponse:
    return JSONResponse({"error": message, "detail": detail}, status_code=status)


async def json_object(request: Request) -> dict[str, Any] | JSONResponse:
    """The body as a JSON object, or the 400 response to send instead."""
    try:
        body = await request.json()
    except Exception as e:
        return field_error("body", f"malformed JSON ({e})", 400)
    if not isinstance(body, dict):
        return field_error("body", "must be a JSON object", 400)
    return body


def json_body(handler: Callable[[dict[str, Any]], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
    """A POST route whose ``handler`` takes the request's JSON object; any other body is answered 400 here."""

    async def route(request: Request) -> Any:
        body = await json_object(request)
        return body if isinstance(body, JSONResponse) else await handler(body)

    # Not functools.wraps: FastAPI would read the handler's signature through __wrapped__ and expect a ``body`` field.
    route.__name__, route.__qualname__, route.__doc__ = handler.__name__, handler.__qualname__, handler.__doc__
    return route
