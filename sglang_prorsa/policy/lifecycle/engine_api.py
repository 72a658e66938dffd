"""Engine-side lifecycle API: what the SGLang front calls when a request that carries a trajectory id moves.

The engine observes ready / prefill / decode itself (SPEC.md, §4.1.1); the trainer cannot. Requests name their
trajectory in the body field ``trajectory_id`` or the header ``X-Trajectory-Id`` (``trajectory_id_of`` reads both).
Each call becomes a ``LifecycleEvent`` handed to a sink (normally ``ControlPlane.ingest``), so the engine path and the
HTTP replay path go through the same validation-free, already-typed state machine.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from sglang_prorsa.policy.lifecycle.events import MAX_ID_CHARS, EventKind, LifecycleEvent, PauseMode

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

    def decode_finished(self, trajectory_id: str, *, output_tokens: int | None = None, ts: float | None = None) -> None:
        """The response is complete; the trainer will report tool_start or reward_start next. ``output_tokens``
        (optional) teaches the predictor the decode speed, for the KV footprint of running decodes."""
        if output_tokens is not None and output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
        self._emit(trajectory_id, EventKind.DECODE_END, ts,
                   output_tokens=None if output_tokens is None else int(output_tokens))

    # ----- engine-wide control events (the trainer's control surface, issue 13) -----
    def generation_paused(self, mode: PauseMode | str = PauseMode.ABORT, *, ts: float | None = None) -> None:
        """``/pause_generation``: in-flight trajectories are suspended (``retract``, ``in_place``: their clocks stop
        until ``generation_continued``) or dropped (``abort``: they wait for the trainer in ``interrupted``)."""
        self._emit("", EventKind.GENERATION_PAUSED, ts, pause_mode=PauseMode(mode))

    def generation_continued(self, *, ts: float | None = None) -> None:
        """``/continue_generation``: suspended trajectories resume where they stopped."""
        self._emit("", EventKind.GENERATION_CONTINUED, ts)

    def requests_aborted(self, trajectory_ids=None, *, ts: float | None = None) -> None:
        """``/abort_request``: the named trajectories' (None: every) in-flight requests were dropped."""
        ids = None if trajectory_ids is None else tuple(str(t) for t in trajectory_ids)
        self._emit("", EventKind.REQUESTS_ABORTED, ts, trajectory_ids=ids)

    def weights_updated(self, version: str | int | None = None, *, ts: float | None = None) -> None:
        """A weight update finished (``weight_version``): a step boundary for the forecast."""
        self._emit("", EventKind.WEIGHTS_UPDATED, ts, weight_version=None if version is None else str(version))

    def _emit(self, trajectory_id: str, kind: EventKind, ts: float | None, **fields: Any) -> None:
        prompt = fields.get("prompt_tokens")
        if prompt is not None and prompt < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {prompt}")
        self._sink([LifecycleEvent(trajectory_id=trajectory_id, kind=kind, ts=ts, **fields)])
