"""Typed lifecycle events and their validation (paper §4.1.1; SPEC.md "Trajectory state machine").

The trainer reports what the engine cannot see (sampling, sandbox, tool, reward); the engine reports the ready /
prefill / decode transitions of requests that carry a trajectory id. Both arrive here as ``LifecycleEvent``.

Wire format (one JSON object per event)::

    {"trajectory_id": "t1", "event": "tool_start", "ts": 1718000000.5, "task": "swe", "turn": 3, "tool": "bash"}

Validation is strict: unknown fields, wrong types, negative lengths and missing per-event fields are rejected with an
``EventValidationError`` that names the event index and the field, so a trainer finds its bug from one response.
A batch holds at most ``MAX_BATCH_EVENTS`` events; larger batches are rejected whole.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

# A batch larger than this is rejected whole (HTTP 413). 10k events of ~150 bytes is ~1.5 MB: large enough for a
# trainer to flush a whole rollout step at once, small enough that applying it under the control-plane lock stays short.
MAX_BATCH_EVENTS = 10_000
MAX_ID_CHARS = 256


class EventKind(str, Enum):
    # trainer-side hints
    SAMPLED = "sampled"
    SANDBOX_START = "sandbox_start"
    SANDBOX_READY = "sandbox_ready"
    TOOL_START = "tool_start"
    TOOL_END = "tool_end"
    REWARD_START = "reward_start"
    REWARD_END = "reward_end"
    ABORTED = "aborted"
    # engine-side transitions (normally reported by the engine API; accepted over HTTP for replay and dry runs)
    REQUEST_ARRIVED = "request_arrived"
    PREFILL_START = "prefill_start"
    PREFILL_END = "prefill_end"
    DECODE_END = "decode_end"


class SandboxMode(str, Enum):
    PREWARM = "prewarm"
    COLD = "cold"


ENGINE_EVENT_KINDS = frozenset(
    {EventKind.REQUEST_ARRIVED, EventKind.PREFILL_START, EventKind.PREFILL_END, EventKind.DECODE_END}
)

# Fields an event of this kind cannot do without: the predictor needs them to place the trajectory.
_REQUIRED_BY_KIND: dict[EventKind, tuple[str, ...]] = {
    EventKind.SANDBOX_START: ("mode",),
    EventKind.REQUEST_ARRIVED: ("prompt_tokens",),
    EventKind.PREFILL_START: ("instance",),
}


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One lifecycle transition of one trajectory. ``ts`` is None until the receiver stamps its clock on it."""

    trajectory_id: str
    kind: EventKind
    ts: float | None = None
    group_id: str | None = None
    task: str | None = None
    turn: int | None = None
    prompt_tokens: int | None = None  # estimated full prompt length of the trajectory's next request
    mode: SandboxMode | None = None  # sandbox_start only
    tool: str | None = None  # tool_start only
    accepted: bool | None = None  # reward_end only: admitted to training
    instance: str | None = None  # prefill instance (engine events)

    def stamped(self, now: float) -> LifecycleEvent:
        """This event with ``ts`` filled in from the receiver's clock when the sender left it out."""
        return self if self.ts is not None else dataclasses.replace(self, ts=now)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trajectory_id": self.trajectory_id, "event": self.kind.value}
        for f in _OPTIONAL_FIELDS:
            value = getattr(self, f)
            if value is not None:
                out[f] = value.value if isinstance(value, Enum) else value
        return out


_OPTIONAL_FIELDS = ("ts", "group_id", "task", "turn", "prompt_tokens", "mode", "tool", "accepted", "instance")
_KNOWN_FIELDS = frozenset({"trajectory_id", "event", *_OPTIONAL_FIELDS})


class EventValidationError(ValueError):
    """Bad input; ``index`` is the event's position in the batch (None for the envelope), ``field`` the culprit."""

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None, status: int = 422):
        where = []
        if index is not None:
            where.append(f"event {index}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.index = index
        self.field = field
        self.status = status

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "index": self.index, "field": self.field}


