"""Adaptive PD: our real control plane, unmodified, on the simulator's ``ManualClock`` (§4, Appendix B, C).

Calls, in the order a deployment makes them:
* trainer hints -> ``LifecycleControlPlane.ingest([event])``; engine transitions -> ``cp.engine.request_arrived``,
  ``prefill_finished``, ``decode_finished`` (the same typed API the SGLang front uses);
* prefill service -> ``ThroughputEstimator.start / finish / abort / interrupt`` (θ^P from busy intervals, §4.2);
* every S seconds: ``cp.tick()`` (refresh + accuracy window), ``cp.predictor.latest`` (the forecast), instance
  reports, then ``RoleSwitchController.step(Ŵ^P, K̂^D, reports, profile)`` (Eq. 1 + planner); each planned switch is
  executed by the cluster (Appendix C).

One addition, outside the control plane: the lifecycle state machine has no event for a request that is prefilled a
second time while its trajectory is in decode (re-prefill after an async weight update; §3.1). Those tokens are
real prefill demand the tracker cannot see, so the driver adds the engines' untracked re-prefill backlog to Ŵ^P
(observed backlog, like B.4's ready queue). The same requests report no prefill_finished (it would be rejected).
"""

from __future__ import annotations

from collections import deque

from sglang_prorsa.sim.config import ClusterConfig, ModelConfig, RolloutConfig
from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.srt.forecast.accuracy import WindowRecord
from sglang_prorsa.srt.forecast.config import PredictorConfig
from sglang_prorsa.srt.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane
from sglang_prorsa.srt.lifecycle.events import LifecycleEvent
from sglang_prorsa.srt.role_switch.allocator import AllocatorConfig
from sglang_prorsa.srt.role_switch.capacity import CapacityConfig, InstanceReport, InstanceStatus, Role
from sglang_prorsa.srt.role_switch.controller import ControllerConfig, RoleSwitchController
from sglang_prorsa.srt.role_switch.planner import PlannerConfig
from sglang_prorsa.srt.role_switch.throughput import ThroughputConfig, ThroughputEstimator
from sglang_prorsa.srt.utils.clock import ManualClock
from sglang_prorsa.workload.presets import TaskProfile


# θ^P profiles. With the estimator's default buckets (prompt 2K/8K/32K/128K, cache hit 25/50/75 %) an agentic run
# flips between buckets from one horizon to the next (contexts grow across 32K; first turns have no cache hit,
# later ones ~95 %), and θ^P differs up to 10x between buckets, which made the allocator flap (hundreds of switches
# per hour in our first runs). One task per run here, so we keep cache-hit buckets only and a longer window.
THETA_PROMPT_EDGES: tuple[int, ...] = ()
THETA_CACHE_EDGES = (0.5,)
THETA_WINDOW = 64
PROFILE_HORIZONS = 6  # horizons of completed prefills that decide which profile the current workload is


