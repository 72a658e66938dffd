"""HTTP routes of the lifecycle control plane (issue 3), as a router any FastAPI app can mount.

    POST /lifecycle          one event object or {"events": [...]} (at most MAX_BATCH_EVENTS), applied all-or-none
    POST /lifecycle/config   injection policy, default prompt length, horizon S, prefill instances / profile
    GET  /lifecycle/config   the current configuration
    GET  /lifecycle/status   counters, recent rejected events, state counts
    GET  /prorsa/forecast    the forecast now, or at ?at=<unix seconds>

Errors: malformed JSON -> 400; validation (unknown event, wrong type, missing or negative field) -> 422; a batch over
the limit -> 413. The body is ``{"error": "event 3, field 'prompt_tokens': must be >= 0, got -5", "index": 3,
"field": "prompt_tokens"}``. Invalid *transitions* are not errors: the batch is accepted (200) and the response lists
them under ``rejections`` (the tracker counts them, ``rejected_events`` in the forecast).

Bodies are parsed here rather than by pydantic models so that every message names the event index and the field in
one format, whatever the mistake.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sglang_prorsa.srt.forecast.config import ConfigError
from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane
from sglang_prorsa.srt.lifecycle.events import EventValidationError

MAX_BODY_BYTES = 16 * 1024 * 1024


def _error(status: int, message: str, *, index: int | None = None, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "index": index, "field": field}, status_code=status)


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise EventValidationError(f"body larger than {MAX_BODY_BYTES} bytes", field="body", status=413)
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EventValidationError(f"malformed JSON: {exc}", field="body", status=400)


def make_router(control_plane: LifecycleControlPlane) -> APIRouter:
    router = APIRouter()

    @router.post("/lifecycle")
    async def post_lifecycle(request: Request) -> JSONResponse:
        try:
            result = control_plane.ingest_payload(await _json_body(request))
        except EventValidationError as exc:
            return _error(exc.status, str(exc), index=exc.index, field=exc.field)
        return JSONResponse(result.to_dict())

    @router.post("/lifecycle/config")
    async def post_config(request: Request) -> JSONResponse:
        try:
            config = control_plane.configure(await _json_body(request))
        except EventValidationError as exc:
            return _error(exc.status, str(exc), field=exc.field)
        except ConfigError as exc:
            return _error(422, str(exc), field=exc.field)
        return JSONResponse(config.to_dict())

    @router.get("/lifecycle/config")
    async def get_config() -> JSONResponse:
        return JSONResponse(control_plane.config.to_dict())

    @router.get("/lifecycle/status")
    async def get_status() -> JSONResponse:
        return JSONResponse(control_plane.status())

    @router.get("/prorsa/forecast")
    async def get_forecast(at: str | None = None) -> JSONResponse:
        when = None
        if at is not None:
            try:
                when = float(at)
            except ValueError:
                return _error(422, f"field 'at': must be unix seconds, got {at!r:.40}", field="at")
            if not math.isfinite(when) or when < 0:
                return _error(422, f"field 'at': must be finite and >= 0, got {at!r:.40}", field="at")
        return JSONResponse(control_plane.forecast(when).to_dict())

    return router
