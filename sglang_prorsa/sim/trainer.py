"""The RL trainer and the agent environment around the engines: what decides *when* requests arrive (§2, §5.1).

Trajectories come from the synthetic generator (workload/generator.py): each plan fixes turns, output lengths, tools,
sandbox start mode and durations, reward time and acceptance. This module plays them out on the simulated clock and
reports the trainer's lifecycle hints (sampled, sandbox, tool, reward; §4.1.1) to a sink.

Hints are reported eagerly with their own timestamps: when a turn's decode ends, the tool_start and tool_end hints
of the tool that follows go to the sink at once (stamped when they happen), and only the next request's arrival is
scheduled. The adaptive sink orders what it receives by timestamp and hands it to the control plane at each control
tick, so the control plane sees the same event stream as if every hint were its own event; a dropped run's future
hints are discarded there (adaptive.py). Modes without a control plane pay for none of it.

Rollout settings (§2, §3.1):
* synchronous (staleness 0): a step launches ``groups_per_step`` GRPO groups at once; the step's rollout time runs
  until the last of them finishes reward. Training time is not part of the rollout time and is not simulated.
* asynchronous with staleness k: groups are launched while the rollout is at most k versions ahead of training
  (dispatched groups < (version + k + 1) * groups_per_step, the usual off-policy gate); every ``groups_per_step``
  completed groups make one training step and bump the weight version. A trajectory dispatched at version v that is
  still running at version v + k + 1 is dropped. When the new weights reach the engines (at the version bump, or
  ``train_s`` later when training time is modelled) they re-prefill the carried-over contexts (§3.1, "trajectories
  carried over ... must re-prefill"): the cluster does that.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from sglang_prorsa.policy.lifecycle.events import EventKind, LifecycleEvent
from sglang_prorsa.sim.config import RolloutConfig
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.workload.generator import TrajectoryPlan, WorkloadGenerator
from sglang_prorsa.workload.presets import TaskProfile

HINT_DELAY_S = 0.02  # decode end -> the trainer's tool_start / reward_start hint (as workload/simulator.py)
# Plans are pure functions of (task, seed, index, group): a sweep runs the same workload under many cluster
# configurations, so each process keeps the plans it drew (bounded; cleared whole when full).
_PLAN_CACHE: dict[tuple, TrajectoryPlan] = {}
PLAN_CACHE_SIZE = 50_000
Sink = Callable[[LifecycleEvent], None]  # None: no control plane listens, hints are not even built


class Engines(Protocol):
    """What the trainer needs from the cluster."""

    def submit(self, run: TrajectoryRun, t: float) -> None: ...  # the run's next request joins the engines

    def weight_update(self, t: float) -> None: ...  # new version: carried-over contexts are re-prefilled

    def abort(self, run: TrajectoryRun, t: float) -> None: ...  # a dropped run's request leaves the engines


@dataclass(slots=True, eq=False)
class TrajectoryRun:
    plan: TrajectoryPlan
    version: int  # weight version when dispatched
    launched_at: float
    turn: int = 0
    finished_at: float | None = None
    dropped: bool = False
    request: object | None = None  # the engine request in flight, if any (cluster.py)
    _prompts: tuple[int, ...] = ()
    home: tuple | None = None  # (instance, rank) whose prefix cache last took this trajectory's context

    def prompt_tokens_at(self, turn: int) -> int:
        """The plan's prompt length of request ``turn``, from prefix sums computed once (the plan's own method is
        O(turns) per call)."""
        if not self._prompts:
            added = self.plan.turns.added_tokens()[:-1]  # the last turn's output starts no request
            self._prompts = tuple(itertools.accumulate(added, initial=self.plan.first_prompt_tokens))
        return self._prompts[turn]

    @property
    def live(self) -> bool:
        return self.finished_at is None and not self.dropped

    @property
    def environment_s(self) -> float:
        """Seconds of a finished run spent outside the engines, as this module plays the plan: dispatch, sandbox
        start and first request, each tool call with its hint delay and agent overhead, the reward. Fixed by the plan
        (the workload's inputs), whatever the cluster; the rest of the completion time is the engines' (queues,
        prefill, transfer, decode)."""
        p = self.plan
        total = p.dispatch_s if p.sandbox_mode is None else p.dispatch_s + p.startup_s + p.first_request_s
        for turn in p.turns:  # on_decoded: a turn without a tool call goes to reward and ends the run
            if turn.tool is None:
                return total + HINT_DELAY_S + p.reward_s
            total += HINT_DELAY_S + turn.tool_s + turn.agent_overhead_s
        return total  # not reached by a plan the generator draws (its last turn has no tool)

    def event(self, kind: EventKind, t: float, **fields) -> LifecycleEvent:
        p = self.plan
        return LifecycleEvent(p.trajectory_id, kind, ts=t, group_id=p.group_id, task=p.task, **fields)


def clear_plan_cache() -> None:
    """Forget cached plans (speed measurements start cold)."""
    _PLAN_CACHE.clear()


def _plan(generator: WorkloadGenerator, index: int, group_id: str) -> TrajectoryPlan:
    key = (generator.task.name, generator.task, generator.seed, index, group_id)
    plan = _PLAN_CACHE.get(key)
    if plan is None:
        if len(_PLAN_CACHE) >= PLAN_CACHE_SIZE:
            _PLAN_CACHE.clear()
        plan = _PLAN_CACHE[key] = generator.plan(index, group_id)
    return plan


class Trainer:
    def __init__(self, rollout: RolloutConfig, tasks: TaskProfile | list[TaskProfile], events: EventQueue,
                 sink: Sink | None) -> None:
        self.rollout, self.events, self.sink = rollout, events, sink
        self.engines: Engines | None = None  # set by the cluster before start()
        tasks = tasks if isinstance(tasks, list) else [tasks]
        self.generators = [WorkloadGenerator(task, rollout.seed) for task in tasks]
        self.version = 0
        self.runs: list[TrajectoryRun] = []
        self.live: dict[str, TrajectoryRun] = {}
        self._group_left: dict[str, int] = {}
        self._dispatched_groups = 0
        self._completed_groups = 0
        self._step_started = 0.0
        self.step_times: list[tuple[float, float]] = []  # (start, end) of each training step's rollout
        self.dropped = 0
        self.on_step_end: Callable[[float], None] | None = None  # the runner's hook (switch accounting)
        self.pending_updates: list[float] = []  # times new weights will reach the engines (train_s > 0)

    def _hint(self, run: TrajectoryRun, kind: EventKind, t: float, **fields) -> None:
        if self.sink is not None:
            self.sink(run.event(kind, t, **fields))

    @property
    def finished(self) -> bool:
        return len(self.step_times) >= self.rollout.steps

    # ----- dispatch -----
    def start(self, t: float) -> None:
        self._step_started = t
        self._dispatch(t)

    def _dispatch(self, t: float) -> None:
        r = self.rollout
        if r.synchronous:
            for _ in range(r.groups_per_step):
                self._launch_group(t)
            return
        while self._dispatched_groups < (self.version + r.staleness + 1) * r.groups_per_step:
            self._launch_group(t)

    def _launch_group(self, t: float) -> None:
        k = self._dispatched_groups
        gid = f"g{k}"
        self._dispatched_groups += 1
        self._group_left[gid] = self.rollout.group_size
        generator = self.generators[k % len(self.generators)]
        first = len(self.runs)
        plans = [_plan(generator, first + m, gid) for m in range(self.rollout.group_size)]
        if self.rollout.scale is not None:  # a small deployment's run of the preset (workload/scaling.py)
            plans = self.rollout.scale.apply_group(plans)
        for plan in plans:
            run = TrajectoryRun(plan, self.version, t)
            self.runs.append(run)
            self.live[run.plan.trajectory_id] = run
            self._launch(run, t)

    def _launch(self, run: TrajectoryRun, t: float) -> None:
        plan = run.plan
        self._hint(run, EventKind.SAMPLED, t, prompt_tokens=plan.first_prompt_tokens)
        if plan.sandbox_mode is None:
            self.events.at(t + plan.dispatch_s, partial(self._arrive, run))
            return
        t1 = t + plan.dispatch_s
        t2 = t1 + plan.startup_s
        self._hint(run, EventKind.SANDBOX_START, t1, mode=plan.sandbox_mode, prompt_tokens=plan.first_prompt_tokens)
        self._hint(run, EventKind.SANDBOX_READY, t2)
        self.events.at(t2 + plan.first_request_s, partial(self._arrive, run))

    # ----- environment -----
    def _arrive(self, run: TrajectoryRun, t: float) -> None:
        if run.live:
            self.engines.submit(run, t)

    def on_decoded(self, run: TrajectoryRun, t: float) -> None:
        """The engine finished turn ``run.turn``: a tool call follows, or the reward."""
        if not run.live:
            return
        step = run.plan.turns[run.turn]
        t_hint = t + HINT_DELAY_S
        if step.tool is None:
            self._hint(run, EventKind.REWARD_START, t_hint)
            self.events.at(t_hint + run.plan.reward_s, partial(self._reward_end, run))
            return
        t_end = t_hint + step.tool_s
        if self.sink is not None:  # checked here too: the hot path of every mode
            self._hint(run, EventKind.TOOL_START, t_hint, tool=step.tool, turn=run.turn)
            self._hint(run, EventKind.TOOL_END, t_end)
        self.events.at(t_end + step.agent_overhead_s, partial(self._next_turn, run))

    def _next_turn(self, run: TrajectoryRun, t: float) -> None:
        if run.live:
            run.turn += 1
            self.engines.submit(run, t)

    def _reward_end(self, run: TrajectoryRun, t: float) -> None:
        if run.live:
            self._hint(run, EventKind.REWARD_END, t, accepted=run.plan.accepted)
            run.finished_at = t
            self._terminal(run, t)

    # ----- steps and versions -----
    def _terminal(self, run: TrajectoryRun, t: float) -> None:
        self.live.pop(run.plan.trajectory_id, None)
        gid = run.plan.group_id
        self._group_left[gid] -= 1
        if self._group_left[gid] > 0:
            return
        del self._group_left[gid]
        self._completed_groups += 1
        r = self.rollout
        # Scheduled, not called: a drop inside _end_step may complete a group, and steps must not nest.
        if r.synchronous:
            if not self._group_left:
                self.events.at(t, self._end_step)
        elif self._completed_groups % r.groups_per_step == 0:
            self.events.at(t, self._end_step)

    def _end_step(self, t: float) -> None:
        self.step_times.append((self._step_started, t))
        if self.on_step_end is not None:
            self.on_step_end(t)
        self._step_started = t
        self.version += 1
        if self.finished:
            self.events.stop()
            return
        if not self.rollout.synchronous:
            self._drop_stale(t)
            if self.rollout.train_s > 0:  # the engines keep the old weights while the batch trains
                self.pending_updates.append(t + self.rollout.train_s)
                self.events.at(t + self.rollout.train_s, self._push_weights)
            else:
                self.engines.weight_update(t)  # carried-over contexts are re-prefilled with the new weights
        self._dispatch(t)

    def _push_weights(self, t: float) -> None:
        self.pending_updates.pop(0)
        self.engines.weight_update(t)

    def next_weight_update(self) -> float | None:
        """When the next new weights reach the engines (the trainer knows: training started at the batch's end)."""
        return self.pending_updates[0] if self.pending_updates else None

    def _drop_stale(self, t: float) -> None:
        for run in [r for r in self.live.values() if r.version + self.rollout.staleness < self.version]:
            run.dropped = True
            self.dropped += 1
            self._hint(run, EventKind.ABORTED, t)
            self.engines.abort(run, t)
            self._terminal(run, t)