class ControlPlaneDriver:
    """A ``Lifecycle`` (lifecycle_sink.py) that feeds the control plane, plus the periodic role-switch decision."""

    def __init__(self, cluster: ClusterConfig, model: ModelConfig, rollout: RolloutConfig, task: TaskProfile) -> None:
        perf = PerfModel(model)
        self.clock = ManualClock(0.0)
        x_new = round(task.first_prompt_tokens.median)
        injection = (InjectionConfig(InjectionPolicy.NONE) if rollout.synchronous
                     else InjectionConfig(InjectionPolicy.GROUP, group_size=rollout.group_size))
        self.cp = LifecycleControlPlane(self.clock, PredictorConfig(
            horizon_s=cluster.horizon_s, injection=injection, default_prompt_tokens=x_new,
            prefill_profile=perf.predictor_profile()))
        self.throughput = ThroughputEstimator(ThroughputConfig(
            profiled_theta=perf.profiled_theta(x_new), prompt_bucket_edges=THETA_PROMPT_EDGES,
            cache_hit_bucket_edges=THETA_CACHE_EDGES, window_intervals=THETA_WINDOW), self.clock)
        m = model.gpus_per_instance
        self.controller = RoleSwitchController(ControllerConfig(
            horizon_s=cluster.horizon_s,
            allocator=AllocatorConfig(gpus_per_prefill=m, gpus_per_decode=m),
            planner=PlannerConfig(min_dwell_s=cluster.min_dwell_s, hysteresis=cluster.hysteresis),
            capacity=CapacityConfig(profiled_decode_kv_capacity=perf.kv_tokens_per_instance),
        ), self.throughput, self.clock)
        self._profile = self.throughput.profile_of(x_new)
        self._queued: dict[int, tuple[str, int]] = {}  # request id -> (instance holding it, cached tokens)
        # (prompt, cached, requests) prefilled per recent horizon: the workload profile θ^P is read for.
        self._recent: deque[tuple[int, int, int]] = deque(maxlen=PROFILE_HORIZONS)
        self._prompt_sum = self._cached_sum = self._prompt_count = 0
        self.windows: list[WindowRecord] = []
        self.decisions: list[dict] = []

    # ----- Lifecycle -----
    def _now(self, t: float) -> None:
        if t > self.clock.now():
            self.clock.set(t)

    def hint(self, event: LifecycleEvent) -> None:
        self._now(event.ts)
        self.cp.ingest([event])

    def request_arrived(self, run, prompt_tokens: int, instance: str, t: float) -> None:
        self._now(t)
        self.cp.engine.request_arrived(run.plan.trajectory_id, prompt_tokens, instance=instance, ts=t)

    def prefill_queued(self, instance: str, req, t: float) -> None:
        self._now(t)
        self.prefill_cancelled(req)
        cached = min(req.done, req.prompt)
        self.throughput.start(instance, str(req.rid), req.prompt, cached)
        self._queued[req.rid] = (instance, cached)

    def prefill_cancelled(self, req) -> None:
        old = self._queued.pop(req.rid, None)
        if old is not None:
            self.throughput.abort(old[0], str(req.rid))

    def prefill_finished(self, instance: str, req, t: float) -> None:
        self._now(t)
        queued = self._queued.pop(req.rid, None)
        if queued is not None:
            self.throughput.finish(instance, str(req.rid))
            self._prompt_sum += req.prompt
            self._cached_sum += queued[1]
            self._prompt_count += 1
        if not req.untracked:
            self.cp.engine.prefill_finished(req.owner.plan.trajectory_id, instance, ts=t)

    def decode_finished(self, run, t: float) -> None:
        self._now(t)
        self.cp.engine.decode_finished(run.plan.trajectory_id, ts=t)

    def instance_interrupted(self, instance: str) -> None:
        self.throughput.interrupt(instance)
        self._queued = {rid: q for rid, q in self._queued.items() if q[0] != instance}

    # ----- every S -----
    def tick(self, t: float, cluster) -> None:
        """Forecast, Eq. 1, plan; the cluster executes the switches."""
        self._now(t)
        self.cp.tick()
        forecast = self.cp.predictor.latest
        recent = self.cp.predictor.accuracy.recent
        if recent and (not self.windows or self.windows[-1] is not recent[-1]):
            self.windows.append(recent[-1])
        reports = self.reports(cluster)
        if self._prompt_count:  # else keep the last profile: no prefill in this horizon says nothing about θ^P
            self._recent.append((self._prompt_sum, self._cached_sum, self._prompt_count))
            self._profile = self.throughput.profile_of(*(sum(col) for col in zip(*self._recent)))
        self._prompt_sum = self._cached_sum = self._prompt_count = 0
        untracked = cluster.untracked_prefill_tokens()
        decision = self.controller.step(forecast.prefill_tokens + untracked, forecast.decode_kv_tokens, reports,
                                        self._profile)
        for switch in decision.plan.switches:
            cluster.start_switch(switch.instance_id, switch.dst, t)
        self.decisions.append({"t": t, "W_P": forecast.prefill_tokens, "untracked": untracked,
                               "K_D": forecast.decode_kv_tokens, "theta_P": decision.inputs.theta_p,
                               "target": [decision.allocation.n_prefill, decision.allocation.n_decode],
                               "switches": len(decision.plan.switches)})

    def reports(self, cluster) -> list[InstanceReport]:
        """What each instance would report; KV of prefilled requests still waiting for a decode slot is counted on
        the decode instance that will take them (SGLang's decode side queues them in its pre-allocation queue)."""
        waiting_kv = cluster.awaiting_kv_tokens()
        out = []
        for inst in cluster.instances:
            decode = inst.role is Role.DECODE and inst.status is InstanceStatus.ACTIVE
            used = inst.kv_used() if inst.role is Role.DECODE else 0
            if decode and waiting_kv:
                used, waiting_kv = used + waiting_kv, 0
            out.append(InstanceReport(
                instance_id=inst.iid, role=inst.role, status=inst.status, gpus=inst.perf.model.gpus_per_instance,
                queued_prompt_tokens=inst.prefill_load(), decode_kv_used=used,
                decode_kv_capacity=inst.perf.kv_tokens_per_instance if decode else 0, role_since=inst.role_since))
        return out
