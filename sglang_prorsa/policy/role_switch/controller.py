"""One control tick of the role switcher: forecast numbers and instance reports in, a logged decision out.

Interface for the server (pure; the clock is injected)::

    controller = RoleSwitchController(ControllerConfig(horizon_s=S, ...), ThetaModel(ThetaConfig(...)), clock)
    controller.observe(ThetaSample(instance_id, new_tokens, cached_tokens, requests, busy_seconds))  # prefill busy
    decision = controller.tick(ControlInputs(W_P, K_D, ...), reports)   # once per control interval
    decision.plan.switches        # [Switch(instance_id, src, dst, ...)]: execute these
    decision.to_dict()            # GET /prorsa/decision; controller.theta_snapshot() for the θ model

What the server fills in (every field but the first two is optional; the simulator, sim/adaptive.py, fills all):
  ControlInputs: ``prefill_tokens_forecast`` = Ŵ^P (+ any re-prefill backlog the tracker cannot see, also given as
  ``cold_prefill_tokens``, and as ``decode_kv_returning``: those contexts come back to decode);
  ``decode_kv_forecast`` = K̂^D; ``prefill_backlog_tokens`` = the forecast's observed backlog (ready + in flight,
  ``sources.backlog``) plus the cold part; ``decode_requests_forecast`` = requests
  predicted to enter decode (admission tokens / mean prompt); ``working_set_tokens`` = context tokens of the live
  trajectories (tracker); ``paused``; ``burst_prefill_tokens`` / ``burst_in_s`` for known bursts.
  InstanceReport: the paper's fields, plus running / queued requests, ``max_running_requests``, prefix-cache tokens
  and capacity, ``last_switch_s``, ``generation_paused``.
  ThetaSample: one per prefill busy interval (idle to idle, a long one in slices: theta.MAX_SAMPLE_S) of an instance;
  ``busy_seconds`` = the DP ranks' busy seconds over the rank count (theta.py).

A tick: θ^P for the forecast's mix from the θ model (theta.py; the cold part of Ŵ^P, e.g. re-prefill after a weight
update, at cold θ), C^D_KV, K^D_t and G from the reports (capacity.py), Eq. 1's target (allocator.py), then the
planner (planner.py) with the demands smoothed and laid out over the lookahead windows (backlog counted once, known
bursts added) and the cost of switching each instance (cost.py). The horizon S is ``ControllerConfig.horizon_s``,
used for Eq. 1, the windows and the cost/gain integration alike.

Beyond the paper (§4.2 switches toward every new target): demand smoothing (exponential, weight ``smoothing`` on the
newest reading; rises pass at once), backlog vs arrivals, bursts announced ahead, the decode slot demand
(capacity.decode_slot_demand), the measured stage waits (from ``decode_completions_per_s``; waits.py), which decide
under the opt-in wait rule, prefix-cache pressure on prefill donors, what decode holds now (``decode_held``:
the planner's test for both stages being short; with it the KV of contexts away for a re-prefill, so that a
weight update that empties decode for a moment does not read as decode having room to give), ``paused`` (hold:
demand read while the trainer paused generation is not demand), the planner's need / hysteresis / dwell / cost
conditions, and the opt-in move review (``ControllerConfig.review``; review.py: a move undone when decode's
completions fell after it, read from ``decode_completions_total``).

A tick that cannot be decided raises ``CannotDecide`` (capacity.py) with a code: ``too_few_instances`` (the healthy
GPUs cannot hold one instance per role: a front whose instances have not attached yet) or ``no_decode_capacity`` (no
KV pool known to size decode with; once one was seen, or a prefill instance reports its pool, it is used).

``step(W_P, K_D, reports, profile)`` and ``decide(AllocationInputs, reports)`` keep the earlier call forms; a
``ThroughputEstimator`` (the bucketed θ of throughput.py) is still accepted in place of the θ model.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from sglang_prorsa.policy.clock import Clock, WallClock
from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.policy.role_switch.allocator import Allocation, AllocationInputs, AllocatorConfig, allocate
from sglang_prorsa.policy.role_switch.capacity import (
    TOO_FEW_INSTANCES,
    CannotDecide,
    CapacityConfig,
    InstanceReport,
    InstanceStatus,
    Role,
    active_decode_pool,
    decode_kv_capacity,
    decode_kv_footprint,
    decode_slot_demand,
    gpu_budget,
)
from sglang_prorsa.policy.role_switch.cost import CostConfig, SwitchCost, switch_cost
from sglang_prorsa.policy.role_switch.planner import (
    Considered,
    PlanContext,
    PlannerConfig,
    Switch,
    SwitchPlan,
    SwitchPlanner,
)
from sglang_prorsa.policy.role_switch.review import (
    REFUSED_BY_REVIEW,
    REVERTED,
    REVIEWING,
    MoveReview,
    ReviewConfig,
)
from sglang_prorsa.policy.role_switch.theta import ThetaConfig, ThetaModel, ThetaSample
from sglang_prorsa.policy.role_switch.throughput import ThroughputEstimator, WorkloadProfile
from sglang_prorsa.policy.role_switch.waits import stage_waits


@dataclass(frozen=True)
class ControllerConfig:
    horizon_s: float = DEFAULT_HORIZON_S  # S: forecast horizon, control period and lookahead window (Appendix B default)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    theta: ThetaConfig = field(default_factory=ThetaConfig)  # prior of the θ model the controller builds itself
    cost: CostConfig = field(default_factory=CostConfig)
    smoothing: float = 0.5  # weight of the newest demand reading; 1 = no smoothing
    rise_at_once: bool = True  # demand = max(newest, smoothed): smoothing damps falls and noise dips, not rises
    cache_copies: float = 1.0  # prefix-cache copies of one trajectory's context (DP ranks it lands on; 1 = DP-aware)
    # Each move judged by the decode completions it brought and undone if they fell (review.py); None (the default):
    # no review. Opt-in in the simulator only (--move-review): measured, not kept as a default (review.py)
    review: ReviewConfig | None = None

    def __post_init__(self) -> None:
        planner, allocator = self.planner, self.allocator
        if (planner.min_prefill, planner.min_decode) != (allocator.min_prefill, allocator.min_decode):
            raise ValueError("planner and allocator must agree on the minimum instances per role")
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise ValueError(f"horizon_s must be finite and > 0, got {self.horizon_s}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")


@dataclass(frozen=True)
class ControlInputs:
    """The forecast's numbers for one tick, plus what the trainer tells about the near future."""

    prefill_tokens_forecast: float  # Ŵ^P: full-prompt tokens over the horizon
    decode_kv_forecast: float  # K̂^D: KV of requests predicted to enter decode within the horizon
    cold_prefill_tokens: float = 0.0  # part of Ŵ^P with no usable prefix cache (re-prefill): costed at cold θ
    # KV of contexts that left decode only to be prefilled again (a weight update) and go back once prefilled:
    # still decode's demand, counted in K^D_t (b and what decode holds) while they are away
    decode_kv_returning: float = 0.0
    # Part of Ŵ^P already queued or in flight (B.4 + B.6; the cold part included): counted once in the lookahead, not
    # once per window. None: all of Ŵ^P but the cold part is read as arriving anew every horizon.
    prefill_backlog_tokens: float | None = None
    decode_requests_forecast: float | None = None  # requests entering decode in the horizon; None: K̂^D / mean context
    burst_prefill_tokens: float = 0.0  # known prefill work arriving ``burst_in_s`` from now (next weight update)
    burst_in_s: float | None = None
    paused: bool = False  # the trainer paused generation: hold
    working_set_tokens: float | None = None  # context tokens of live trajectories (tracker): what caches could reuse
    # Decode completions per second over the last minute (decode_end events; waits.CompletionRate): the stage waits
    # are measured with it, and the planner's opt-in wait rule decides by them (waits.py). None: not measured yet
    decode_completions_per_s: float | None = None
    # Requests of ``decode_kv_returning``: decode's queue in transit through a re-prefill. The wait rule counts them
    # in decode's wait (waits.py): a weight update moves decode's queue into prefill, not out of the rollout
    decode_requests_returning: float = 0.0
    # The decode_end counter since the control plane started (what decode_completions_per_s is counted from): the
    # move review (review.py) compares it before and after each move. None: no review this tick
    decode_completions_total: int | None = None

    def __post_init__(self) -> None:
        for name in ("prefill_tokens_forecast", "decode_kv_forecast", "cold_prefill_tokens", "burst_prefill_tokens",
                     "decode_kv_returning", "decode_requests_returning"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("decode_requests_forecast", "burst_in_s", "prefill_backlog_tokens", "working_set_tokens",
                     "decode_completions_per_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be None or a finite number >= 0, got {value!r}")
        total = self.decode_completions_total
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
            raise ValueError(f"decode_completions_total must be None or an int >= 0, got {total!r}")
        if self.cold_prefill_tokens > self.prefill_tokens_forecast:
            raise ValueError("cold_prefill_tokens cannot exceed prefill_tokens_forecast")
        if self.prefill_backlog_tokens is not None and self.prefill_backlog_tokens > self.prefill_tokens_forecast:
            raise ValueError("prefill_backlog_tokens cannot exceed prefill_tokens_forecast")

    @property
    def backlog_tokens(self) -> float:
        """Queued prefill work: the given backlog, and at least the cold re-prefill (which is queued by nature)."""
        return max(self.cold_prefill_tokens, self.prefill_backlog_tokens or 0.0)


@dataclass(frozen=True)
class Decision:
    time_s: float
    inputs: AllocationInputs
    allocation: Allocation
    plan: SwitchPlan
    profile: WorkloadProfile | None = None
    theta_p_measured: bool = False  # False: θ^P is still the profiled prior
    control: ControlInputs | None = None
    theta_p_cold: float | None = None
    demand: dict = field(default_factory=dict)  # raw, smoothed and per-window demands in instances
    costs: dict[str, SwitchCost] = field(default_factory=dict)
    review: dict | None = None  # the move review's state (review.py); None: no review

    @property
    def hold_reason(self) -> str | None:
        return self.plan.hold_reason

    def to_dict(self) -> dict:
        """Every input of Eq. 1, the target, the planned switches, and each considered move's cost and gain."""
        control = self.control or ControlInputs(self.inputs.prefill_tokens_forecast, self.inputs.decode_kv_forecast)
        allocation = self.allocation.to_dict()
        return {
            "time_s": self.time_s,
            "inputs": {
                "W_P": self.inputs.prefill_tokens_forecast,
                "S": self.inputs.horizon_s,
                "theta_P": self.inputs.theta_p,
                "theta_P_measured": self.theta_p_measured,
                "theta_P_cold": self.theta_p_cold,
                "K_D_now": self.inputs.decode_kv_now,
                "K_D_forecast": self.inputs.decode_kv_forecast,
                "C_D_KV": self.inputs.decode_kv_capacity,
                "G": self.inputs.gpu_budget,
                "decode_slot_demand": self.inputs.decode_slot_demand,
                "cold_prefill_tokens": control.cold_prefill_tokens,
                "decode_kv_returning": control.decode_kv_returning,
                "burst_prefill_tokens": control.burst_prefill_tokens,
                "burst_in_s": control.burst_in_s,
                "paused": control.paused,
                "decode_completions_per_s": control.decode_completions_per_s,
                "decode_requests_returning": control.decode_requests_returning,
                "decode_completions_total": control.decode_completions_total,
                "profile": asdict(self.profile) if self.profile is not None else None,
            },
            "allocation": allocation,
            "delta": allocation["delta"],
            "target": {"prefill": self.allocation.n_prefill, "decode": self.allocation.n_decode},
            "plan": self.plan.to_dict(),
            "demand": self.demand,
            "costs": {iid: c.to_dict() for iid, c in sorted(self.costs.items())},
            "hold_reason": self.plan.hold_reason,
            "review": self.review,
        }


class RoleSwitchController:
    def __init__(self, config: ControllerConfig, theta: ThetaModel | ThroughputEstimator | None = None,
                 clock: Clock | None = None) -> None:
        self.config = config
        self.theta = theta if theta is not None else ThetaModel(config.theta)
        self._clock = clock or WallClock()
        self._planner = SwitchPlanner(config.planner, config.cost)
        self._smoothed: tuple[float, float] | None = None  # (a, b) in instances
        self._seen_decode_pool: int | None = None  # the last active decode pool reported (C^D_KV's fallback)
        self._last: Decision | None = None
        self.review = MoveReview(config.review) if config.review is not None else None

    # ----- θ -----
    def observe(self, sample: ThetaSample) -> bool:
        """A completed prefill busy interval from the server (only with a θ model)."""
        if not isinstance(self.theta, ThetaModel):
            raise TypeError("observe() needs a ThetaModel; this controller was given a ThroughputEstimator")
        return self.theta.observe(sample)

    def theta_snapshot(self) -> dict:
        return self.theta.snapshot()

    def _mean_prompt(self) -> float:
        if isinstance(self.theta, ThetaModel):
            return self.theta.mean_prompt_tokens()
        return self.config.theta.reference_prompt_tokens

    def _theta(self, profile: WorkloadProfile | None) -> tuple[float, float, bool]:
        """(θ at the recent mix, cold θ, measured?)."""
        if isinstance(self.theta, ThetaModel):
            return self.theta.theta_mix(), self.theta.theta_cold(), self.theta.measured
        profile = profile or self.theta.profile_of(self.config.theta.reference_prompt_tokens)
        value = self.theta.estimate(profile)
        return value, value, self.theta.is_measured(profile)

    # ----- a tick -----
    def tick(self, control: ControlInputs, reports: Sequence[InstanceReport],
             profile: WorkloadProfile | None = None) -> Decision:
        """Forecast numbers + reports -> Eq. 1 -> guarded plan, logged (``CannotDecide`` when there is nothing to
        allocate: too few instances, or no KV pool known)."""
        budget = self._budget(reports)
        theta_mix, theta_cold, measured = self._theta(profile)
        warm = control.prefill_tokens_forecast - control.cold_prefill_tokens
        busy_s = warm / theta_mix + control.cold_prefill_tokens / theta_cold
        theta_eff = control.prefill_tokens_forecast / busy_s if busy_s > 0 else theta_mix
        requests = control.decode_requests_forecast
        if requests is None:  # K̂^D over the KV of a decoding request: now's mean context, else the mean prompt
            running = sum(r.running_requests for r in reports if r.role is Role.DECODE)
            used = sum(r.decode_kv_used for r in reports if r.role is Role.DECODE)
            per_request = used / running if running and used else self._mean_prompt()
            requests = control.decode_kv_forecast / per_request if per_request > 0 else 0.0
        inputs = AllocationInputs(
            prefill_tokens_forecast=control.prefill_tokens_forecast, horizon_s=self.config.horizon_s,
            theta_p=theta_eff, decode_kv_now=decode_kv_footprint(reports) + control.decode_kv_returning,
            decode_kv_forecast=control.decode_kv_forecast,
            decode_kv_capacity=self._decode_capacity(reports), gpu_budget=budget,
            decode_slot_demand=decode_slot_demand(reports, requests))
        return self._decide(inputs, reports, profile, control, theta_cold, measured, theta_mix)

    def _budget(self, reports: Sequence[InstanceReport]) -> int:
        """G, or ``CannotDecide`` when it cannot hold the minimum of each role (a front with no instance attached
        yet, or with all but one dead): there is nothing to allocate, and the caller is told why."""
        budget, alloc = gpu_budget(reports), self.config.allocator
        need = alloc.gpus_per_prefill * alloc.min_prefill + alloc.gpus_per_decode * alloc.min_decode
        if budget < need:
            raise CannotDecide(TOO_FEW_INSTANCES, f"{budget} healthy GPUs cannot hold {alloc.min_prefill} prefill "
                                                  f"and {alloc.min_decode} decode instance(s) ({need} GPUs)")
        return budget

    def _decode_capacity(self, reports: Sequence[InstanceReport]) -> float:
        """C^D_KV. With no active decode instance (all switching, or the only one died) the pool last seen on one,
        else a prefill instance's prefix-cache pool (the same engines hold the same pool), so that the planner can
        still move an instance into an empty decode role."""
        pool = active_decode_pool(reports)
        if pool is not None:
            self._seen_decode_pool = pool
        fallback = self._seen_decode_pool
        if fallback is None:
            fallback = max((r.prefix_cache_capacity for r in reports if r.prefix_cache_capacity > 0), default=None)
        return decode_kv_capacity(reports, self.config.capacity, fallback)

    def step(self, prefill_tokens_forecast: float, decode_kv_forecast: float, reports: Sequence[InstanceReport],
             profile: WorkloadProfile | None = None) -> Decision:
        """A full tick from the forecaster's two numbers (Ŵ^P, K̂^D) (earlier call form of ``tick``)."""
        return self.tick(ControlInputs(prefill_tokens_forecast, decode_kv_forecast), reports, profile)

    def inputs_from(self, prefill_tokens_forecast: float, decode_kv_forecast: float,
                    reports: Sequence[InstanceReport], profile: WorkloadProfile | None = None) -> AllocationInputs:
        """Eq. 1's inputs as ``tick`` assembles them (no slot demand, no cold part)."""
        theta_mix, _, _ = self._theta(profile)
        budget = self._budget(reports)
        return AllocationInputs(
            prefill_tokens_forecast=prefill_tokens_forecast, horizon_s=self.config.horizon_s, theta_p=theta_mix,
            decode_kv_now=decode_kv_footprint(reports), decode_kv_forecast=decode_kv_forecast,
            decode_kv_capacity=self._decode_capacity(reports), gpu_budget=budget)

    def decide(self, inputs: AllocationInputs, reports: Sequence[InstanceReport],
               profile: WorkloadProfile | None = None, control: ControlInputs | None = None) -> Decision:
        """Eq. 1 then the planner, on inputs the caller assembled (θ^P in ``inputs`` is taken as given)."""
        _, theta_cold, measured = self._theta(profile)
        return self._decide(inputs, reports, profile, control, min(theta_cold, inputs.theta_p), measured,
                            inputs.theta_p)

    def _decide(self, inputs: AllocationInputs, reports: Sequence[InstanceReport], profile, control,
                theta_cold: float, measured: bool, theta_mix: float) -> Decision:
        now = self._clock.now()
        allocation = allocate(inputs, self.config.allocator)
        paused = bool(control and control.paused) or any(r.generation_paused for r in reports)
        windows, backlog = self._windows(allocation, control, theta_mix, theta_cold, paused)
        m_prefill = self.config.allocator.gpus_per_prefill
        reusable = self._reusable_tokens(inputs, reports, windows[Role.PREFILL])
        costs = {r.instance_id: switch_cost(r, self.config.cost, 1.0 / theta_cold, m_prefill, reusable)
                 for r in reports if r.status is InstanceStatus.ACTIVE}
        cache_loss = self._cache_loss(control, reports, windows[Role.PREFILL], inputs.theta_p, theta_cold)
        held = _decode_held(inputs, reports)
        waits = stage_waits(reports, theta_mix, control.decode_completions_per_s,
                            control.decode_requests_returning) if control is not None else None
        context = PlanContext(self.config.horizon_s, windows[Role.PREFILL], windows[Role.DECODE], costs, paused,
                              prefill_backlog=backlog, prefill_cache_loss=cache_loss, decode_held=held, waits=waits)
        plan = self._planner.plan(reports, allocation, now, context)
        if self.review is not None:
            plan = self._reviewed(plan, reports, now, control)
        a_s, b_s = self._smoothed or (allocation.prefill_demand, allocation.decode_demand)
        demand = {"prefill": allocation.prefill_demand, "decode": allocation.decode_demand,
                  "prefill_smoothed": a_s, "decode_smoothed": b_s,
                  "prefill_backlog": backlog, "prefill_cache_loss": cache_loss, "decode_held": held,
                  "waits": waits.to_dict() if waits is not None else None,
                  "windows": {"prefill": list(windows[Role.PREFILL]), "decode": list(windows[Role.DECODE])}}
        self._last = Decision(now, inputs, allocation, plan, profile, measured, control, theta_cold, demand, costs,
                              self.review.snapshot(now) if self.review is not None else None)
        return self._last

    def _reviewed(self, plan: SwitchPlan, reports: Sequence[InstanceReport], now: float,
                  control: ControlInputs | None) -> SwitchPlan:
        """The planner's plan under the move review (review.py): the undoing of a move whose completions fell, a
        hold while a move is under review or when this move was undone from this split lately, else the plan (put
        under review)."""
        review = self.review
        assert review is not None
        if control is None or control.decode_completions_total is None:
            return plan
        review.observe(now, control.decode_completions_total)
        verdict = review.due(now)
        if verdict is not None and verdict.undone:
            moved = verdict.review
            by_id = {r.instance_id: r for r in reports}
            back = tuple(Switch(iid, moved.dst, moved.src, float(by_id[iid].load()))
                         for iid in moved.instance_ids
                         if iid in by_id and by_id[iid].role is moved.dst and by_id[iid].status is InstanceStatus.ACTIVE)
            undo = Considered(tuple(s.instance_id for s in back), moved.dst, moved.src, 0.0, 0.0, bool(back), REVERTED)
            return dataclasses.replace(plan, switches=back, considered=(undo,), new_instances=0, shortfall=0,
                                       hold_reason=None if back else REVERTED)
        if not plan.switches:
            return plan
        if review.holding(now):
            return dataclasses.replace(plan, switches=(), new_instances=0, hold_reason=REVIEWING)
        first = plan.switches[0]
        split = plan.current[Role.PREFILL]
        if review.refused(split, first.dst, now):
            return dataclasses.replace(plan, switches=(), new_instances=0, hold_reason=REFUSED_BY_REVIEW)
        review.start(now, tuple(s.instance_id for s in plan.switches), first.src, first.dst, split)
        return plan

    def _cache_loss(self, control: ControlInputs | None, reports: Sequence[InstanceReport],
                    prefill_windows: tuple[float, ...], theta_mix: float, theta_cold: float) -> float:
        """Extra prefill work per window (instances) if one prefill instance leaves, from cache pressure.

        The prefill caches hold ``copies`` x the live working set where they can: a fraction f(C) = min(1, C /
        (W x copies)) of it, for a total capacity C. Hits scale with f, so removing one instance's capacity loses
        h x (1 - f(C - C_i) / f(C)) of the arriving prompt tokens to recompute at cold θ. 0 when the working set or
        the capacities are not reported."""
        if control is None or not control.working_set_tokens or not isinstance(self.theta, ThetaModel):
            return 0.0
        caps = [r.prefix_cache_capacity for r in reports
                if r.role is Role.PREFILL and r.status is InstanceStatus.ACTIVE and r.prefix_cache_capacity > 0]
        if len(caps) < 2:
            return 0.0
        need = control.working_set_tokens * self.config.cache_copies
        total = sum(caps)
        f_now, f_after = min(1.0, total / need), min(1.0, (total - total / len(caps)) / need)
        lost = self.theta.hit_ratio() * (1 - f_after / f_now)
        tokens_per_window = statistics.fmean(prefill_windows) * self.config.horizon_s * theta_mix
        return lost * tokens_per_window / (self.config.horizon_s * theta_cold)

    def _reusable_tokens(self, inputs: AllocationInputs, reports: Sequence[InstanceReport],
                         prefill_windows: tuple[float, ...]) -> float | None:
        """Prefix hits one prefill instance would serve over the lookahead: its share of the prompt tokens expected
        there times the measured hit ratio (None without a θ model to measure it)."""
        if not isinstance(self.theta, ThetaModel):
            return None
        n_prefill = sum(1 for r in reports if r.role is Role.PREFILL and r.status is InstanceStatus.ACTIVE)
        tokens = sum(prefill_windows) * self.config.horizon_s * inputs.theta_p
        return self.theta.hit_ratio() * tokens / max(n_prefill, 1)

    def _windows(self, allocation: Allocation, control: ControlInputs | None, theta_mix: float, theta_cold: float,
                 paused: bool) -> tuple[dict[Role, tuple[float, ...]], float]:
        """Demand per lookahead window in instances, and the prefill backlog (counted once): the arrival part of a and
        b is smoothed and persists; a known burst arrives in its window; the backlog is observed, not smoothed."""
        horizon = self.config.horizon_s
        backlog = 0.0
        if control is not None and control.backlog_tokens > 0:
            cold = control.cold_prefill_tokens
            backlog = ((control.backlog_tokens - cold) / theta_mix + cold / theta_cold) / horizon
        a, b = max(0.0, allocation.prefill_demand - backlog), allocation.decode_demand
        if not paused:  # readings taken while generation is paused say nothing about demand
            alpha = self.config.smoothing
            if self._smoothed is None:
                self._smoothed = (a, b)
            else:
                a0, b0 = self._smoothed
                self._smoothed = (alpha * a + (1 - alpha) * a0, alpha * b + (1 - alpha) * b0)
        a_s, b_s = self._smoothed or (a, b)
        if self.config.rise_at_once:
            a_s, b_s = max(a, a_s), max(b, b_s)
        n = self.config.planner.lookahead_horizons
        prefill = [a_s] * n
        if control is not None and control.burst_prefill_tokens > 0 and control.burst_in_s is not None:
            k = int(control.burst_in_s // horizon)
            if k < n:
                prefill[k] += control.burst_prefill_tokens / (horizon * theta_cold)
        return {Role.PREFILL: tuple(prefill), Role.DECODE: (b_s,) * n}, backlog

    def last_decision(self) -> dict | None:
        return self._last.to_dict() if self._last is not None else None


def _decode_held(inputs: AllocationInputs, reports: Sequence[InstanceReport]) -> float:
    """Decode instances' worth of what decode holds now (running and queued requests): K^D_t / C^D_KV, or the slot
    demand without the forecast's admissions, whichever is larger. Unlike b it needs no prefill to feed it."""
    kv = inputs.decode_kv_now / inputs.decode_kv_capacity if inputs.decode_kv_capacity > 0 else 0.0
    return max(kv, decode_slot_demand(reports, 0.0))
