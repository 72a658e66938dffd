"""The instance's ASGI middleware: starts the engine extension on the server's event loop, moves a
``trajectory_id`` body field (accepted by our front and instances, unknown to SGLang's request schema) into the
``X-Trajectory-Id`` header, where the engine reads it, and refuses what this device cannot do (SGLang 0.5.23's memory
release/resume goes through torch_memory_saver and CUDA: on a CPU instance it kills the scheduler)."""

from __future__ import annotations

from typing import Any

import orjson

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
ABORT_PATH = "/abort_request"
CUDA_ONLY_PATHS = frozenset({"/release_memory_occupation", "/resume_memory_occupation"})
TRAJECTORY_FIELD = b'"trajectory_id"'


class EngineMiddleware:
    def __init__(self, app: Any, side: Any, cpu: bool = False) -> None:
        self.app = app
        self.side = side
        self.cpu = cpu
        self.started = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self.started:
            self.started = True
            await self.side.start()
        if self.cpu and scope["path"] in CUDA_ONLY_PATHS:
            return await _unsupported(send, scope["path"])
        if scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS | {ABORT_PATH}:
            return await self.app(scope, receive, send)
        body = await _read_body(receive)
        if scope["path"] == ABORT_PATH:
            if _aborts_all(body):
                self.side.user_aborts += 1  # PD halves failing from here on were aborted by the trainer (hooks.py)
        elif TRAJECTORY_FIELD in body:
            body, scope = _move_trajectory_id(body, scope)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _unsupported(send: Any, path: str) -> None:
    from sglang_prorsa.srt.messages import Code

    body = orjson.dumps({"success": False, "code": Code.UNSUPPORTED.value,
                         "message": f"{path[1:]} needs a CUDA device (SGLang's torch_memory_saver); "
                                    "this instance runs on cpu"})
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _aborts_all(body: bytes) -> bool:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False  # SGLang answers the malformed body itself
    return isinstance(parsed, dict) and parsed.get("abort_all") is True


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
