"""The trajectory tracker: the state machine of §4.1.1 over every live trajectory.

Guarantees (issues 3, 10, 13, 14):
* O(1) per event: dict look-ups, a few column writes, running per-state counters; no scans. The engine-wide events
  (abort-all, a pause in ``abort`` mode, continue) touch the trajectories they affect, found with one vectorised scan.
* A duplicate (the event that put the trajectory in its current state, sent again) is a counted no-op.
* An out-of-order or invalid transition is counted, kept in a short report and ignored: it never raises and never
  touches another trajectory.
* A finished trajectory (``reward_end`` / ``aborted``) leaves the live set and frees its slot; only its id stays in a
  bounded LRU so a resent terminal event is still recognised as a duplicate. Every map here is bounded by the live
  set or by a fixed cap (finished ids, rejections, interned names), never by the history.
* Durations of completed phases, and of phases cut short (censored), go to the observers (the predictor's statistics,
  the accuracy tracker, the step model) through ``TrackerObserver``.
* Outcomes, phases and the observer callbacks are defined in observers.py (and importable from here).
* The engine-wide control events (issue 13): ``generation_paused`` suspends the engine-side states (READY, PREFILL,
  DECODE: their clocks stop until ``generation_continued``; in ``abort`` mode their requests are dropped),
  ``requests_aborted`` moves the named (or all) in-flight trajectories to INTERRUPTED, ``weights_updated`` marks a
  step boundary.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np

from sglang_prorsa.policy.lifecycle.columns import Interner, SlotColumns
from sglang_prorsa.policy.lifecycle.events import EventKind, LifecycleEvent, PauseMode, SandboxMode
from sglang_prorsa.policy.lifecycle.observers import CALLBACKS, Outcome, Phase, Rejection, TrackerObserver
from sglang_prorsa.policy.lifecycle.states import (
    DEFAULT_TASK,
    ENGINE_STATES,
    STATE_CODES,
    TRANSITIONS,
    Trajectory,
    TrajState,
    load_bucket,
)

# Enum members as module constants: reading ``TrajState.DECODE`` is a class-attribute look-up (~0.3 us on
# Python 3.11) and ``x in (A, B)`` compares by value when x is not A: the event path uses these instead.
_DECODE = TrajState.DECODE
_DECODED = TrajState.DECODED
_INTERRUPTED = TrajState.INTERRUPTED
_K_ABORTED = EventKind.ABORTED
_K_DECODE_END = EventKind.DECODE_END
_K_GENERATION_CONTINUED = EventKind.GENERATION_CONTINUED
_K_GENERATION_PAUSED = EventKind.GENERATION_PAUSED
_K_PREFILL_END = EventKind.PREFILL_END
_K_PREFILL_START = EventKind.PREFILL_START
_K_REQUESTS_ABORTED = EventKind.REQUESTS_ABORTED
_K_REQUEST_ARRIVED = EventKind.REQUEST_ARRIVED
_K_REWARD_END = EventKind.REWARD_END
_K_REWARD_START = EventKind.REWARD_START
_K_SAMPLED = EventKind.SAMPLED
_K_SANDBOX_READY = EventKind.SANDBOX_READY
_K_SANDBOX_START = EventKind.SANDBOX_START
_K_TOOL_END = EventKind.TOOL_END
_K_TOOL_START = EventKind.TOOL_START
_K_WEIGHTS_UPDATED = EventKind.WEIGHTS_UPDATED
_M_COLD = SandboxMode.COLD
_M_PREWARM = SandboxMode.PREWARM
_O_AFTER_FINISH = Outcome.AFTER_FINISH
_O_APPLIED = Outcome.APPLIED
_O_DUPLICATE = Outcome.DUPLICATE
_O_INVALID_TRANSITION = Outcome.INVALID_TRANSITION
_O_UNKNOWN_TRAJECTORY = Outcome.UNKNOWN_TRAJECTORY
_PM_ABORT = PauseMode.ABORT
_PREFILL = TrajState.PREFILL
_P_DECODE = Phase.DECODE
_P_DECODE_RETURN = Phase.DECODE_RETURN
_P_HANDOFF = Phase.HANDOFF
_P_LAUNCH = Phase.LAUNCH
_P_POST_TOOL = Phase.POST_TOOL
_P_READY_WAIT = Phase.READY_WAIT
_P_RESEND = Phase.RESEND
_P_REWARD = Phase.REWARD
_P_SANDBOX = Phase.SANDBOX
_P_STARTUP = Phase.STARTUP
_P_TOOL = Phase.TOOL
_P_TOOL_RETURN = Phase.TOOL_RETURN
_READY = TrajState.READY
_REWARD = TrajState.REWARD
_SAMPLED = TrajState.SAMPLED
_SANDBOX_READY = TrajState.SANDBOX_READY
_SANDBOX_STARTING = TrajState.SANDBOX_STARTING
_TOOL = TrajState.TOOL
_TOOL_DONE = TrajState.TOOL_DONE
_SANDBOX_STATES = frozenset({_SANDBOX_READY, _SANDBOX_STARTING})
_AFTER_RESPONSE_STATES = frozenset({_DECODED, _TOOL, _TOOL_DONE})
_TOOL_STATES = frozenset({_TOOL, _TOOL_DONE})
_QUEUED_STATES = frozenset({_PREFILL, _READY})
_RESPONSE_STATES = frozenset({_DECODE, _DECODED, _PREFILL, _READY})
FINISHED_IDS_REMEMBERED = 65_536
REJECTIONS_REPORTED = 64
MAX_TASKS = 256  # distinct task names kept apart; more share one class (memory bound against odd trainers)
MAX_TOOLS = 1024
MAX_INSTANCES = 4096
_MODE_CODES = {None: -1, _M_PREWARM: 0, _M_COLD: 1}
_IMPLIED_BY_REQUEST = frozenset({_K_TOOL_END, _K_SANDBOX_READY})
_TERMINAL = frozenset({_K_REWARD_END, _K_ABORTED})  # never "late": they end the trajectory
_TRANSITIONS_GET = TRANSITIONS.get




class TrajectoryTracker:
    def __init__(self, observers: Iterable[TrackerObserver] = ()) -> None:
        self._observers: list[TrackerObserver] = []
        # per callback, the bound methods of the observers that override it: no calls to no-op defaults per event
        self._cb: dict[str, list] = {name: [] for name in CALLBACKS}
        self._on_phase = self._cb["on_phase"]  # the same list: a few phases end per event
        for observer in observers:
            self.add_observer(observer)
        self._live: dict[str, Trajectory] = {}
        self._by_slot: list[Trajectory | None] = []
        self.columns = SlotColumns()
        self._by_slot.extend([None] * self.columns.capacity)
        self._state_count: dict[TrajState, int] = {s: 0 for s in TrajState}
        # ids of the last FINISHED_IDS_REMEMBERED finished trajectories: a ring and a set (an OrderedDict's table
        # grows in a sawtooth as the oldest ids are dropped; a set reuses its freed slots)
        self._finished: set[str] = set()
        self._finished_ring: list[str | None] = [None] * FINISHED_IDS_REMEMBERED  # its length is the bound
        self._finished_pos = 0
        self.tasks, self.tools, self.instances = Interner(MAX_TASKS), Interner(MAX_TOOLS), Interner(MAX_INSTANCES)
        # GRPO bookkeeping for the group injection rule (B.2): live members and members in reward, per live group.
        self._group_index: dict[str, int] = {}
        self._group_free: list[int] = []
        self.group_live: list[int] = []
        self.group_reward: list[int] = []
        self.counts: dict[Outcome, int] = {o: 0 for o in Outcome}
        self.finished_total = 0
        self.decode_ends_total = 0  # decode_end events applied: the decode completion rate (role_switch/waits.py)
        self.recent_rejections: deque[Rejection] = deque(maxlen=REJECTIONS_REPORTED)
        # engine-wide state (issue 13)
        self.paused_since: float | None = None
        self.pause_mode: PauseMode | None = None
        self.weight_version: str | None = None
        self.weights_updated_at: float | None = None
        self._ts = 0.0

    def add_observer(self, observer: TrackerObserver) -> None:
        self._observers.append(observer)
        for name in CALLBACKS:
            if getattr(type(observer), name, None) is not getattr(TrackerObserver, name):
                self._cb[name].append(getattr(observer, name))

    # ----- views -----
    def get(self, trajectory_id: str) -> Trajectory | None:
        return self._live.get(trajectory_id)

    def at_slot(self, slot: int) -> Trajectory | None:
        return self._by_slot[slot]

    def in_state(self, state: TrajState) -> dict[str, Trajectory]:
        """Live trajectories in ``state``, in the order they entered it (a diagnostic: O(live), not for hot paths)."""
        members = sorted((t for t in self._live.values() if t.state is state), key=lambda t: t.entered_at)
        return {t.trajectory_id: t for t in members}

    @property
    def _by_state(self) -> dict[TrajState, dict[str, Trajectory]]:  # diagnostic, O(live)
        return {s: self.in_state(s) for s in TrajState}

    @property
    def _group_live(self) -> dict[str, int]:
        return {g: self.group_live[i] for g, i in self._group_index.items()}

    @property
    def _group_reward(self) -> dict[str, int]:
        return {g: self.group_reward[i] for g, i in self._group_index.items()}

    def group_waiting_outside_reward(self, group_id: str) -> bool:
        """True while some live member of the group has not reached reward (so the group cannot complete)."""
        i = self._group_index.get(group_id)
        return i is not None and self.group_live[i] > self.group_reward[i]

    @property
    def live_count(self) -> int:
        return len(self._live)

    def count(self, state: TrajState) -> int:
        return self._state_count[state]

    @property
    def paused(self) -> bool:
        return self.paused_since is not None

    @property
    def rejected_count(self) -> int:
        return (
            self.counts[_O_INVALID_TRANSITION]
            + self.counts[_O_UNKNOWN_TRAJECTORY]
            + self.counts[_O_AFTER_FINISH]
        )

    def state_counts(self) -> dict[str, int]:
        return {s.value: n for s, n in self._state_count.items()}

    def memory_footprint(self) -> dict[str, int]:
        """Sizes of every map the tracker keeps (the bounded-memory check of issue 14 reads these)."""
        return {"live": len(self._live), "slots": self.columns.capacity, "finished_ids": len(self._finished),
                "groups": len(self._group_index), "group_rows": len(self.group_live), "tasks": len(self.tasks),
                "tools": len(self.tools), "instances": len(self.instances), "rejections": len(self.recent_rejections)}

    # ----- the state machine -----
    def apply(self, event: LifecycleEvent, now: float | None = None) -> Outcome:
        """Apply one event at ``event.ts`` (or ``now`` when the sender left ``ts`` out: the receiver's clock).
        Never raises on protocol errors; returns what happened."""
        kind, sent_ts = event.kind, event.ts  # locals: several reads each on the event path
        # both None is a caller error: float(None) raises TypeError (kept off the per-event path's branches)
        ts = float(sent_ts if sent_ts is not None else now)  # type: ignore[arg-type]
        self._ts = ts  # when the phases ended by this event ended
        transition = _TRANSITIONS_GET(kind)
        if transition is None:
            return self._count(event, None, self._apply_global(event, ts))
        sources, target = transition
        traj = self._live.get(event.trajectory_id)
        if traj is None:
            if event.trajectory_id in self._finished:
                terminal = kind in _TERMINAL
                return self._count(event, None, _O_DUPLICATE if terminal else _O_AFTER_FINISH)
            if None not in sources or target is None:  # (an event that may create one never ends it)
                return self._count(event, None, _O_UNKNOWN_TRAJECTORY)
            traj = self._create(event, ts, target)
            self._enter(traj, target, event, ts, previous=None)
            traj.stamped = sent_ts is not None
            self.counts[_O_APPLIED] += 1
            return _O_APPLIED
        state = traj.state
        if state is target and traj.last_kind is kind:
            return self._count(event, state, _O_DUPLICATE)
        if sent_ts is not None and traj.stamped and sent_ts < traj.entered_at and kind not in _TERMINAL:
            # Both senders stamped the time things happened, and this one happened before the trajectory entered its
            # current state: a late report of the past (the engine's events for a response the trainer has already
            # acted on, or a trainer hint overtaken by the engine). Applying it would move the trajectory backwards.
            return self._count(event, state, _O_DUPLICATE)
        if kind in _IMPLIED_BY_REQUEST and state in ENGINE_STATES:
            # The engine's request_arrived already implied this hint (the trainer's and the engine's channels race):
            # a late copy of something that happened, not a protocol error.
            return self._count(event, state, _O_DUPLICATE)
        if state not in sources:
            return self._count(event, state, _O_INVALID_TRANSITION)
        if target is None:
            self._finish(traj, event, ts)
        else:
            self._enter(traj, target, event, ts, state)
            traj.stamped = sent_ts is not None
        self.counts[_O_APPLIED] += 1
        return _O_APPLIED

    def _count(self, event: LifecycleEvent, state: TrajState | None, outcome: Outcome) -> Outcome:
        self.counts[outcome] += 1
        if outcome is not _O_APPLIED and outcome is not _O_DUPLICATE:
            self.recent_rejections.append(
                Rejection(event.trajectory_id, event.kind.value, state.value if state else None, outcome.value)
            )
        return outcome

    def _create(self, event: LifecycleEvent, ts: float, target: TrajState) -> Trajectory:
        traj = Trajectory(event.trajectory_id, target, ts, event.kind, task=event.task or DEFAULT_TASK)
        traj.created_at = ts
        traj.slot = slot = self.columns.allocate()
        if slot >= len(self._by_slot):
            self._by_slot.extend([None] * (self.columns.capacity - len(self._by_slot)))
        self._by_slot[slot] = traj
        self.columns.task[slot] = self.tasks(traj.task)
        if event.kind is _K_SAMPLED:
            traj.launched_at = ts
            self.columns.launched[slot] = ts
        self._live[traj.trajectory_id] = traj
        self._state_count[target] += 1
        if event.group_id is not None:
            traj.group_id = event.group_id
            gid = self._group_index.get(event.group_id)
            if gid is None:
                gid = self._new_group(event.group_id)
            self.group_live[gid] += 1
            self.columns.group[slot] = gid
            if target is _REWARD:
                self.group_reward[gid] += 1
        for cb in self._cb["on_created"]:
            cb(traj, ts)
        return traj

    def _new_group(self, group_id: str) -> int:
        if self._group_free:
            gid = self._group_free.pop()
        else:
            gid = len(self.group_live)
            self.group_live.append(0)
            self.group_reward.append(0)
        self._group_index[group_id] = gid
        return gid

    def _move(self, traj: Trajectory, target: TrajState, ts: float) -> None:
        state = traj.state
        if state is not target:
            counts = self._state_count
            counts[state] -= 1
            counts[target] += 1
            if traj.group_id is not None and (state is _REWARD or target is _REWARD):
                gid = self.columns.group[traj.slot]
                self.group_reward[gid] += 1 if target is _REWARD else -1
        traj.state = target
        traj.entered_at = ts  # entering an engine state during a pause: the clock restarts at continue (_resume_clocks)
        slot, cols = traj.slot, self.columns
        cols.state[slot] = STATE_CODES[target]
        cols.entered[slot] = ts

    def _enter(self, traj: Trajectory, target: TrajState, event: LifecycleEvent, ts: float, previous) -> None:
        kind, task, turn = event.kind, event.task, event.turn
        cols, slot = self.columns, traj.slot
        if task is not None and task != traj.task:
            traj.task = task
            cols.task[slot] = self.tasks(task)
        if turn is not None:
            traj.turn = turn
            cols.turn[slot] = turn
        # the engine's events first: they are most of the traffic (the kinds exclude each other)
        if kind is _K_REQUEST_ARRIVED:
            self._on_request_arrived(traj, event, ts, previous)
        elif kind is _K_PREFILL_START:
            traj.instance = event.instance
            cols.instance[slot] = self.instances(event.instance)
        elif kind is _K_PREFILL_END:
            for cb in self._cb["on_decode_admission"]:
                cb(traj, ts, traj.prompt_tokens or 0)
        elif kind is _K_DECODE_END:
            self.decode_ends_total += 1
            self._on_decode_end(traj, event, ts, previous)
        elif kind is _K_TOOL_START:
            self._leave_decode(traj, ts, previous, calls_tool=True)
            traj.tool = event.tool
            cols.tool[slot] = self.tools(event.tool or "-")
            traj.tool_started_at = ts
            traj.tool_ended_at = None
            cols.tool_start[slot] = ts
            traj.tool_load = load_bucket(self._state_count[_TOOL])
        elif kind is _K_TOOL_END:
            traj.tool_ended_at = ts
            self._notify_tool(traj, ts)
            if traj.tool_started_at is not None:
                self._phase_done(_P_TOOL, traj, ts - traj.tool_started_at)
        elif kind is _K_REWARD_START:
            self._leave_decode(traj, ts, previous, calls_tool=False)
            self._censor_tool(traj, ts, previous)
        elif kind is _K_SANDBOX_START:
            traj.mode = event.mode
            cols.mode[slot] = _MODE_CODES[event.mode]
            traj.sandbox_started_at = ts
            cols.sandbox[slot] = ts
            traj.startup_load = load_bucket(self._state_count[_SANDBOX_STARTING])
        elif kind is _K_SANDBOX_READY:
            traj.sandbox_ready_at = ts
            if traj.sandbox_started_at is not None:
                self._phase_done(_P_SANDBOX, traj, ts - traj.sandbox_started_at)
        # Non-engine events may carry the trainer's estimate of the next request's prompt length (B.3, B.5: x_k, x_hat_i).
        if event.prompt_tokens is not None and kind is not _K_REQUEST_ARRIVED:
            traj.next_prompt_tokens = event.prompt_tokens
            cols.next_prompt[slot] = event.prompt_tokens
        traj.last_kind = kind
        self._move(traj, target, ts)

    def _on_request_arrived(self, traj: Trajectory, event: LifecycleEvent, ts: float, previous) -> None:
        if previous is not None:  # a trajectory this request creates has no phase to close and no turn to count
            phase = self._phase_done
            if previous in _SANDBOX_STATES and traj.sandbox_started_at is not None:
                for cb in self._cb["on_startup_finished"]:
                    cb(traj.mode or _M_PREWARM, traj.startup_load, ts - traj.sandbox_started_at)
                phase(_P_STARTUP, traj, ts - traj.sandbox_started_at)
                if traj.sandbox_ready_at is not None:
                    phase(_P_READY_WAIT, traj, ts - traj.sandbox_ready_at)
            if not traj.seen_request and traj.launched_at is not None:
                phase(_P_LAUNCH, traj, ts - traj.launched_at)
                # d_hat (B.2) is the delay of a *prewarmed* launch; cold starts would bias it.
                if traj.mode is not _M_COLD:
                    for cb in self._cb["on_launch_finished"]:
                        cb(max(0.0, ts - traj.launched_at))
            if previous is _TOOL:  # tool_end never came: the arrival ends the tool
                self._notify_tool(traj, ts)
            if previous in _AFTER_RESPONSE_STATES and traj.decoded_at is not None:
                if previous is _DECODED:  # the trainer skipped tool_start: the turn continued all the same
                    for cb in self._cb["on_turn_decided"]:
                        cb(traj, True)
                    phase(_P_HANDOFF, traj, ts - traj.decoded_at)
                phase(_P_DECODE_RETURN, traj, ts - traj.decoded_at)
            if traj.tool_started_at is not None and previous in _TOOL_STATES:
                phase(_P_TOOL_RETURN, traj, ts - traj.tool_started_at)
                if traj.tool_ended_at is not None:
                    phase(_P_POST_TOOL, traj, ts - traj.tool_ended_at)
            resent = previous is _INTERRUPTED
            if resent and traj.interrupted_at is not None:
                phase(_P_RESEND, traj, ts - traj.interrupted_at)
            if event.turn is None and traj.seen_request and not resent:
                traj.turn += 1
        cols, slot = self.columns, traj.slot
        cols.turn[slot] = traj.turn
        prior = traj.prompt_tokens
        traj.prompt_tokens = event.prompt_tokens
        traj.next_prompt_tokens = None
        traj.instance = event.instance
        traj.seen_request = True
        traj.decoded_at = traj.tool_started_at = traj.tool_ended_at = traj.interrupted_at = None
        cols.decoded[slot] = cols.tool_start[slot] = -1.0
        cols.prompt[slot] = float(event.prompt_tokens or 0)
        cols.next_prompt[slot] = -1.0
        cols.instance[slot] = self.instances(event.instance)
        for cb in self._cb["on_prefill_arrival"]:
            cb(traj, ts, int(event.prompt_tokens or 0), prior)

    def _on_decode_end(self, traj: Trajectory, event: LifecycleEvent, ts: float, previous) -> None:
        if previous is _DECODE:
            duration = max(0.0, ts - traj.entered_at)
            self._phase_done(_P_DECODE, traj, duration)
            for cb in self._cb["on_decode_finished"]:
                cb(traj, ts, duration, event.output_tokens)
        traj.output_tokens = event.output_tokens
        traj.decoded_at = ts
        self.columns.decoded[traj.slot] = ts

    def _leave_decode(self, traj: Trajectory, ts: float, previous, *, calls_tool: bool) -> None:
        """tool_start / reward_start after a response: the turn's outcome; from DECODE it also ends the decode."""
        if previous is _DECODE:  # the trainer's hint raced the engine's decode_end
            self._phase_done(_P_DECODE, traj, max(0.0, ts - traj.entered_at))
            traj.decoded_at = ts
            self.columns.decoded[traj.slot] = ts
        elif previous in _QUEUED_STATES:  # the engine's whole report of the response is late
            traj.decoded_at = ts
            self.columns.decoded[traj.slot] = ts
        if previous in _RESPONSE_STATES:
            for cb in self._cb["on_turn_decided"]:
                cb(traj, calls_tool)
            # tool_start ends the hand-off; reward_start (the episode ended) is no hand-off and records nothing
            if calls_tool and traj.decoded_at is not None:
                self._phase_done(_P_HANDOFF, traj, ts - traj.decoded_at)
            if not calls_tool:
                traj.decoded_at = None
                self.columns.decoded[traj.slot] = -1.0

    def _censor_tool(self, traj: Trajectory, ts: float, previous) -> None:
        """Leaving a tool without a next request: the tool -> request delays are censored, not completed."""
        if previous in _TOOL_STATES and traj.tool_started_at is not None:
            self._phase_done(_P_TOOL_RETURN, traj, ts - traj.tool_started_at, completed=False)
            if previous is _TOOL:
                self._phase_done(_P_TOOL, traj, ts - traj.tool_started_at, completed=False)
            if traj.decoded_at is not None:
                self._phase_done(_P_DECODE_RETURN, traj, ts - traj.decoded_at, completed=False)
            if traj.tool_ended_at is not None:
                self._phase_done(_P_POST_TOOL, traj, ts - traj.tool_ended_at, completed=False)
            traj.decoded_at = traj.tool_started_at = traj.tool_ended_at = None
            self.columns.decoded[traj.slot] = self.columns.tool_start[traj.slot] = -1.0

    def _phase_done(self, phase: Phase, traj: Trajectory, duration: float, completed: bool = True) -> None:
        if not duration > 0.0:  # max(0.0, duration), NaN included
            duration = 0.0
        ts = self._ts
        for cb in self._on_phase:
            cb(phase, traj, duration, completed, ts)

    def _notify_tool(self, traj: Trajectory, ts: float) -> None:
        if traj.tool_started_at is not None:
            for cb in self._cb["on_tool_finished"]:
                cb(traj, max(0.0, ts - traj.tool_started_at))

    def _censor_open_phase(self, traj: Trajectory, ts: float) -> None:
        """A trajectory that stops (aborted / interrupted) mid-phase: that phase's duration is censored."""
        state = traj.state
        if state is _READY or state is _PREFILL:  # no timed phase runs while a request waits for / is in prefill
            return
        e = max(0.0, ts - traj.entered_at)
        if state is _DECODE:
            self._phase_done(_P_DECODE, traj, e, completed=False)
        elif state is _SAMPLED:
            self._phase_done(_P_LAUNCH, traj, e, completed=False)
        elif state in _SANDBOX_STATES and traj.sandbox_started_at is not None:
            self._phase_done(_P_STARTUP, traj, ts - traj.sandbox_started_at, completed=False)
            if state is _SANDBOX_STARTING:
                self._phase_done(_P_SANDBOX, traj, e, completed=False)
            if traj.launched_at is not None:
                self._phase_done(_P_LAUNCH, traj, ts - traj.launched_at, completed=False)
        elif state in _TOOL_STATES:
            self._censor_tool(traj, ts, state)
        elif state is _DECODED and traj.decoded_at is not None:
            self._phase_done(_P_DECODE_RETURN, traj, e, completed=False)
            self._phase_done(_P_HANDOFF, traj, e, completed=False)
        elif state is _INTERRUPTED:
            self._phase_done(_P_RESEND, traj, e, completed=False)

    def _finish(self, traj: Trajectory, event: LifecycleEvent, ts: float) -> None:
        if traj.state is _REWARD:
            duration = max(0.0, ts - traj.entered_at)
            if event.kind is _K_REWARD_END:
                for cb in self._cb["on_reward_finished"]:
                    cb(traj.task, duration, event.accepted)
            else:  # an abort during reward is a censored reward duration, not a completed one
                for cb in self._cb["on_reward_aborted"]:
                    cb(traj.task, duration)
            self._phase_done(_P_REWARD, traj, duration, completed=event.kind is _K_REWARD_END)
        else:
            self._censor_open_phase(traj, ts)
        del self._live[traj.trajectory_id]
        self._state_count[traj.state] -= 1
        slot = traj.slot
        if traj.group_id is not None:
            gid = self.columns.group[slot]
            if traj.state is _REWARD:
                self.group_reward[gid] -= 1
            self.group_live[gid] -= 1
            if self.group_live[gid] <= 0:
                del self._group_index[traj.group_id]
                self.group_live[gid] = self.group_reward[gid] = 0
                self._group_free.append(gid)
        self.columns.release(slot)
        self._by_slot[slot] = None
        old = self._finished_ring[self._finished_pos]
        if old is not None:
            self._finished.discard(old)
        self._finished_ring[self._finished_pos] = traj.trajectory_id
        self._finished_pos = (self._finished_pos + 1) % len(self._finished_ring)
        self._finished.add(traj.trajectory_id)
        self.finished_total += 1
        for cb in self._cb["on_finished"]:
            cb(traj, ts, len(self._live))

    # ----- engine-wide events (issue 13) -----
    def _apply_global(self, event: LifecycleEvent, ts: float) -> Outcome:
        kind = event.kind
        if kind is _K_GENERATION_PAUSED:
            if self.paused_since is not None:
                return _O_DUPLICATE
            self.paused_since, self.pause_mode = ts, event.pause_mode or _PM_ABORT
            if self.pause_mode is _PM_ABORT:  # SGLang drops the in-flight requests
                self._interrupt(self._engine_slots(), ts)
            for cb in self._cb["on_paused"]:
                cb(ts, self.pause_mode)
            return _O_APPLIED
        if kind is _K_GENERATION_CONTINUED:
            if self.paused_since is None:
                return _O_DUPLICATE
            start, self.paused_since, self.pause_mode = self.paused_since, None, None
            self._resume_clocks(start, ts)
            for cb in self._cb["on_continued"]:
                cb(ts, max(0.0, ts - start))
            return _O_APPLIED
        if kind is _K_REQUESTS_ABORTED:
            if event.trajectory_ids is None:
                slots = self._engine_slots()
            else:
                trajs = (self._live.get(tid) for tid in event.trajectory_ids)
                slots = [t.slot for t in trajs if t is not None and t.state in ENGINE_STATES]
            self._interrupt(slots, ts)
            return _O_APPLIED
        if kind is _K_WEIGHTS_UPDATED:
            if event.weight_version is not None and event.weight_version == self.weight_version:
                return _O_DUPLICATE
            self.weight_version, self.weights_updated_at = event.weight_version, ts
            for cb in self._cb["on_weights_updated"]:
                cb(ts, event.weight_version)
            return _O_APPLIED
        raise AssertionError(f"unhandled event kind {kind}")  # pragma: no cover - every kind is listed

    def _engine_slots(self) -> list[int]:
        state = self.columns.view("state")
        codes = [STATE_CODES[s] for s in ENGINE_STATES]
        return np.flatnonzero(np.isin(state, codes)).tolist()

    def _interrupt(self, slots: Iterable[int], ts: float) -> None:
        """The engine dropped these trajectories' requests: they wait in INTERRUPTED for the trainer's next move."""
        for slot in slots:
            traj = self._by_slot[slot]
            if traj is None or traj.state not in ENGINE_STATES:
                continue
            if traj.state is _DECODE:
                self._phase_done(_P_DECODE, traj, max(0.0, ts - traj.entered_at), completed=False)
            traj.interrupted_at = ts
            traj.last_kind = _K_REQUESTS_ABORTED
            self._move(traj, _INTERRUPTED, ts)

    def _resume_clocks(self, paused_at: float, ts: float) -> None:
        """After a pause, engine-side states resume where they stopped: their entry times move by the pause."""
        for slot in self._engine_slots():
            traj = self._by_slot[slot]
            assert traj is not None  # an engine state's slot always holds its trajectory
            traj.entered_at += max(0.0, ts - max(traj.entered_at, paused_at))
            self.columns.entered[slot] = traj.entered_at
