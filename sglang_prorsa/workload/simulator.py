"""Discrete-event rollout simulation: trajectory plans run against a simple engine and a simulated trainer, producing
the lifecycle event stream (trainer hints and engine transitions) that a real deployment would report.

Engine model: each prefill instance serves its requests one at a time in arrival order (requests are routed on arrival
to the instance that frees up first, as a least-loaded router would); service time = profiled g(x) times log-normal
noise; decode takes output_tokens * TPOT (with noise) and is not capacity-limited unless the engine model bounds the
decode KV cache (``EngineModel.decode_kv_tokens``): then a finished prefill waits, in completion order, until its
prompt and whole output fit beside the requests decoding, and ``prefill_end`` (the decode admission) is reported when
it is admitted. Trainer model:

* ``sync``: a step launches ``groups * group_size`` samples at once; when every one has finished reward, training
  takes ``train_gap_s`` and the next step launches; ``weights_updated_before_s`` before that launch the trainer
  reports ``weights_updated`` (the step boundary a real trainer's weight sync marks; issue 13).
* ``async``: ``groups`` groups launch at t = 0; then the injection policy decides: ``group`` launches a new group when
  all members of a group finished reward, ``replace_on_reward`` launches one sample per *admitted* reward completion
  (the paper's f(n) = n on N_pass), ``fixed_rate`` launches at a constant rate.

Events come out in timestamp order (ties in scheduling order), each with ``ts`` set.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import random
from typing import Callable, Iterator

from sglang_prorsa.policy.forecast.sampler import InjectionPolicy
from sglang_prorsa.policy.lifecycle.events import EventKind, LifecycleEvent
from sglang_prorsa.workload.generator import TrajectoryPlan, WorkloadGenerator
from sglang_prorsa.workload.presets import WorkloadSpec

HINT_DELAY_S = 0.02  # decode end -> the trainer's tool_start / reward_start hint


class RolloutSimulator:
    def __init__(self, spec: WorkloadSpec, seed: int, duration_s: float) -> None:
        self.spec = spec
        self.duration_s = float(duration_s)
        self.generator = WorkloadGenerator(spec.task, seed)
        self._noise = random.Random(f"{seed}/engine")
        self._heap: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self._out: list[LifecycleEvent] = []
        self._next_index = 0
        self._next_group = 0
        self._free_at = [0.0] * spec.engine.prefill_instances
        self._g = spec.engine.profile()
        self._group_left: dict[str, int] = {}
        self._step_left = 0
        self._version = 0
        self.launched = 0
        # bounded decode KV (engine.decode_kv_tokens): tokens held by decoding requests, finished prefills waiting
        self._kv_used = 0.0
        self._kv_waiting: collections.deque = collections.deque()
        self.kv_waits = 0  # prefills that had to wait for decode KV

    # ----- public -----
    def events(self) -> Iterator[LifecycleEvent]:
        """Run to ``duration_s`` and yield events as the simulation produces them (time order)."""
        self._start()
        while self._heap:
            t, _, action = heapq.heappop(self._heap)
            if t > self.duration_s:
                break
            action(t)
            yield from self._out
            self._out.clear()

    # ----- scheduling helpers -----
    def _at(self, t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), action))

    def _emit(self, t: float, plan: TrajectoryPlan, kind: EventKind, **fields) -> None:
        self._out.append(LifecycleEvent(plan.trajectory_id, kind, ts=t, group_id=plan.group_id, task=plan.task, **fields))

    def _jitter(self, sigma: float) -> float:
        return math.exp(sigma * self._noise.gauss(0.0, 1.0)) if sigma > 0 else 1.0

    # ----- trainer -----
    def _start(self) -> None:
        rollout = self.spec.rollout
        if rollout.mode == "sync":
            self._at(0.0, self._launch_step)
            return
        for _ in range(rollout.groups):
            self._at(0.0, lambda t: self._launch_group(t, rollout.group_size))
        if rollout.injection.policy is InjectionPolicy.FIXED_RATE:
            self._at(1.0 / rollout.injection.rate_per_s, self._fixed_rate_tick)

    def _weights_updated(self, t: float) -> None:
        self._version += 1
        self._out.append(LifecycleEvent("", EventKind.WEIGHTS_UPDATED, ts=t, weight_version=str(self._version)))

    def _launch_step(self, t: float) -> None:
        self._step_left = self.spec.rollout.concurrency
        for _ in range(self.spec.rollout.groups):
            self._launch_group(t, self.spec.rollout.group_size)

    def _launch_group(self, t: float, size: int) -> None:
        gid = f"g{self._next_group}"
        self._next_group += 1
        self._group_left[gid] = size
        for _ in range(size):
            self._launch(t, gid)

    def _fixed_rate_tick(self, t: float) -> None:
        self._launch(t, None)
        self._at(t + 1.0 / self.spec.rollout.injection.rate_per_s, self._fixed_rate_tick)

    def _launch(self, t: float, group_id: str | None) -> None:
        plan = self.generator.plan(self._next_index, group_id)
        self._next_index += 1
        self.launched += 1
        self._emit(t, plan, EventKind.SAMPLED, prompt_tokens=plan.first_prompt_tokens)
        if plan.sandbox_mode is None:
            self._at(t + plan.dispatch_s, lambda t2: self._arrive(t2, plan, 0))
            return

        def sandbox_start(t1: float) -> None:
            self._emit(t1, plan, EventKind.SANDBOX_START, mode=plan.sandbox_mode, prompt_tokens=plan.first_prompt_tokens)
            self._at(t1 + plan.startup_s, sandbox_ready)

        def sandbox_ready(t2: float) -> None:
            self._emit(t2, plan, EventKind.SANDBOX_READY)
            self._at(t2 + plan.first_request_s, lambda t3: self._arrive(t3, plan, 0))

        self._at(t + plan.dispatch_s, sandbox_start)

    def _reward_done(self, t: float, plan: TrajectoryPlan) -> None:
        self._emit(t, plan, EventKind.REWARD_END, accepted=plan.accepted)
        rollout = self.spec.rollout
        if rollout.mode == "sync":
            self._step_left -= 1
            if self._step_left == 0:
                self._at(t + rollout.train_gap_s, self._launch_step)
                before = rollout.weights_updated_before_s
                if before is not None:
                    self._at(t + max(0.0, rollout.train_gap_s - before), self._weights_updated)
            return
        policy = rollout.injection.policy
        if policy is InjectionPolicy.REPLACE_ON_REWARD and plan.accepted:
            self._launch(t, None)
        elif policy is InjectionPolicy.GROUP and plan.group_id is not None:
            self._group_left[plan.group_id] -= 1
            if self._group_left[plan.group_id] == 0:
                del self._group_left[plan.group_id]
                self._launch_group(t, rollout.injection.group_size)

    # ----- engine and environment -----
    def _arrive(self, t: float, plan: TrajectoryPlan, turn: int) -> None:
        engine = self.spec.engine
        x = plan.prompt_tokens_at(turn)
        m = min(range(len(self._free_at)), key=self._free_at.__getitem__)
        start = max(t, self._free_at[m])
        finish = start + self._g(x) * self._jitter(engine.prefill_noise_sigma)
        self._free_at[m] = finish
        self._emit(t, plan, EventKind.REQUEST_ARRIVED, prompt_tokens=x, instance=str(m), turn=turn)
        self._at(start, lambda t1: self._emit(t1, plan, EventKind.PREFILL_START, instance=str(m)))
        step = plan.turns[turn]
        decode_s = step.output_tokens * engine.decode_s_per_token * self._jitter(engine.decode_noise_sigma)
        if engine.decode_kv_tokens is not None:
            need = float(x + step.output_tokens)
            self._at(finish, lambda t2: self._prefilled(t2, plan, turn, str(m), need, decode_s))
            return
        self._at(finish, lambda t2: self._emit(t2, plan, EventKind.PREFILL_END, instance=str(m)))
        self._at(finish + decode_s, lambda t3: self._decoded(t3, plan, turn))

    # ----- bounded decode KV -----
    def _prefilled(self, t: float, plan: TrajectoryPlan, turn: int, instance: str, need: float,
                   decode_s: float) -> None:
        if self._kv_waiting or (self._kv_used > 0 and self._kv_used + need > self.spec.engine.decode_kv_tokens):
            self.kv_waits += 1
        self._kv_waiting.append((plan, turn, instance, need, decode_s))
        self._admit(t)

    def _admit(self, t: float) -> None:
        """Admit waiting prefills in completion order while they fit (a request larger than the cache alone)."""
        capacity = self.spec.engine.decode_kv_tokens
        while self._kv_waiting:
            plan, turn, instance, need, decode_s = self._kv_waiting[0]
            if self._kv_used > 0 and self._kv_used + need > capacity:
                return
            self._kv_waiting.popleft()
            self._kv_used += need
            self._emit(t, plan, EventKind.PREFILL_END, instance=instance)
            self._at(t + decode_s, lambda t3, plan=plan, turn=turn, need=need: self._kv_decoded(t3, plan, turn, need))

    def _kv_decoded(self, t: float, plan: TrajectoryPlan, turn: int, need: float) -> None:
        self._kv_used = max(0.0, self._kv_used - need)
        self._decoded(t, plan, turn)
        self._admit(t)

    def _decoded(self, t: float, plan: TrajectoryPlan, turn: int) -> None:
        self._emit(t, plan, EventKind.DECODE_END)
        step = plan.turns[turn]
        if step.tool is None:
            self._at(t + HINT_DELAY_S, lambda t1: self._emit(t1, plan, EventKind.REWARD_START))
            self._at(t + HINT_DELAY_S + plan.reward_s, lambda t2: self._reward_done(t2, plan))
            return
        t_tool = t + HINT_DELAY_S
        self._at(t_tool, lambda t1: self._emit(t1, plan, EventKind.TOOL_START, tool=step.tool, turn=turn))
        self._at(t_tool + step.tool_s, lambda t2: self._emit(t2, plan, EventKind.TOOL_END))
        self._at(t_tool + step.tool_s + step.agent_overhead_s, lambda t3: self._arrive(t3, plan, turn + 1))
