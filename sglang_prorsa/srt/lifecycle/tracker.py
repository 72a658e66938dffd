"""The trajectory tracker: the state machine of §4.1.1 over every live trajectory.

Guarantees (issue 3):
* O(1) per event: dict look-ups and per-state index updates, no scans.
* A duplicate (the event that put the trajectory in its current state, sent again) is a counted no-op.
* An out-of-order or invalid transition is counted, kept in a short report and ignored: it never raises and never
  touches another trajectory.
* A finished trajectory (``reward_end`` / ``aborted``) leaves the live set; only its id stays in a bounded LRU so a
  resent terminal event is still recognised as a duplicate. Memory is bounded by the live set, not the history.
* Durations of completed phases go to the observers (the predictor's statistics and the accuracy tracker).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from sglang_prorsa.srt.lifecycle.events import EventKind, LifecycleEvent, SandboxMode
from sglang_prorsa.srt.lifecycle.states import DEFAULT_TASK, TRANSITIONS, Trajectory, TrajState, load_bucket

FINISHED_IDS_REMEMBERED = 65_536
REJECTIONS_REPORTED = 64


class Outcome(str, Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    INVALID_TRANSITION = "invalid_transition"
    UNKNOWN_TRAJECTORY = "unknown_trajectory"
    AFTER_FINISH = "after_finish"


@dataclass(frozen=True, slots=True)
class Rejection:
    trajectory_id: str
    event: str
    state: str | None
    reason: str


class TrackerObserver:
    """Callbacks for completed phases and realised arrivals. Subclasses override what they need."""

    def on_prefill_arrival(self, traj: Trajectory, ts: float, prompt_tokens: int, previous_tokens: int | None) -> None: ...

    def on_decode_admission(self, traj: Trajectory, ts: float, prompt_tokens: int) -> None: ...

    def on_startup_finished(self, mode: SandboxMode, load: int, duration: float) -> None: ...

    def on_launch_finished(self, duration: float) -> None: ...

    def on_tool_finished(self, traj: Trajectory, duration: float) -> None: ...

    def on_reward_finished(self, task: str, duration: float, accepted: bool | None) -> None: ...

    def on_reward_aborted(self, task: str, duration: float) -> None: ...


class TrajectoryTracker:
    def __init__(self, observers: Iterable[TrackerObserver] = ()) -> None:
        self._observers: list[TrackerObserver] = list(observers)
        self._live: dict[str, Trajectory] = {}
        # Per-state index: the predictor walks only the states it needs (insertion order = arrival order for READY).
        self._by_state: dict[TrajState, dict[str, Trajectory]] = {s: {} for s in TrajState}
        self._finished: OrderedDict[str, None] = OrderedDict()
        # GRPO bookkeeping for the group injection rule (B.2): live members and members in reward, per group.
        self._group_live: dict[str, int] = {}
        self._group_reward: dict[str, int] = {}
        self.counts: dict[Outcome, int] = {o: 0 for o in Outcome}
        self.finished_total = 0
        self.recent_rejections: deque[Rejection] = deque(maxlen=REJECTIONS_REPORTED)

    def add_observer(self, observer: TrackerObserver) -> None:
        self._observers.append(observer)

    # ----- views for the predictor -----
    def in_state(self, state: TrajState) -> dict[str, Trajectory]:
        """Live trajectories in ``state`` (read-only by convention; READY iterates in arrival order)."""
        return self._by_state[state]

    def get(self, trajectory_id: str) -> Trajectory | None:
        return self._live.get(trajectory_id)

    def group_waiting_outside_reward(self, group_id: str) -> bool:
        """True while some live member of the group has not reached reward (so the group cannot complete)."""
        return self._group_live.get(group_id, 0) > self._group_reward.get(group_id, 0)

    @property
    def live_count(self) -> int:
        return len(self._live)

    @property
    def rejected_count(self) -> int:
        return (
            self.counts[Outcome.INVALID_TRANSITION]
            + self.counts[Outcome.UNKNOWN_TRAJECTORY]
            + self.counts[Outcome.AFTER_FINISH]
        )

    def state_counts(self) -> dict[str, int]:
        return {s.value: len(d) for s, d in self._by_state.items()}

    # ----- the state machine -----
    def apply(self, event: LifecycleEvent) -> Outcome:
        """Apply one stamped event (``event.ts`` set). Never raises on protocol errors; returns what happened."""
        ts = float(event.ts)  # type: ignore[arg-type]  # the control plane stamps every event before this
        sources, target = TRANSITIONS[event.kind]
        traj = self._live.get(event.trajectory_id)
        if traj is None:
            if event.trajectory_id in self._finished:
                terminal = event.kind in (EventKind.REWARD_END, EventKind.ABORTED)
                return self._count(event, None, Outcome.DUPLICATE if terminal else Outcome.AFTER_FINISH)
            if None not in sources:
                return self._count(event, None, Outcome.UNKNOWN_TRAJECTORY)
            traj = self._create(event, ts, target)
            self._enter(traj, target, event, ts, previous=None)
            return self._count(event, None, Outcome.APPLIED)
        if traj.state is target and traj.last_kind is event.kind:
            return self._count(event, traj.state, Outcome.DUPLICATE)
        if traj.state not in sources:
            return self._count(event, traj.state, Outcome.INVALID_TRANSITION)
        previous = traj.state
        if target is None:
            self._finish(traj, event, ts)
        else:
            self._enter(traj, target, event, ts, previous)
        return self._count(event, previous, Outcome.APPLIED)

    def _count(self, event: LifecycleEvent, state: TrajState | None, outcome: Outcome) -> Outcome:
        self.counts[outcome] += 1
        if outcome not in (Outcome.APPLIED, Outcome.DUPLICATE):
            self.recent_rejections.append(
                Rejection(event.trajectory_id, event.kind.value, state.value if state else None, outcome.value)
            )
        return outcome

    def _create(self, event: LifecycleEvent, ts: float, target: TrajState) -> Trajectory:
        traj = Trajectory(event.trajectory_id, target, ts, event.kind, task=event.task or DEFAULT_TASK)
        traj.group_id = event.group_id
        if event.kind is EventKind.SAMPLED:
            traj.launched_at = ts
        self._live[traj.trajectory_id] = traj
        self._by_state[target][traj.trajectory_id] = traj
        if traj.group_id is not None:
            self._group_live[traj.group_id] = self._group_live.get(traj.group_id, 0) + 1
            if target is TrajState.REWARD:
                self._group_reward[traj.group_id] = self._group_reward.get(traj.group_id, 0) + 1
        return traj

    def _move(self, traj: Trajectory, target: TrajState, ts: float) -> None:
        if traj.state is not target:
            del self._by_state[traj.state][traj.trajectory_id]
            self._by_state[target][traj.trajectory_id] = traj
            if traj.group_id is not None and TrajState.REWARD in (traj.state, target):
                delta = 1 if target is TrajState.REWARD else -1
                self._group_reward[traj.group_id] = self._group_reward.get(traj.group_id, 0) + delta
        traj.state = target
        traj.entered_at = ts

    def _enter(self, traj: Trajectory, target: TrajState, event: LifecycleEvent, ts: float, previous) -> None:
        kind = event.kind
        if event.task is not None:
            traj.task = event.task
        if event.turn is not None:
            traj.turn = event.turn
        if kind is EventKind.SANDBOX_START:
            traj.mode = event.mode
            traj.sandbox_started_at = ts
            traj.startup_load = load_bucket(self._others_in(TrajState.SANDBOX_STARTING, traj))
        elif kind is EventKind.REQUEST_ARRIVED:
            self._on_request_arrived(traj, event, ts, previous)
        elif kind is EventKind.PREFILL_START:
            traj.instance = event.instance
        elif kind is EventKind.PREFILL_END:
            self._notify_decode_admission(traj, ts)
        elif kind is EventKind.TOOL_START:
            traj.tool = event.tool
            traj.tool_started_at = ts
            traj.tool_load = load_bucket(self._others_in(TrajState.TOOL, traj))
        elif kind is EventKind.TOOL_END:
            self._notify_tool(traj, ts)
        # Non-engine events may carry the trainer's estimate of the next request's prompt length (B.3, B.5: x_k, x_hat_i).
        if event.prompt_tokens is not None and kind is not EventKind.REQUEST_ARRIVED:
            traj.next_prompt_tokens = event.prompt_tokens
        traj.last_kind = kind
        self._move(traj, target, ts)

    def _others_in(self, state: TrajState, traj: Trajectory) -> int:
        members = self._by_state[state]
        return len(members) - (1 if traj.trajectory_id in members else 0)

    def _on_request_arrived(self, traj: Trajectory, event: LifecycleEvent, ts: float, previous) -> None:
        if previous in (TrajState.SANDBOX_STARTING, TrajState.SANDBOX_READY) and traj.sandbox_started_at is not None:
            for obs in self._observers:
                obs.on_startup_finished(traj.mode or SandboxMode.PREWARM, traj.startup_load, ts - traj.sandbox_started_at)
        # d_hat (B.2) is the delay of a *prewarmed* launch; cold starts would bias it.
        if not traj.seen_request and traj.launched_at is not None and traj.mode is not SandboxMode.COLD:
            for obs in self._observers:
                obs.on_launch_finished(max(0.0, ts - traj.launched_at))
        if previous is TrajState.TOOL:  # tool_end never came: the arrival ends the tool
            self._notify_tool(traj, ts)
        if event.turn is None and traj.seen_request:
            traj.turn += 1
        prior = traj.prompt_tokens
        traj.prompt_tokens = event.prompt_tokens
        traj.next_prompt_tokens = None
        traj.instance = event.instance
        traj.seen_request = True
        for obs in self._observers:
            obs.on_prefill_arrival(traj, ts, int(event.prompt_tokens or 0), prior)

    def _notify_decode_admission(self, traj: Trajectory, ts: float) -> None:
        for obs in self._observers:
            obs.on_decode_admission(traj, ts, traj.prompt_tokens or 0)

    def _notify_tool(self, traj: Trajectory, ts: float) -> None:
        if traj.tool_started_at is not None:
            for obs in self._observers:
                obs.on_tool_finished(traj, max(0.0, ts - traj.tool_started_at))

    def _finish(self, traj: Trajectory, event: LifecycleEvent, ts: float) -> None:
        if traj.state is TrajState.REWARD:
            duration = max(0.0, ts - traj.entered_at)
            for obs in self._observers:
                if event.kind is EventKind.REWARD_END:
                    obs.on_reward_finished(traj.task, duration, event.accepted)
                else:  # an abort during reward is a censored reward duration, not a completed one
                    obs.on_reward_aborted(traj.task, duration)
        del self._live[traj.trajectory_id]
        del self._by_state[traj.state][traj.trajectory_id]
        if traj.group_id is not None:
            gid = traj.group_id
            if traj.state is TrajState.REWARD:
                self._group_reward[gid] -= 1
            self._group_live[gid] -= 1
            if self._group_live[gid] <= 0:
                self._group_live.pop(gid, None)
                self._group_reward.pop(gid, None)
        self._finished[traj.trajectory_id] = None
        if len(self._finished) > FINISHED_IDS_REMEMBERED:
            self._finished.popitem(last=False)
        self.finished_total += 1
