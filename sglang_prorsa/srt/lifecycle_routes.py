"""HTTP routes of the lifecycle control plane (issue 3), as a router any FastAPI app can mount.

    POST /lifecycle          one event object or {"events": [...]} (at most MAX_BATCH_EVENTS), applied all-or-none
    POST /lifecycle/config   injection policy, default prompt length, horizon S, prefill instances / profile (on a
                             server, S is fixed by --prorsa-horizon: another value is a 409, ``fixed_setting``)
    GET  /lifecycle/config   the current configuration
    GET  /lifecycle/status   counters, recent rejected events, state counts
    GET  /prorsa/forecast    the forecast now, or at ?at=<unix seconds>; with a ``baseline`` object (persistence: its
                             forecast and running WAPE, ours on the same windows, their ratio)

Nothing heavy runs on the event loop: ``/prorsa/forecast`` returns the control plane's background refresher's latest
forecast (``LifecycleControlPlane.start``), and computes one in a worker thread only for ``?at=`` or when no
refresher runs; large ``/lifecycle`` batches are validated and applied in a worker thread too (the apply holds the
control plane's lock for O(events)).

Errors: malformed JSON -> 400; validation (unknown event, wrong type, missing or negative field) -> 422; a batch over
the limit -> 413; a horizon S other than the one a server was started with -> 409 (``control_plane_for``). The
body is ``{"error": "event 3, field 'prompt_tokens': must be >= 0, got -5", "index": 3,
"field": "prompt_tokens"}``. Invalid *transitions* are not errors: the batch is accepted (200) and the response lists
them under ``rejections`` (the tracker counts them, ``rejected_events`` in the forecast).

Bodies are parsed here rather than by pydantic models so that every message names the event index and the field in
one format, whatever the mistake.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

try:  # orjson parses event batches ~3x faster; the standard library is the fallback
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple = (orjson.JSONDecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover - orjson is pinned in requirements/base.txt
    _loads = json.loads
    _DecodeError = (UnicodeDecodeError, json.JSONDecodeError)

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sglang_prorsa.config import ProrsaConfig
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import ConfigError, FixedSettingError, PredictorConfig
from sglang_prorsa.policy.lifecycle.events import EventValidationError, parse_payload
from sglang_prorsa.srt.common.auth import admin
from sglang_prorsa.srt.common.messages import Code

MAX_BODY_BYTES = 16 * 1024 * 1024
# Smaller bodies (a few dozen events) are applied on the event loop when the state is free: a thread hop costs more.
INLINE_BODY_BYTES = 16 * 1024


def control_plane_for(config: ProrsaConfig) -> LifecycleControlPlane:
    """The lifecycle control plane of a server launched with ``config`` (the front, or a single server): S from
    ``--prorsa-horizon``, the one source of the horizon every consumer reads, and fixed there
    (``LifecycleControlPlane.configure`` says why a live change is refused)."""
    return LifecycleControlPlane(config=PredictorConfig(horizon_s=config.prorsa_horizon_s),
                                 horizon_fixed_by="--prorsa-horizon")


def _error(status: int, message: str, *, index: int | None = None, field: str | None = None,
           code: Code | None = None) -> JSONResponse:
    if field is None:  # the whole event (not one of its fields) or the whole body is what is wrong
        field = "body" if index is None else "events"
    body = {"error": message, "index": index, "field": field}
    if code is not None:
        body["code"] = code.value
    return JSONResponse(body, status_code=status)


async def _json_body(request: Request) -> Any:
    return _parse(await _raw_body(request))


async def _raw_body(request: Request) -> bytes:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise EventValidationError(f"body larger than {MAX_BODY_BYTES} bytes", field="body", status=413)
    return raw


def _parse(raw: bytes) -> Any:
    try:
        return _loads(raw)
    except _DecodeError as exc:
        raise EventValidationError(f"malformed JSON: {exc}", field="body", status=400) from None


def make_router(control_plane: LifecycleControlPlane) -> APIRouter:
    router = APIRouter()

    def ingest(raw: bytes):
        return control_plane.ingest_payload(_parse(raw))

    @router.post("/lifecycle")
    async def post_lifecycle(request: Request) -> JSONResponse:
        try:
            raw = await _raw_body(request)
            if len(raw) <= INLINE_BODY_BYTES:
                events = parse_payload(_parse(raw), control_plane.max_batch_events)
                # Applied here unless the refresher holds the state: then from a thread, never blocking this loop.
                result = control_plane.ingest(events, wait=False)
                if result is None:
                    result = await asyncio.to_thread(control_plane.ingest, events)
            else:
                result = await asyncio.to_thread(ingest, raw)
        except EventValidationError as exc:
            return _error(exc.status, str(exc), index=exc.index, field=exc.field)
        return JSONResponse(result.to_dict())

    @router.post("/lifecycle/config")
    @admin  # changes the forecast's configuration: the admin key (SGLang's ADMIN_OPTIONAL), wherever it is mounted
    async def post_config(request: Request) -> JSONResponse:
        try:
            config = await asyncio.to_thread(control_plane.configure, await _json_body(request))
        except EventValidationError as exc:
            return _error(exc.status, str(exc), field=exc.field)
        except ConfigError as exc:  # 422 for a malformed value, 409 for a setting the server fixed at start-up
            code = Code.FIXED_SETTING if isinstance(exc, FixedSettingError) else Code.INVALID
            return _error(exc.status, str(exc), field=exc.field, code=code)
        return JSONResponse(config.to_dict())

    @router.get("/lifecycle/config")
    async def get_config() -> JSONResponse:
        return JSONResponse(control_plane.config.to_dict())

    @router.get("/lifecycle/status")
    async def get_status() -> JSONResponse:
        return JSONResponse(await asyncio.to_thread(control_plane.status))  # it reads the state under its lock

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
        fc = control_plane.cached_forecast() if when is None else None
        if fc is None:
            fc = await asyncio.to_thread(control_plane.forecast, when)
        return JSONResponse(fc.to_dict())

    return router
