"""Adaptive PD: our real control plane, unmodified, on the simulator's ``ManualClock`` (§4, Appendix B, C).

Calls, in the order a deployment makes them:
* trainer hints and engine transitions (request arrived + prefill started at dispatch, as the adaptive front reports
  them; prefill finished; decode finished) -> ``LifecycleControlPlane.ingest(events)``. They are buffered by
  timestamp and ingested in order at each control tick, so hints the trainer stamps ahead of time (trainer.py) reach
  the tracker exactly when they happen; a dropped run's future hints are discarded;
* prefill busy intervals of each prefill instance -> ``RoleSwitchController.observe(ThetaSample)`` (θ model);
* every S seconds: ``cp.tick()`` (refresh + accuracy window), the forecast, instance reports, then
  ``RoleSwitchController.tick(ControlInputs(Ŵ^P, K̂^D, ...), reports)``; each planned switch is executed by the
  cluster (Appendix C). (An extra tick at each weight update made more switches and no faster steps: the burst of
  re-prefill is better met by the next scheduled tick, with its backlog counted once.)
* known bursts: when training time is modelled (``RolloutConfig.train_s``) the trainer knows when new weights will
  reach the engines; the driver announces the re-prefill they will cause (every context in decode or waiting for
  it) as ``ControlInputs.burst_prefill_tokens`` arriving ``burst_in_s`` from now.

g(x) for the predictor (B.7) is built here, not in the predictor: the time of one request of x full-prompt tokens on a
prefill instance, with the prefix-cache hit a request of that length gets under the cluster's routing (sampled from
the workload's own plans) and the instance's DP ranks working in parallel (x / θ of the instance, not of one rank).

One addition, outside the control plane: the lifecycle state machine has no event for a request that is prefilled a
second time while its trajectory is in decode (re-prefill after an async weight update; §3.1). Those tokens are
real prefill demand the tracker cannot see, so the driver adds the engines' untracked re-prefill backlog to Ŵ^P, as
the cold part of it (no prefix cache survives a weight update). The same requests report no prefill_finished. Each
returns to decode once prefilled, so the same tokens are decode KV still owed (``decode_kv_returning``): without it
a weight update that empties decode read as decode having room to give, and the planner moved a third of the decode
instances to prefill for the burst and back half a minute later (the Qwen3-like coding agent at staleness 2).

A tick reads each instance as of its last event and advances none: where an instance is advanced decides when the
KV its decode steps used becomes visible to decode admission (regime.py), so advancing every instance at every tick
changed the run it observed. With ticks that advanced every instance and a planner that never switched, the Qwen3-like
general agent at staleness 2 (12:20) took 336 s a step against the static run's 301 s (12 seeds; one step of 1,175 s
behind a 140 s decode-admission queue), and adaptive paid that beside static in every cell. An instance's state lags
by at most its current regime: until its first completion or a change of operation.
"""

from __future__ import annotations

import heapq
import itertools
import math

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.accuracy import WindowRecord
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.forecast.profile import PrefillTimeProfile
from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.policy.lifecycle.events import EventKind, LifecycleEvent
from sglang_prorsa.policy.role_switch.allocator import AllocatorConfig
from sglang_prorsa.policy.role_switch.capacity import CapacityConfig, InstanceReport, InstanceStatus, Role
from sglang_prorsa.policy.role_switch.controller import ControlInputs, ControllerConfig, RoleSwitchController
from sglang_prorsa.policy.role_switch.cost import CostConfig
from sglang_prorsa.policy.role_switch.planner import PlannerConfig
from sglang_prorsa.policy.role_switch.review import ReviewConfig
from sglang_prorsa.policy.role_switch.theta import ThetaConfig, ThetaModel, ThetaSample
from sglang_prorsa.policy.role_switch.waits import CompletionRate
from sglang_prorsa.sim.config import ClusterConfig, ModelConfig, RolloutConfig
from sglang_prorsa.sim.perf_model import PROFILE_POINTS, PerfModel
from sglang_prorsa.workload.generator import WorkloadGenerator
from sglang_prorsa.workload.presets import TaskProfile
from sglang_prorsa.workload.scaling import PlanScale

