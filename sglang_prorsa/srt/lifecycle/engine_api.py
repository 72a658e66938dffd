"""Engine-side lifecycle API: what the SGLang front calls when a request that carries a trajectory id moves.

The engine observes ready / prefill / decode itself (SPEC.md, §4.1.1); the trainer cannot. Requests name their
trajectory in the body field ``trajectory_id`` or the header ``X-Trajectory-Id`` (``trajectory_id_of`` reads both).
Each call becomes a ``LifecycleEvent`` handed to a sink (normally ``ControlPlane.ingest``), so the engine path and the
HTTP replay path go through the same validation-free, already-typed state machine.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from sglang_prorsa.srt.lifecycle.events import MAX_ID_CHARS, EventKind, LifecycleEvent

TRAJECTORY_ID_HEADER = "X-Trajectory-Id"
TRAJECTORY_ID_FIELD = "trajectory_id"

EventSink = Callable[[Sequence[LifecycleEvent]], Any]


def trajectory_id_of(body: Mapping[str, Any] | None, headers: Mapping[str, str] | None) -> str | None:
    """The request's trajectory id: body field first, then header (case-insensitive); None for untracked requests."""
    value = body.get(TRAJECTORY_ID_FIELD) if body else None
    if value is None and headers:
        value = headers.get(TRAJECTORY_ID_HEADER)
        if value is None:
            lowered = TRAJECTORY_ID_HEADER.lower()
            value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS:
        return value
    return None


class EngineLifecycleReporter:
    """Typed calls for the engine front; ``ts=None`` means "stamp with the control plane's clock on receipt"."""

    def __init__(self, sink: EventSink) -> None:
        self._sink = sink

    def request_arrived(
        self, trajectory_id: str, prompt_tokens: int, *, instance: str | None = None, ts: float | None = None
    ) -> None:
        """The request joined the ready queue: a prefill arrival (``prompt_tokens`` = full prompt, cache included)."""
        self._emit(trajectory_id, EventKind.REQUEST_ARRIVED, ts, prompt_tokens=int(prompt_tokens), instance=instance)

    def prefill_started(self, trajectory_id: str, instance: str, *, ts: float | None = None) -> None:
        """Service started on prefill ``instance`` (not an arrival)."""
        self._emit(trajectory_id, EventKind.PREFILL_START, ts, instance=str(instance))

    def prefill_finished(self, trajectory_id: str, instance: str | None = None, *, ts: float | None = None) -> None:
        """Prefill completed: a decode admission of the request's prompt tokens."""
        self._emit(trajectory_id, EventKind.PREFILL_END, ts, instance=None if instance is None else str(instance))

    def decode_finished(self, trajectory_id: str, *, ts: float | None = None) -> None:
        """The response is complete; the trainer will report tool_start or reward_start next."""
        self._emit(trajectory_id, EventKind.DECODE_END, ts)

    def _emit(self, trajectory_id: str, kind: EventKind, ts: float | None, **fields: Any) -> None:
        prompt = fields.get("prompt_tokens")
        if prompt is not None and prompt < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {prompt}")
        self._sink([LifecycleEvent(trajectory_id=trajectory_id, kind=kind, ts=ts, **fields)])
