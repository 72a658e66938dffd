"""The SDK's exceptions: every failure says what went wrong in terms the trainer can act on.

``ProrsaHTTPError`` carries the HTTP status and the server's own message (our routes name the offending field:
``"field 'sampling_params.max_new_tokens': must be a non-negative integer"``); ``ProrsaConnectionError`` a request that
got no answer at all; ``InvalidArgument`` / ``HintError`` bad input caught before anything is sent; ``HintBufferFull``
a hint refused because the buffer is full under ``overflow="error"``.
"""

from __future__ import annotations

import json
from typing import Any


class ProrsaClientError(Exception):
    """Base class of every exception the SDK raises."""


class InvalidArgument(ProrsaClientError, ValueError):
    """A call's argument is wrong; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field '{field}': {message}")
        self.field = field


class HintError(ProrsaClientError, ValueError):
    """A lifecycle hint that the server would reject (checked with the server's own validator before queueing)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class HintBufferFull(ProrsaClientError):
    """The hint buffer holds ``capacity`` events and its overflow policy is ``"error"``."""

    def __init__(self, capacity: int) -> None:
        super().__init__(f"hint buffer full ({capacity} events waiting); the hint endpoint is down or too slow "
                         "(use overflow='drop_oldest' to drop the oldest hint instead)")
        self.capacity = capacity


class ProrsaConnectionError(ProrsaClientError, ConnectionError):
    """No HTTP answer: connection refused or reset, or the request timed out."""

    def __init__(self, method: str, url: str, cause: BaseException) -> None:
        super().__init__(f"{method} {url}: no answer ({type(cause).__name__}: {cause})")
        self.method = method
        self.url = url


class ProrsaHTTPError(ProrsaClientError):
    """The server answered with a non-2xx status. ``message`` is the server's error text, ``field`` the field it
    names when it says (our routes put it in ``field``), ``body`` the parsed body (or the raw text)."""

    def __init__(self, method: str, url: str, status: int, body: Any) -> None:
        self.method = method
        self.url = url
        self.status = status
        self.body = body
        self.message, self.field = error_message(body)
        super().__init__(f"{method} {url} -> HTTP {status}: {self.message}")


def error_message(body: Any) -> tuple[str, str | None]:
    """(message, field) from the error bodies we meet: ours ``{"error": str, "field": ...}``, SGLang's
    ``{"error": {"message": ...}}`` / ``{"object": "error", "message": ...}``, FastAPI's ``{"detail": ...}``."""
    if isinstance(body, (bytes, str)):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        try:
            body = json.loads(text)
        except ValueError:
            return (text.strip()[:2000] or "(empty body)"), None
    if not isinstance(body, dict):
        return json.dumps(body)[:2000], None
    field = body.get("field") if isinstance(body.get("field"), str) else None
    err = body.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err), field
    if err is not None:
        return str(err), field
    if "message" in body:
        return str(body["message"]), field
    if "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):  # pydantic: [{"loc": [...], "msg"}]
            loc = ".".join(str(x) for x in detail[0].get("loc", ()) if x != "body")
            return f"field '{loc}': {detail[0].get('msg')}", field or loc or None
        return str(detail), field
    return json.dumps(body)[:2000], field


class GroupError(ProrsaClientError):
    """Some members of a GRPO group failed. ``errors`` maps member index to its exception; ``results`` holds every
    member's result (None where it failed), in member order."""

    def __init__(self, group_id: str, errors: dict[int, BaseException], results: list[Any]) -> None:
        first = min(errors)
        super().__init__(f"group {group_id}: {len(errors)} of {len(results)} members failed; member {first}: "
                         f"{type(errors[first]).__name__}: {errors[first]}")
        self.group_id = group_id
        self.errors = errors
        self.results = results
