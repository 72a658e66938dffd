"""Trajectory states, the transition table and the per-trajectory record (paper §4.1.1, Figure 4).

SPEC.md draws ``sampled -> sandbox_starting -> ready -> prefill -> decode -> tool | reward``. Two hint channels feed
it (trainer and engine) and each sees only half of a hand-off, so two waiting states are explicit here:

* ``DECODED``   - the engine finished the response; the trainer has not yet said whether a tool or the reward follows.
* ``TOOL_DONE`` - the tool returned (``tool_end``); the agent has not yet sent the next request to the engine.

``SANDBOX_READY`` likewise sits between ``sandbox_ready`` and the first request joining the ready queue.

``INTERRUPTED`` (beyond the paper) is where a trajectory waits after the engine dropped its in-flight request
(``requests_aborted`` or a pause in ``abort`` mode, issue 13): the trainer resends it (``request_arrived``), treats the
partial response as final (``tool_start`` / ``reward_start``) or gives the trajectory up (``aborted``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sglang_prorsa.policy.lifecycle.events import EventKind, SandboxMode

DEFAULT_TASK = "default"


class TrajState(str, Enum):
    SAMPLED = "sampled"
    SANDBOX_STARTING = "sandbox_starting"
    SANDBOX_READY = "sandbox_ready"
    READY = "ready"
    PREFILL = "prefill"
    DECODE = "decode"
    DECODED = "decoded"
    TOOL = "tool"
    TOOL_DONE = "tool_done"
    REWARD = "reward"
    INTERRUPTED = "interrupted"


# States whose clocks the engine drives: a pause suspends them (their elapsed time does not run while paused).
ENGINE_STATES = frozenset({TrajState.READY, TrajState.PREFILL, TrajState.DECODE})
STATE_CODES: dict[TrajState, int] = {s: i for i, s in enumerate(TrajState)}  # the tracker's state column
LIVE_STATES = frozenset(TrajState)

# event -> (states it may leave, state it enters; None = finished and removed). ``None`` among the sources means the
# event may create a trajectory the tracker has not seen (a trainer that skips early hints, or a restarted control
# plane); everything else from an unlisted state is an invalid transition: counted, reported and ignored.
_S = TrajState
TRANSITIONS: dict[EventKind, tuple[frozenset, TrajState | None]] = {
    EventKind.SAMPLED: (frozenset({None}), _S.SAMPLED),
    EventKind.SANDBOX_START: (frozenset({None, _S.SAMPLED}), _S.SANDBOX_STARTING),
    EventKind.SANDBOX_READY: (frozenset({_S.SANDBOX_STARTING}), _S.SANDBOX_READY),
    # The engine is authoritative about requests: a request arriving while the trainer's tool_end / sandbox_ready is
    # still in flight implies that hint (the two channels race), so it is accepted from those states too.
    EventKind.REQUEST_ARRIVED: (
        frozenset({None, _S.SAMPLED, _S.SANDBOX_STARTING, _S.SANDBOX_READY, _S.DECODED, _S.TOOL, _S.TOOL_DONE,
                   _S.INTERRUPTED}),
        _S.READY,
    ),
    EventKind.PREFILL_START: (frozenset({_S.READY}), _S.PREFILL),
    EventKind.PREFILL_END: (frozenset({_S.READY, _S.PREFILL}), _S.DECODE),
    # An aborted request may still come back finished (the abort raced its last token): the response is complete.
    EventKind.DECODE_END: (frozenset({_S.DECODE, _S.INTERRUPTED}), _S.DECODED),
    # The trainer may parse the tool call / stop before any of the engine's events for the response reach us (they
    # are batched): every engine state is a valid source; the engine's late events are then recognised by their ts.
    EventKind.TOOL_START: (frozenset({None, _S.READY, _S.PREFILL, _S.DECODE, _S.DECODED, _S.INTERRUPTED}), _S.TOOL),
    EventKind.TOOL_END: (frozenset({_S.TOOL}), _S.TOOL_DONE),
    EventKind.REWARD_START: (frozenset({None, _S.READY, _S.PREFILL, _S.DECODE, _S.DECODED, _S.TOOL, _S.TOOL_DONE,
                                        _S.INTERRUPTED}),
                             _S.REWARD),
    EventKind.REWARD_END: (frozenset({_S.REWARD}), None),
    EventKind.ABORTED: (frozenset(LIVE_STATES), None),
}


def load_bucket(n: int) -> int:
    """Coarse concurrency class (0, 1-3, 4-15, 16-63, ...): conditioning on exact load would never gather samples."""
    return (n.bit_length() + 1) // 2


@dataclass(slots=True)
class Trajectory:
    """Everything the predictor needs about one live trajectory; updated in place, O(1) per event."""

    trajectory_id: str
    state: TrajState
    entered_at: float  # when it entered ``state``: elapsed time e = t - entered_at
    last_kind: EventKind
    task: str = DEFAULT_TASK
    group_id: str | None = None
    turn: int = 0
    mode: SandboxMode | None = None
    tool: str | None = None
    launched_at: float | None = None  # the injection decision (``sampled``), for the launch delay d_hat (B.2)
    sandbox_started_at: float | None = None  # a_k in B.3
    startup_load: int = 0  # load bucket of concurrent sandbox starts when this one began
    tool_started_at: float | None = None
    tool_load: int = 0  # load bucket of concurrent tools when this one began
    prompt_tokens: int | None = None  # full prompt length of the current / latest request
    next_prompt_tokens: int | None = None  # trainer's estimate of the next request's prompt length
    instance: str | None = None  # prefill instance of the current request
    seen_request: bool = False
    slot: int = -1  # row in the tracker's columns (vectorised refresh)
    created_at: float = 0.0
    sandbox_ready_at: float | None = None
    decoded_at: float | None = None  # the last decode_end: start of the decode -> next-request delay
    tool_ended_at: float | None = None
    interrupted_at: float | None = None
    output_tokens: int | None = None  # of the last completed response, when the engine reports it
    stamped: bool = False  # entered_at is the sender's ts (not our receipt time): older stamped events are late

    def elapsed(self, now: float) -> float:
        return max(0.0, now - self.entered_at)