G_PROFILE_PLANS = 200  # plans per task sampled to estimate the prefix-hit ratio by prompt length
MAX_INGEST = 5_000  # events per ingest call (the control plane applies a batch under one lock)


def expected_hit_ratios(tasks: list[TaskProfile], hit_probability: float, seed: int = 0,
                        scale: PlanScale | None = None) -> list[float]:
    """Token-weighted prefix-hit ratio of a PD prefill request, per length in PROFILE_POINTS.

    Turn k > 0 of a trajectory can hit its previous prompt (the prefill instance cached it; the output was decoded
    elsewhere) with probability ``hit_probability`` (1/dp_ranks under SGLang's default rank choice). Lengths are binned
    on the log scale around each profile point; an empty bin takes its nearest non-empty neighbour."""
    edges = [math.sqrt(a * b) for a, b in zip(PROFILE_POINTS, PROFILE_POINTS[1:])]
    tokens, cached = [0.0] * len(PROFILE_POINTS), [0.0] * len(PROFILE_POINTS)
    for task in tasks:
        generator = WorkloadGenerator(task, seed)
        for i in range(G_PROFILE_PLANS):
            plan = generator.plan(i) if scale is None else scale.apply(generator.plan(i))
            x_prev = None
            x = plan.first_prompt_tokens
            for turn in plan.turns:
                b = sum(x > e for e in edges)
                tokens[b] += x
                cached[b] += hit_probability * x_prev if x_prev is not None else 0.0
                x_prev, x = x, x + turn.output_tokens + turn.tool_result_tokens
    ratios = [c / t if t > 0 else None for c, t in zip(cached, tokens)]
    known = [i for i, r in enumerate(ratios) if r is not None]
    return [ratios[i] if ratios[i] is not None else ratios[min(known, key=lambda k: abs(k - i))] if known else 0.0
            for i in range(len(ratios))]


def predictor_profile(perf: PerfModel, hit_ratios: list[float]) -> PrefillTimeProfile:
    """g(x): seconds of instance time for one request of x tokens at the expected hit ratio, ranks in parallel."""
    return PrefillTimeProfile(points=tuple(
        (float(x), perf.prefill_request_s(x, h * x) / perf.ranks) for x, h in zip(PROFILE_POINTS, hit_ratios)))


