"""Engine-side lifecycle API: what the SGLang front calls when a request that carries a trajectory id moves.

The engine observes ready / prefill / decode itself (SPEC.md, §4.1.1); the trainer cannot. Requests name their
trajectory in SGLang's own request fields or in ours (``trajectory_id_of`` owns the precedence, for the engine and the
front alike).
Each call becomes a ``LifecycleEvent`` handed to a sink (normally ``ControlPlane.ingest``), so the engine path and the
HTTP replay path go through the same validation-free, already-typed state machine.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from sglang_prorsa.policy.lifecycle.events import MAX_ID_CHARS, EventKind, LifecycleEvent, PauseMode

TRAJECTORY_ID_HEADER = "X-Trajectory-Id"
TRAJECTORY_ID_FIELD = "trajectory_id"
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"  # sglang-router's routing key
# SGLang's own request fields (GenerateReqInput) naming a stable identity of a request's session, in precedence order.
SGLANG_ID_FIELDS = ("session_id", "routing_key", "conversation_id")
TRAJECTORY_ID_PARAM = "prorsa_trajectory_id"  # in sampling_params["custom_params"] (carried_id)

EventSink = Callable[[Sequence[LifecycleEvent]], Any]


def valid_id(value: Any) -> bool:
    """A usable trajectory id: a non-empty string of at most ``MAX_ID_CHARS`` characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS


def trajectory_id_of(fields: Mapping[str, Any] | None, headers: Mapping[str, str] | None) -> str | None:
    """The request's trajectory id; None for an untracked request. The one precedence, first usable value wins:

    1. SGLang's own fields, ``session_id``, ``routing_key``, ``conversation_id``: what a trainer already sends
       SGLang needs no second copy of;
    2. our body field ``trajectory_id``, then ``sampling_params.custom_params.prorsa_trajectory_id``
       (``carried_id``), then the header ``X-Trajectory-Id``;
    3. sglang-router's ``X-SMG-Routing-Key`` header.

    ``fields`` are the request's fields as SGLang's ``GenerateReqInput`` has them (a ``/generate`` body, or the object
    an in-process caller built); ``headers`` may be None (in-process callers have none). A value that is not a
    non-empty string of at most ``MAX_ID_CHARS`` characters (an int, a list, an over-long string) is skipped, not an
    error: SGLang's own validation answers a mistyped field over HTTP with a 400 naming it. A ``routing_key`` equal to
    the ``X-SMG-Routing-Key`` header ranks as that header: SGLang's OpenAI routes copy the header into the field, so
    the engine, which sees only the field, and the front, which sees only the header, agree.
    """
    fields = fields or {}
    router_key = _header(headers, ROUTING_KEY_HEADER)
    for name in SGLANG_ID_FIELDS:
        value = fields.get(name)
        if valid_id(value) and not (name == "routing_key" and value == router_key):
            return value
    for value in (fields.get(TRAJECTORY_ID_FIELD), carried_id(fields.get("sampling_params")),
                  _header(headers, TRAJECTORY_ID_HEADER), router_key):
        if valid_id(value):
            return value
    return None


def carried_id(sampling_params: Any) -> Any:
    """The id a caller that controls only the sampling parameters put in ``custom_params[TRAJECTORY_ID_PARAM]``
    (SGLang's field for per-request values; verl's agent loop passes nothing else through to its in-process
    engine), or None."""
    custom = sampling_params.get("custom_params") if isinstance(sampling_params, Mapping) else None
    return custom.get(TRAJECTORY_ID_PARAM) if isinstance(custom, Mapping) else None


def strip_carried_id(sampling_params: Any) -> None:
    """Removes ``custom_params[TRAJECTORY_ID_PARAM]`` (and ``custom_params`` left empty), in place: the scheduler
    then samples with exactly the parameters the caller meant."""
    custom = sampling_params.get("custom_params") if isinstance(sampling_params, dict) else None
    if isinstance(custom, dict) and TRAJECTORY_ID_PARAM in custom:
        rest = {k: v for k, v in custom.items() if k != TRAJECTORY_ID_PARAM}
        if rest:
            sampling_params["custom_params"] = rest
        else:
            del sampling_params["custom_params"]


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """``name`` looked up case-insensitively (HTTP header names are; a plain dict's keys are not)."""
    if not headers:
        return None
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


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