def _string(obj: dict, name: str, index: int, *, required: bool = False) -> str | None:
    value = obj.get(name)
    if value is None:
        if required:
            raise EventValidationError("is required", index=index, field=name)
        return None
    if not isinstance(value, str) or not value:
        raise EventValidationError(f"must be a non-empty string, got {value!r:.40}", index=index, field=name)
    if len(value) > MAX_ID_CHARS:
        raise EventValidationError(f"longer than {MAX_ID_CHARS} characters", index=index, field=name)
    return value


def _non_negative_int(obj: dict, name: str, index: int) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    # bool is an int subclass in Python; `true` is never a length. Integral floats (1024.0) are accepted.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EventValidationError(f"must be an integer, got {value!r:.40}", index=index, field=name)
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise EventValidationError(f"must be an integer, got {value!r}", index=index, field=name)
    if value < 0:
        raise EventValidationError(f"must be >= 0, got {value}", index=index, field=name)
    return int(value)


def _timestamp(obj: dict, index: int) -> float | None:
    value = obj.get("ts")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise EventValidationError(f"must be a finite number of unix seconds >= 0, got {value!r:.40}", index=index, field="ts")
    return float(value)


def parse_event(obj: Any, index: int = 0) -> LifecycleEvent:
    """Validate one wire object into a ``LifecycleEvent`` or raise ``EventValidationError`` naming ``index``."""
    if not isinstance(obj, dict):
        raise EventValidationError(f"must be a JSON object, got {type(obj).__name__}", index=index)
    unknown = sorted(set(obj) - _KNOWN_FIELDS)
    if unknown:
        raise EventValidationError("unknown field", index=index, field=unknown[0])
    trajectory_id = _string(obj, "trajectory_id", index, required=True)
    raw_kind = obj.get("event")
    if raw_kind is None:
        raise EventValidationError("is required", index=index, field="event")
    try:
        kind = EventKind(raw_kind)
    except (ValueError, TypeError):
        names = ", ".join(k.value for k in EventKind)
        raise EventValidationError(f"unknown event {raw_kind!r:.40}; expected one of {names}", index=index, field="event")

    mode = None
    if obj.get("mode") is not None:
        try:
            mode = SandboxMode(obj["mode"])
        except (ValueError, TypeError):
            raise EventValidationError(f"must be 'prewarm' or 'cold', got {obj['mode']!r:.40}", index=index, field="mode")
    accepted = obj.get("accepted")
    if accepted is not None and not isinstance(accepted, bool):
        raise EventValidationError(f"must be a boolean, got {accepted!r:.40}", index=index, field="accepted")
    instance = obj.get("instance")
    if isinstance(instance, int) and not isinstance(instance, bool) and instance >= 0:
        instance = str(instance)  # engines often number their instances
    else:
        instance = _string(obj, "instance", index)

    event = LifecycleEvent(
        trajectory_id=trajectory_id,
        kind=kind,
        ts=_timestamp(obj, index),
        group_id=_string(obj, "group_id", index),
        task=_string(obj, "task", index),
        turn=_non_negative_int(obj, "turn", index),
        prompt_tokens=_non_negative_int(obj, "prompt_tokens", index),
        mode=mode,
        tool=_string(obj, "tool", index),
        accepted=accepted,
        instance=instance,
    )
    for name in _REQUIRED_BY_KIND.get(kind, ()):
        if getattr(event, name) is None:
            raise EventValidationError(f"is required on '{kind.value}'", index=index, field=name)
    return event


def parse_payload(payload: Any, max_events: int = MAX_BATCH_EVENTS) -> list[LifecycleEvent]:
    """``{...event...}`` or ``{"events": [...]}`` -> events. All-or-none: any bad event rejects the whole batch."""
    if not isinstance(payload, dict):
        raise EventValidationError(f"body must be a JSON object, got {type(payload).__name__}", field="body")
    if "events" not in payload:
        return [parse_event(payload, 0)]
    extra = sorted(set(payload) - {"events"})
    if extra:
        raise EventValidationError("unknown field next to 'events'", field=extra[0])
    events = payload["events"]
    if not isinstance(events, list):
        raise EventValidationError(f"must be a list, got {type(events).__name__}", field="events")
    if len(events) > max_events:
        raise EventValidationError(
            f"batch of {len(events)} events exceeds the limit of {max_events}", field="events", status=413
        )
    return [parse_event(obj, i) for i, obj in enumerate(events)]