class ControlPlaneDriver:
    """A ``Lifecycle`` (lifecycle_sink.py) that feeds the control plane, plus the periodic role-switch decision."""

    def __init__(self, cluster: ClusterConfig, model: ModelConfig, rollout: RolloutConfig,
                 tasks: list[TaskProfile]) -> None:
        prefill_shape, decode_shape = cluster.shapes(model)
        perf, decode_perf = PerfModel(model, prefill_shape), PerfModel(model, decode_shape)
        self.clock = ManualClock(0.0)
        self.horizon_s = cluster.horizon_s
        x_new = round(sum(t.first_prompt_tokens.median for t in tasks) / len(tasks))
        if rollout.scale is not None:
            x_new = rollout.scale.prompt_tokens(x_new)
        injection = (InjectionConfig(InjectionPolicy.NONE) if rollout.synchronous
                     else InjectionConfig(InjectionPolicy.GROUP, group_size=rollout.group_size))
        hit_p = 1.0 if cluster.routing == "rank_aware" else 1.0 / perf.ranks
        self.g = predictor_profile(perf, expected_hit_ratios(tasks, hit_p, scale=rollout.scale))
        self.cp = LifecycleControlPlane(self.clock, PredictorConfig(
            horizon_s=cluster.horizon_s, injection=injection, default_prompt_tokens=x_new, prefill_profile=self.g))
        planner = PlannerConfig.unguarded() if cluster.planner == "paper" else PlannerConfig(
            min_dwell_s=cluster.min_dwell_s, hysteresis=cluster.hysteresis, wait_balance=cluster.planner == "waits")
        self.theta = ThetaModel(ThetaConfig.from_profile(perf.cold_profile_points(), reference_prompt_tokens=x_new))
        self._prompt_sum, self._prompts = float(x_new), 1  # mean prompt of arrived requests (x_new until one came)
        self.controller = RoleSwitchController(ControllerConfig(
            horizon_s=cluster.horizon_s,
            allocator=AllocatorConfig(gpus_per_prefill=perf.gpus, gpus_per_decode=decode_perf.gpus),
            planner=planner,
            capacity=CapacityConfig(profiled_decode_kv_capacity=decode_perf.kv_tokens_per_instance),
            # SGLang's default DP balancing lands a trajectory's turns on any rank: each may keep a copy
            cache_copies=1.0 if cluster.routing == "rank_aware" else float(perf.ranks),
            cost=CostConfig(default_switch_s=model.switch_s, kv_bytes_per_token=model.kv_bytes_per_token,
                            kv_move_gbytes_per_s=decode_perf.gpus * model.transfer_gbytes_per_s),
            review=ReviewConfig() if cluster.move_review else None,
        ), self.theta, self.clock)
        self._buffer: list[tuple[float, int, LifecycleEvent]] = []
        self._seq = itertools.count()
        self._aborted: dict[str, float] = {}
        self._last_ingested = -math.inf
        self.anticipate = cluster.anticipate  # announce the re-prefill of the next weight update as a burst
        self.windows: list[WindowRecord] = []
        self.decisions: list[dict] = []
        self.executed: list[dict] = []  # one per switch: time, instance, roles, estimated gain and cost
        self.decode_rate = CompletionRate()  # decode completions per second, for the planner's wait rule

    # ----- Lifecycle: buffered by timestamp -----
    def hint(self, event: LifecycleEvent) -> None:
        if event.kind is EventKind.ABORTED:
            self._aborted[event.trajectory_id] = event.ts
        heapq.heappush(self._buffer, (event.ts, next(self._seq), event))

    def request_arrived(self, run, prompt_tokens: int, instance: str, t: float) -> None:
        self._prompt_sum += prompt_tokens
        self._prompts += 1
        tid = run.plan.trajectory_id
        self.hint(LifecycleEvent(tid, EventKind.REQUEST_ARRIVED, ts=t, prompt_tokens=prompt_tokens, instance=instance))
        self.hint(LifecycleEvent(tid, EventKind.PREFILL_START, ts=t, instance=instance))

    def prefill_finished(self, instance: str, req, t: float) -> None:
        if not req.untracked:
            self.hint(LifecycleEvent(req.owner.plan.trajectory_id, EventKind.PREFILL_END, ts=t, instance=instance))

    def decode_finished(self, run, t: float) -> None:
        self.hint(LifecycleEvent(run.plan.trajectory_id, EventKind.DECODE_END, ts=t))

    def instance_interrupted(self, instance: str) -> None:
        pass  # the instance discards its own open busy interval (instance.evict_all)

    def prefill_interval(self, instance, new_tokens: int, cached_tokens: int, requests: int, seconds: float) -> None:
        self.controller.observe(ThetaSample(instance.iid, new_tokens, cached_tokens, requests, seconds))

    def flush(self, until: float) -> None:
        """Hand every buffered event stamped at or before ``until`` to the control plane, in time order."""
        buffer, batch = self._buffer, []
        while buffer and buffer[0][0] <= until:
            ts, _, event = heapq.heappop(buffer)
            aborted = self._aborted.get(event.trajectory_id)
            if aborted is not None and ts > aborted and event.kind is not EventKind.ABORTED:
                continue  # a hint stamped ahead for a run that was dropped first
            batch.append(event)
            if len(batch) >= MAX_INGEST:
                self._ingest(batch)
                batch = []
        if batch:
            self._ingest(batch)

    def _ingest(self, batch: list[LifecycleEvent]) -> None:
        if batch[-1].ts > self.clock.now():
            self.clock.set(batch[-1].ts)
        self._last_ingested = batch[-1].ts
        self.cp.ingest(batch)

    # ----- every S -----
    def tick(self, t: float, cluster, scheduled: bool = True) -> None:
        """Forecast, Eq. 1, plan; the cluster executes the switches. ``scheduled`` False: an extra tick (weight
        update) on the last forecast with the fresh engine state."""
        # No instance is advanced here: observing must not change the run (see the module docstring).
        self.flush(t)
        if t > self.clock.now():
            self.clock.set(t)
        if scheduled:
            self.cp.tick()
            recent = self.cp.predictor.accuracy.recent
            if recent and (not self.windows or self.windows[-1] is not recent[-1]):
                self.windows.append(recent[-1])
        # The refresh's forecast covers every event ingested before it; events stamped exactly at its time (a step's
        # launch) may have been applied after it, and then a fresh one is needed.
        forecast = self.cp.predictor.latest
        if forecast is None or self._last_ingested >= forecast.t:
            forecast = self.cp.forecast()
        reports = self.reports(cluster)
        self.decode_rate.observe(t, self.cp.tracker.decode_ends_total)
        untracked = cluster.untracked_prefill_tokens()
        requests = forecast.decode_admission_tokens / (self._prompt_sum / self._prompts)  # predicted admissions
        working_set = sum(run.prompt_tokens_at(run.turn) for run in cluster.trainer.live.values())
        update_at = cluster.trainer.next_weight_update() if self.anticipate else None
        burst = float(cluster.reprefill_tokens()) if update_at is not None else 0.0
        decision = self.controller.tick(ControlInputs(
            forecast.prefill_tokens + untracked, forecast.decode_kv_tokens, cold_prefill_tokens=untracked,
            decode_kv_returning=untracked,
            prefill_backlog_tokens=min(forecast.prefill_tokens, forecast.sources.backlog) + untracked,
            decode_requests_forecast=requests, working_set_tokens=working_set, burst_prefill_tokens=burst,
            burst_in_s=max(0.0, update_at - t) if update_at is not None else None,
            decode_completions_per_s=self.decode_rate.per_s(),
            decode_requests_returning=cluster.untracked_prefill_requests(),
            decode_completions_total=self.cp.tracker.decode_ends_total), reports)
        for switch in decision.plan.switches:
            cluster.start_switch(switch.instance_id, switch.dst, t)
            self.executed.append({"t": t, "instance": switch.instance_id, "from": switch.src.value,
                                  "to": switch.dst.value, "gain_gpu_s": switch.gain_gpu_s,
                                  "cost_gpu_s": switch.cost_gpu_s})
        inputs = decision.inputs
        self.decisions.append({
            "t": t, "scheduled": scheduled, "W_P": forecast.prefill_tokens, "untracked": untracked,
            "K_D": forecast.decode_kv_tokens, "K_now": inputs.decode_kv_now, "C_KV": inputs.decode_kv_capacity,
            "slot_demand": inputs.decode_slot_demand, "theta_P": inputs.theta_p,
            "a": decision.allocation.prefill_demand, "b": decision.allocation.decode_demand,
            "current": [decision.plan.current[Role.PREFILL], decision.plan.current[Role.DECODE]],
            "target": [decision.allocation.n_prefill, decision.allocation.n_decode],
            "held": decision.demand["decode_held"],
            "switches": len(decision.plan.switches), "hold": decision.hold_reason})

    def reports(self, cluster) -> list[InstanceReport]:
        """What each instance would report. Prefilled requests waiting because no decode instance is active are
        counted on the first decode instance (SGLang's decode side queues them in its pre-allocation queue)."""
        waiting_kv, waiting_n = cluster.awaiting_kv_tokens(), cluster.awaiting_requests()
        out = []
        for inst in cluster.instances:
            decode = inst.role is Role.DECODE
            active = inst.status is InstanceStatus.ACTIVE
            used = inst.kv_used() if decode else 0
            queued = inst.queued_requests()
            if decode and waiting_n:
                used, queued, waiting_kv, waiting_n = used + waiting_kv, queued + waiting_n, 0, 0
            out.append(InstanceReport(
                instance_id=inst.iid, role=inst.role, status=inst.status, gpus=inst.gpus,
                queued_prompt_tokens=inst.prefill_load(), decode_kv_used=used,
                decode_kv_capacity=inst.perf.kv_tokens_per_instance if decode and active else 0,
                role_since=inst.role_since, running_requests=inst.running_requests(), queued_requests=queued,
                max_running_requests=inst.perf.max_running_per_instance if decode and active else 0,
                prefix_cache_tokens=inst.prefix_cache_tokens(), last_switch_s=inst.last_switch_s,
                prefix_cache_capacity=inst.perf.kv_tokens_per_instance if inst.role is Role.PREFILL else 0))
        return out
