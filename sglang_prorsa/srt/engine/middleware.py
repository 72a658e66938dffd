"""The instance's ASGI middleware: starts the engine extension on the server's event loop, and moves a
``trajectory_id`` body field (accepted by our front and instances, unknown to SGLang's request schema) into the
``X-Trajectory-Id`` header, where the engine reads it."""

from __future__ import annotations

from typing import Any

import orjson

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
TRAJECTORY_FIELD = b'"trajectory_id"'


class EngineMiddleware:
    def __init__(self, app: Any, side: Any) -> None:
        self.app = app
        self.side = side
        self.started = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self.started:
            self.started = True
            await self.side.start()
        if scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        body = await _read_body(receive)
        if TRAJECTORY_FIELD in body:
            body, scope = _move_trajectory_id(body, scope)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _move_trajectory_id(body: bytes, scope: dict) -> tuple[bytes, dict]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, scope  # SGLang answers the malformed body itself
    if not isinstance(parsed, dict) or "trajectory_id" not in parsed:
        return body, scope
    tid = parsed.pop("trajectory_id")
    body = orjson.dumps(parsed)
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"x-trajectory-id")]
    if isinstance(tid, str) and tid:
        headers.append((b"x-trajectory-id", tid.encode()))
    headers.append((b"content-length", str(len(body)).encode()))
    return body, {**scope, "headers": headers}
