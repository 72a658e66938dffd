"""The instance's ASGI middleware: starts the engine extension on the server's event loop, moves a
``trajectory_id`` body field (accepted by our front and instances, unknown to SGLang's request schema) into the
``X-Trajectory-Id`` header, where the engine reads it, and refuses what this device cannot do (SGLang 0.5.23's memory
release/resume goes through torch_memory_saver and CUDA: on a CPU instance it kills the scheduler), and names the
refused field in a generation route's 400."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from sglang_prorsa.policy.lifecycle.engine_api import valid_id

if TYPE_CHECKING:
    from sglang_prorsa.srt.engine.side import EngineSide

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
ABORT_PATH = "/abort_request"
CUDA_ONLY_PATHS = frozenset({"/release_memory_occupation", "/resume_memory_occupation"})
TRAJECTORY_FIELD = b'"trajectory_id"'
FIELD_MESSAGE = re.compile(r"field '([A-Za-z_][A-Za-z0-9_.]*)': ")
TYPED_STATUSES = frozenset({400, 502, 503})
_CODES = frozenset({"suspected_poison", "resume_failed"})  # messages.Code values an instance answers 5xx with


class EngineMiddleware:
    def __init__(self, app: Any, side: EngineSide, cpu: bool = False) -> None:
        self.app = app
        self.side = side
        self.cpu = cpu

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self.side.started:
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

        if scope["path"] == ABORT_PATH:
            return await self.app(scope, replay, send)
        typed = _FieldNamingSend(send)
        try:
            await self.app(scope, replay, typed)
        except _VALIDATION_BUGS as e:
            # SGLang's OpenAI request models have validators that assume a field's type (``response_format``: 1e308
            # raised AttributeError inside pydantic, answered 500): a body that breaks validation is the caller's.
            if typed.started or not _raised_validating(e):
                raise
            await _refuse(send, "body", f"the request body does not validate ({type(e).__name__}: {e})"[:400])


class _FieldNamingSend:
    """Makes a generation route's error typed, so a client reads it without parsing the message: a 400 whose message
    names a field (``request_guard.RequestRefused``: ``field 'x': ...``) gets ``field`` and ``code: invalid`` (and
    ``param``, in OpenAI's shape, whose ``code`` is otherwise the HTTP status: a string code is what OpenAI's own API
    sends there); a 502/503 whose message leads with one of our codes (``suspected_poison: ...``,
    ``resume_failed: ...``) gets that ``code``. Other responses pass through untouched,
    streamed ones included."""

    def __init__(self, send: Any) -> None:
        self.send = send
        self.start: dict | None = None
        self.chunks: list[bytes] = []
        self.started = False  # a response began (the caller has, or will have, its status)

    async def __call__(self, message: dict) -> None:
        self.started = True
        if message["type"] == "http.response.start" and message["status"] in TYPED_STATUSES:
            self.start = message
            return
        if self.start is None or message["type"] != "http.response.body":
            return await self.send(message)
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = typed_error(b"".join(self.chunks))
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        await self.send({**self.start, "headers": headers + [(b"content-length", str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body})


def typed_error(body: bytes) -> bytes:
    """``body`` with the refused field made explicit, when its message starts ``field '<name>': ``."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(parsed, dict):
        return body
    from sglang_prorsa.srt.common.messages import Code

    detail = parsed.get("detail")
    if isinstance(detail, str):  # FastAPI's shape for an HTTPException
        code = detail.split(":", 1)[0]
        return orjson.dumps({**parsed, "code": code, "error": detail}) if code in _CODES else body
    error = parsed.get("error")
    message = error.get("message") if isinstance(error, dict) else parsed.get("message", error)
    if not isinstance(message, str):
        return body
    match = FIELD_MESSAGE.match(message)
    openai = parsed.get("object") == "error"  # OpenAI's shape (SGLang puts the HTTP status in its ``code``)
    if match is not None:
        parsed.update(field=match.group(1), code=Code.INVALID.value, **({"param": match.group(1)} if openai else {}))
    elif message.split(":", 1)[0] in _CODES:
        parsed["code"] = message.split(":", 1)[0]
    else:
        return body
    return orjson.dumps(parsed)


_VALIDATION_BUGS = (AttributeError, TypeError, KeyError, IndexError, OverflowError, RecursionError)


def _raised_validating(e: BaseException) -> bool:
    """Raised while FastAPI validated the request body into SGLang's request model (pydantic's frames on the way)."""
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "/pydantic/" in name or "/fastapi/dependencies/" in name:
            return True
        tb = tb.tb_next
    return False


async def _refuse(send: Any, field: str, message: str) -> None:
    from sglang_prorsa.srt.common.messages import Code

    body = orjson.dumps({"error": f"field '{field}': {message}", "field": field, "code": Code.INVALID.value})
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _unsupported(send: Any, path: str) -> None:
    from sglang_prorsa.srt.common.messages import Code

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
    # An unusable body value (not a string, empty, over-long) is skipped as engine_api.trajectory_id_of skips it: the
    # header, if any, stays, so this instance reads the id the front read.
    dropped = (b"content-length", b"x-trajectory-id") if valid_id(tid) else (b"content-length",)
    headers = [(k, v) for k, v in scope["headers"] if k not in dropped]
    if valid_id(tid):
        headers.append((b"x-trajectory-id", tid.encode()))
    headers.append((b"content-length", str(len(body)).encode()))
    return body, {**scope, "headers": headers}
