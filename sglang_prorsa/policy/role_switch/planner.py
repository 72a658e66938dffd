"""Switch planner (Appendix C): which instances change role, given Eq. 1's target and what each switch would cost.

The paper's rule (``PlannerConfig.unguarded()``): make the role changes the target requires, each on the least-loaded
eligible instance, never touching an instance that is switching, draining or unhealthy.

Default rule (beyond the paper; issue 11). Eq. 1 stays the sizing rule: its target bounds how far a role may grow.
Within that bound a switch is made only when all of these hold:

  1. need: the receiving role is projected short, coverage n/d < 1 + ``short_margin`` in some lookahead window
     (d = demand in instances: Eq. 1's a or b, smoothed by the controller, plus known bursts). A role with room to
     spare is never fed, however the target ratio moves: with both demands tiny, Eq. 1's scale-free δ swings the
     ratio, the need test does not;
  2. absolute hysteresis: the donor keeps coverage >= 1 + ``short_margin`` + ``hysteresis`` after the move in every
     window. A role is short below 1 + short_margin but may give only above that plus the band, so a role that just
     received cannot give back on a small fluctuation. The stages are in series: prefill feeds decode. A short
     prefill below its target is fed first (``prefill_first``) and a decode donor that is not short itself loses
     nothing that counts: decode's slot demand is a queue that prefill keeps filling, capacity past what prefill
     feeds it serves nothing. Decode is fed from prefill capacity prefill can spare (a prefill donor also takes its
     share of the prefix-cache pool with it, ``PlanContext.prefill_cache_loss``).
     **Both roles short** (a GPU-bound cluster: prefill short of its demand and decode short of what it already
     holds, ``PlanContext.decode_held``): the pipeline delivers δ = min(n^P/a, n^D/held) of its demand (Eq. 1's δ
     with decode's demand cut to what needs no more prefill), so a move into decode is made only when it raises δ
     (prefill over its mean demand across the lookahead) by at least ``hysteresis``; its gain is that rise times
     the cluster's GPU-seconds over the lookahead. A move into a short prefill below its target keeps the rule
     above (weighing it by δ too cost the MiMo-like general agent at staleness 8 its burst moves: 0.97 -> 1.34x
     of best static on one seed). (Before, prefill-first held whenever prefill was short and at its target: in
     the simulator's DeepSeek-like coding agent at staleness 8, 8 groups, adaptive then sat at 7:1 with one decode
     instance holding 5x its KV in queue, 14 % slower than static 6:2, while Eq. 1 asked for 5:3 at every tick.);
  3. dwell: an instance keeps a new role at least max(``min_dwell_s``, ``dwell_switch_costs`` × its switch time);
  4. pays: the GPU-seconds of needed service gained over ``lookahead_horizons`` horizons exceed the switch's cost
     (downtime, migration of its decode KV, re-prefill of the prefix cache it drops; cost.py). "Needed" counts demand
     with the same margin, d·(1 + ``short_margin``), so conditions 1 and 4 agree on what short means. When only the
     receiver's backlog needs the instance (its steady arrivals fit the instances it has, e.g. the re-prefill after a
     weight update), the cost counts twice: the instance will have to switch back.

**The wait rule** (opt-in, ``wait_balance``; waits known and a stage queued: ``PlanContext.waits``, waits.py, a wait
above ``wait_floor_s``) replaces conditions 1-4 (beyond the paper). One instance moves when the move shortens a
turn's summed wait (prefill's plus decode's, each held to its queue over its instances, waits.move_shortens_waits):
the receiving stage's wait must fall by more than ``wait_ratio`` times the donor's rise plus ``wait_floor_s`` over
the receiver's instances; least loaded first, never below a role's minimum, and at most one such move per
``wait_pace_s`` across the cluster (no instance active in its role for less than that, none mid-switch), which
bounds the downtime it spends: one switch time per pace. Waits are measured, not forecast: they follow what the
split does, where Eq. 1's decode term reads decode's own queue as demand. While neither stage holds a queue, or
before a decode completion is measured, the rules above apply: they act on the forecast, ahead of the work (a surge
of announced prompts), which a wait cannot show before it arrives.

Candidates are taken cheapest first (lowest cost, then least loaded: the paper's choice when costs tie), one move at a
time, until the receiver is no longer short, the target is reached or a condition fails. A role below its configured
minimum is always refilled. With m^P ≠ m^D a move frees instances of the shrinking role until their GPUs can host one
instance of the growing role (``new_instances``; regrouping is the executor's job).

Every candidate looked at is reported (``considered``: gain, cost, accepted, reason), and a plan without switches
says why (``hold_reason``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.policy.role_switch.allocator import Allocation, coverage_of
from sglang_prorsa.policy.role_switch.capacity import InstanceReport, InstanceStatus, Role, role_counts
from sglang_prorsa.policy.role_switch.cost import (
    CostConfig,
    Demand,
    SwitchCost,
    bottleneck_delta,
    move_gain_gpu_s,
    switch_cost,
    switch_seconds,
)
from sglang_prorsa.policy.role_switch.waits import StageWaits, move_shortens_waits

# Why a plan holds (``SwitchPlan.hold_reason``) or a candidate was refused (``Considered.reason``).
PAUSED = "paused"  # the trainer paused generation: demand readings mean nothing now
NO_ROLE_SHORT = "no_role_short"
TARGET_MET = "target_met"  # Eq. 1 gives the short role no more instances than it has
NO_ELIGIBLE = "no_eligible_instance"  # every donor is switching, unhealthy or inside its dwell time
DONOR_AT_MINIMUM = "donor_at_minimum"
WITHIN_BAND = "within_hysteresis_band"  # the donor would be left below 1 + short_margin + hysteresis
COST_EXCEEDS_GAIN = "cost_exceeds_gain"
ACCEPTED = "accepted"
WAITS_BALANCED = "waits_balanced"  # no move shortens the summed wait by the margin (move_shortens_waits)
PACED = "paced"  # an instance switched less than wait_pace_s ago, or is switching now


@dataclass(frozen=True)
class PlannerConfig:
    min_dwell_s: float = 30.0  # floor of the dwell time; 0 with dwell_switch_costs 0 turns the guard off
    hysteresis: float = 0.1  # absolute coverage band of condition 2 above the short threshold
    min_prefill: int = 1  # must match AllocatorConfig: roles are never emptied below these
    min_decode: int = 1
    short_margin: float = 0.1  # condition 1: short below coverage 1 + short_margin
    dwell_switch_costs: float = 6.0  # condition 3: dwell of several switch durations
    lookahead_horizons: int = 3  # condition 4: gain integrated over this many horizons
    need_based: bool = True  # False: move toward Eq. 1's target whether or not a role is short (the paper)
    cost_aware: bool = True  # False: skip condition 4
    pay_factor: float = 1.0  # condition 4 asks gain > pay_factor x cost: room for forecast error
    prefill_first: bool = True  # a short prefill below its target is fed first (see condition 2)
    # opt-in (the simulator's --planner waits, the server's --prorsa-wait-rule): with measured waits and a queue,
    # the wait rule decides (module docstring)
    wait_balance: bool = False
    wait_ratio: float = 1.3  # the receiver's fall in wait must exceed wait_ratio x the donor's rise ...
    wait_floor_s: float = 2.0  # ... plus this over its instances + 1: a wait under it alone moves nothing
    wait_pace_s: float = 30.0  # at most one wait-driven switch per this many seconds, cluster-wide

    def __post_init__(self) -> None:
        for name in ("min_dwell_s", "hysteresis", "short_margin", "dwell_switch_costs", "wait_floor_s", "wait_pace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not (math.isfinite(self.pay_factor) and self.pay_factor >= 1):
            raise ValueError(f"pay_factor must be finite and >= 1, got {self.pay_factor}")
        if not (math.isfinite(self.wait_ratio) and self.wait_ratio >= 1):
            raise ValueError(f"wait_ratio must be finite and >= 1, got {self.wait_ratio}")
        if self.lookahead_horizons < 1:
            raise ValueError(f"lookahead_horizons must be >= 1, got {self.lookahead_horizons}")
        if self.min_prefill < 0 or self.min_decode < 0:
            raise ValueError("min_prefill and min_decode must be >= 0")

    @classmethod
    def unguarded(cls) -> PlannerConfig:
        """The paper's planner as written: chase Eq. 1's target, least-loaded first, no guard of any kind."""
        return cls(min_dwell_s=0.0, hysteresis=0.0, dwell_switch_costs=0.0, need_based=False, cost_aware=False,
                   wait_balance=False)

    @property
    def guarded(self) -> bool:
        return self.need_based or self.cost_aware or self.hysteresis > 0 or self.min_dwell_s > 0 or \
            self.dwell_switch_costs > 0 or self.wait_balance

    def dwell_s(self, switch_s: float) -> float:
        return max(self.min_dwell_s, self.dwell_switch_costs * switch_s)


@dataclass(frozen=True)
class PlanContext:
    """What the planner needs beyond Eq. 1's allocation (the controller fills it in)."""

    horizon_s: float
    prefill_demand: tuple[float, ...]  # instances' worth of work arriving per lookahead window (0 = the coming one)
    decode_demand: tuple[float, ...]
    costs: Mapping[str, SwitchCost] = field(default_factory=dict)  # per instance; missing ones get default costs
    paused: bool = False
    prefill_backlog: float = 0.0  # instances' worth of work already waiting: served once, carried until served
    decode_backlog: float = 0.0
    # Extra prefill work per window (instances) for each prefill instance removed: prefix hits lost because the
    # remaining instances' caches cannot hold the working set (controller._cache_loss).
    prefill_cache_loss: float = 0.0
    # Decode instances' worth of requests decode holds now (running and queued: the larger of its KV and slot
    # terms). Unlike the decode demand it includes no admissions that prefill has yet to feed (condition 2).
    decode_held: float = 0.0
    waits: StageWaits | None = None  # measured expected waits per stage (waits.py); None: not known yet

    def __post_init__(self) -> None:
        if not self.prefill_demand or len(self.prefill_demand) != len(self.decode_demand):
            raise ValueError("prefill_demand and decode_demand need the same, non-zero number of windows")

    def demand(self, role: Role, removed: int = 0) -> Demand:
        """``role``'s demand, after ``removed`` of its instances left (prefill loses cache hits: more work)."""
        if role is Role.PREFILL:
            extra = removed * self.prefill_cache_loss
            return Demand(tuple(r + extra for r in self.prefill_demand), self.prefill_backlog)
        return Demand(tuple(self.decode_demand), self.decode_backlog)

    @classmethod
    def from_allocation(cls, allocation: Allocation, horizon_s: float, windows: int) -> PlanContext:
        """Eq. 1's demands, assumed to persist over ``windows`` horizons; default switch costs."""
        return cls(horizon_s, (allocation.prefill_demand,) * windows, (allocation.decode_demand,) * windows)


@dataclass(frozen=True)
class Switch:
    instance_id: str
    src: Role
    dst: Role
    load: float  # the load it had when chosen (prefill tokens or decode KV), for the decision log
    gain_gpu_s: float = 0.0  # of the move it belongs to (several instances share one when m^P != m^D)
    cost_gpu_s: float = 0.0


@dataclass(frozen=True)
class Considered:
    """A move the planner weighed: the instances it would take, its gain and cost, and the verdict."""

    instance_ids: tuple[str, ...]
    src: Role
    dst: Role
    gain_gpu_s: float
    cost_gpu_s: float
    accepted: bool
    reason: str

    def to_dict(self) -> dict:
        return {"instances": list(self.instance_ids), "from": self.src.value, "to": self.dst.value,
                "gain_gpu_s": _finite(self.gain_gpu_s), "cost_gpu_s": _finite(self.cost_gpu_s),
                "net_gpu_s": _finite(self.gain_gpu_s - self.cost_gpu_s), "accepted": self.accepted,
                "reason": self.reason}


@dataclass(frozen=True)
class SwitchPlan:
    switches: tuple[Switch, ...]
    current: dict[Role, int]  # instances per role before the plan (mid-switch ones under their destination)
    target: dict[Role, int]
    current_coverage: float
    held_by_hysteresis: bool = False
    blocked_by_dwell: int = 0  # instances the plan wanted but could not take because they switched too recently
    shortfall: int = 0  # instances of the growing role the plan could not provide this tick
    new_instances: int = 0  # instances of the growing role formed from the freed GPUs
    considered: tuple[Considered, ...] = ()
    hold_reason: str | None = None  # why no (further) switch was made; None when the target was simply reached
    coverage: dict[Role, float] = field(default_factory=dict)  # per role, current instances over window-0 demand

    def to_dict(self) -> dict:
        return {
            "switches": [
                {"instance_id": s.instance_id, "instance": s.instance_id, "from": s.src.value, "to": s.dst.value,
                 "load": s.load, "gain_gpu_s": _finite(s.gain_gpu_s), "cost_gpu_s": _finite(s.cost_gpu_s)}
                for s in self.switches
            ],
            "current": {r.value: n for r, n in self.current.items()},
            "target": {r.value: n for r, n in self.target.items()},
            "current_coverage": _finite(self.current_coverage),
            "coverage": {r.value: _finite(c) for r, c in self.coverage.items()},
            "held_by_hysteresis": self.held_by_hysteresis,
            "blocked_by_dwell": self.blocked_by_dwell,
            "shortfall": self.shortfall,
            "new_instances": self.new_instances,
            "considered": [c.to_dict() for c in self.considered],
            "hold_reason": self.hold_reason,
        }


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x


class SwitchPlanner:
    def __init__(self, config: PlannerConfig = PlannerConfig(), cost: CostConfig = CostConfig()) -> None:
        self.config = config
        self.cost = cost

    def plan(self, reports: Sequence[InstanceReport], allocation: Allocation, now: float,
             context: PlanContext | None = None) -> SwitchPlan:
        """Role changes that move ``reports`` toward ``allocation``'s target, as of time ``now``."""
        cfg = self.config
        if context is None:
            context = PlanContext.from_allocation(allocation, DEFAULT_HORIZON_S, cfg.lookahead_horizons)
        current = role_counts(reports)
        target = {Role.PREFILL: allocation.n_prefill, Role.DECODE: allocation.n_decode}
        now_demand = {r: context.demand(r).windows(current[r])[0] for r in Role}
        coverage = {r: _coverage(current[r], now_demand[r]) for r in Role}
        base = SwitchPlan(switches=(), current=current, target=target, coverage=coverage,
                          current_coverage=coverage_of(current[Role.PREFILL], current[Role.DECODE],
                                                       now_demand[Role.PREFILL], now_demand[Role.DECODE]))
        if not cfg.guarded:
            return self._chase_target(reports, allocation, now, base)
        if context.paused:
            return dataclasses.replace(base, hold_reason=PAUSED)

        minimum = {Role.PREFILL: cfg.min_prefill, Role.DECODE: cfg.min_decode}
        below_min = [r for r in Role if current[r] < minimum[r]]
        waits = context.waits
        if cfg.wait_balance and waits is not None and not below_min and waits.queued(cfg.wait_floor_s):
            return self._balance_waits(reports, allocation, now, waits, base, minimum)
        worst = {r: context.demand(r).coverage(current[r]) for r in Role}
        if below_min:
            dst = below_min[0]
        elif cfg.need_based:
            short = [r for r in Role if worst[r] < 1 + cfg.short_margin]
            if not short:
                return dataclasses.replace(base, hold_reason=NO_ROLE_SHORT)
            # Eq. 1 bounds every move: a short role already at its target takes nothing (when both are short, the
            # one Eq. 1 grows). Stages in series: prefill feeds decode, so a short prefill below its target comes first.
            wanting = [r for r in short if current[r] < target[r]]
            if not wanting:
                return dataclasses.replace(base, hold_reason=TARGET_MET)
            dst = Role.PREFILL if Role.PREFILL in wanting and cfg.prefill_first else wanting[0]
        else:
            behind = next((r for r in Role if current[r] < target[r]), None)
            if behind is None:
                return dataclasses.replace(base, hold_reason=TARGET_MET)
            dst = behind
        if not below_min and current[dst] >= target[dst]:
            return dataclasses.replace(base, hold_reason=TARGET_MET)
        return self._moves(reports, allocation, now, context, base, dst, minimum, bool(below_min))

    # ----- the guarded rule -----
    def _moves(self, reports, allocation, now, context, base: SwitchPlan, dst: Role, minimum: dict[Role, int],
               refill_minimum: bool) -> SwitchPlan:
        cfg = self.config
        src = dst.other
        gpus = {Role.PREFILL: allocation.gpus_per_prefill, Role.DECODE: allocation.gpus_per_decode}
        costs = {r.instance_id: context.costs.get(r.instance_id) or switch_cost(r, self.cost, 0.0, gpus[Role.PREFILL])
                 for r in reports}
        candidates, blocked = self._eligible(reports, src, now)
        candidates.sort(key=lambda r: (costs[r.instance_id].total_gpu_s, r.load(), r.instance_id))
        # Need includes the margin: headroom up to coverage 1 + short_margin is worth having (KV growth, forecast
        # error), beyond it capacity serves nothing.
        need = {r: context.demand(r).scaled(1 + cfg.short_margin) for r in Role}
        n = dict(base.current)
        switches: list[Switch] = []
        considered: list[Considered] = []
        reason: str | None = None
        held_by_band = False
        while True:
            if n[dst] >= base.target[dst] and n[dst] >= minimum[dst]:
                break  # Eq. 1's bound reached
            group = _take_donors(candidates, gpus[dst])
            if group is None:
                reason = NO_ELIGIBLE
                break
            ids = tuple(r.instance_id for r in group)
            cost = sum(costs[i].total_gpu_s for i in ids)
            if need[dst].backlog > 0 and need[dst].rates[-1] <= n[dst]:
                cost *= 2  # only a backlog needs it (the steady arrivals fit): the way back will be paid too
            # Feeding a short prefill from decode: decode capacity beyond what prefill can feed it serves nothing,
            # so decode's loss is not counted (its slot demand is a queue prefill keeps filling, not a flow).
            forced = n[dst] < minimum[dst]
            series = cfg.need_based and not forced and dst is Role.DECODE and self._both_short(n, context)
            upstream = cfg.prefill_first and cfg.need_based and dst is Role.PREFILL and \
                context.demand(Role.PREFILL).coverage(n[dst]) < 1 + cfg.short_margin
            gain = move_gain_gpu_s(n[src], n[dst], len(group), 1, need[src] if not upstream else Demand(
                (0.0,) * len(need[src].rates)), need[dst], gpus[src], gpus[dst], context.horizon_s)
            waste = len(group) * (context.prefill_cache_loss if src is Role.PREFILL else 0.0)
            if waste > 0:  # prefill that lost its hits recomputes them: work that serves no one
                gain -= waste * len(need[src].rates) * context.horizon_s * gpus[src] * (1 + cfg.short_margin)
            rise = self._bottleneck_rise(n, src, dst, len(group), context) if series else 0.0
            if series:  # the cluster delivers δ of its capacity: the move's gain is the rise of δ over all of it
                gain = rise * (n[src] * gpus[src] + n[dst] * gpus[dst]) * len(need[src].rates) * context.horizon_s
            verdict = ACCEPTED
            if n[src] - len(group) < minimum[src]:
                verdict = DONOR_AT_MINIMUM
            elif series and rise < cfg.hysteresis:
                verdict, held_by_band = WITHIN_BAND, True
            elif not (forced or upstream or series) and cfg.need_based and \
                    not self._clears_band(n, src, len(group), context):
                verdict, held_by_band = WITHIN_BAND, True
            elif not forced and cfg.cost_aware and gain <= cfg.pay_factor * cost:
                verdict = COST_EXCEEDS_GAIN
            considered.append(Considered(ids, src, dst, gain, cost, verdict == ACCEPTED, verdict))
            if verdict != ACCEPTED:
                reason = verdict
                break
            share = 1.0 / len(group)
            switches += [Switch(r.instance_id, src, dst, float(r.load()), gain * share, costs[r.instance_id].total_gpu_s)
                         for r in group]
            n[src] -= len(group)
            n[dst] += 1
            if cfg.need_based and not (n[dst] < minimum[dst]) and \
                    context.demand(dst).coverage(n[dst]) >= 1 + cfg.short_margin:
                break  # no longer short: spare capacity stays where it is
        moved = n[dst] - base.current[dst]
        missing = max(0, base.target[dst] - base.current[dst])
        return dataclasses.replace(
            base, switches=tuple(switches), considered=tuple(considered),
            hold_reason=None if switches and reason is None else reason, held_by_hysteresis=held_by_band,
            blocked_by_dwell=min(blocked, (missing - moved) * math.ceil(gpus[dst] / gpus[src]))
            if reason == NO_ELIGIBLE else 0, new_instances=moved,
            shortfall=max(0, missing - moved) if reason is not None else 0)

    # ----- the wait rule -----
    def _balance_waits(self, reports, allocation, now: float, waits: StageWaits, base: SwitchPlan,
                       minimum: dict[Role, int]) -> SwitchPlan:
        """One move that shortens a turn's summed wait (waits.move_shortens_waits), or a hold that says why."""
        cfg = self.config
        n = base.current
        gpus = {Role.PREFILL: allocation.gpus_per_prefill, Role.DECODE: allocation.gpus_per_decode}
        donors = {r: math.ceil(gpus[r] / gpus[r.other]) for r in Role}  # instances of the other role one r needs
        wait = {Role.PREFILL: waits.prefill_s, Role.DECODE: waits.decode_s}
        shortens: Role | None = None  # the role a move into which shortens the summed wait
        blocked: Role | None = None  # the role with the longer wait whose donor role has nothing to give
        for role in Role:
            if n[role.other] - donors[role] < max(1, minimum[role.other]):
                if wait[role] > cfg.wait_ratio * wait[role.other] + cfg.wait_floor_s:
                    blocked = role
            elif move_shortens_waits(waits, role, n[role], n[role.other], donors[role], cfg.wait_ratio,
                                     cfg.wait_floor_s):
                shortens = role
                break
        dst = shortens if shortens is not None else blocked
        if dst is None:
            return dataclasses.replace(base, hold_reason=WAITS_BALANCED)
        if any(r.status in (InstanceStatus.DRAINING, InstanceStatus.SWITCHING) or
               (r.role_since is not None and now - r.role_since < cfg.wait_pace_s) for r in reports):
            return dataclasses.replace(base, hold_reason=PACED)
        src = dst.other
        candidates, _ = self._eligible(reports, src, now)
        group = _take_donors(candidates, gpus[dst])
        if group is None:
            return dataclasses.replace(base, hold_reason=NO_ELIGIBLE)
        ids = tuple(r.instance_id for r in group)
        costs = {r.instance_id: switch_cost(r, self.cost, 0.0, gpus[Role.PREFILL]).total_gpu_s for r in group}
        if shortens is None or n[src] - len(group) < minimum[src]:
            considered = Considered(ids, src, dst, 0.0, sum(costs.values()), False, DONOR_AT_MINIMUM)
            return dataclasses.replace(base, considered=(considered,), hold_reason=DONOR_AT_MINIMUM)
        considered = Considered(ids, src, dst, 0.0, sum(costs.values()), True, ACCEPTED)
        switches = tuple(Switch(r.instance_id, src, dst, float(r.load()), 0.0, costs[r.instance_id]) for r in group)
        return dataclasses.replace(base, switches=switches, considered=(considered,), new_instances=1)

    def _both_short(self, n: dict[Role, int], context: PlanContext) -> bool:
        """Prefill short of its demand and decode short of what it already holds. Decode's forecast demand alone
        does not count: it is a queue prefill fills, and a short prefill throttles it."""
        short = 1 + self.config.short_margin
        return context.demand(Role.PREFILL).coverage(n[Role.PREFILL]) < short and \
            n[Role.DECODE] < short * context.decode_held

    @staticmethod
    def _bottleneck_rise(n: dict[Role, int], src: Role, dst: Role, removed: int, context: PlanContext) -> float:
        """How much the move raises Eq. 1's δ, the lower coverage of the two stages in series: prefill over its mean
        demand across the lookahead (the backlog spread over it), decode over what it holds. Not the worst window:
        when both stages are short, what neither serves piles up in the last window whatever the split, and that
        hides the bottleneck."""
        def prefill_rate(removed: int) -> float:
            demand = context.demand(Role.PREFILL, removed)
            return sum(demand.rates) / len(demand.rates) + demand.backlog / len(demand.rates)
        after = dict(n)
        after[src] -= removed
        after[dst] += 1
        before = bottleneck_delta(n[Role.PREFILL], n[Role.DECODE], prefill_rate(0), context.decode_held)
        return bottleneck_delta(after[Role.PREFILL], after[Role.DECODE],
                                prefill_rate(removed if src is Role.PREFILL else 0), context.decode_held) - before

    def _clears_band(self, n: dict[Role, int], src: Role, removed: int, context: PlanContext) -> bool:
        """Condition 2: the donor's worst coverage after the move stays >= 1 + short_margin + hysteresis."""
        cfg = self.config
        return context.demand(src, removed).coverage(n[src] - removed) >= 1 + cfg.short_margin + cfg.hysteresis

    def _eligible(self, reports: Sequence[InstanceReport], role: Role, now: float) -> tuple[list[InstanceReport], int]:
        """Active instances of ``role`` past their dwell time, least loaded first; and how many dwell held back."""
        eligible, blocked = [], 0
        for report in reports:
            if report.role is not role or report.status is not InstanceStatus.ACTIVE:
                continue  # switching, draining or unhealthy: never a candidate
            dwell = self.config.dwell_s(switch_seconds(report, self.cost))
            if report.role_since is not None and now - report.role_since < dwell:
                blocked += 1
                continue
            eligible.append(report)
        eligible.sort(key=lambda r: (r.load(), r.instance_id))
        return eligible, blocked

    # ----- the paper's rule -----
    def _chase_target(self, reports, allocation: Allocation, now: float, base: SwitchPlan) -> SwitchPlan:
        current, target = base.current, base.target
        grow = next((r for r in (Role.PREFILL, Role.DECODE) if current[r] < target[r]), None)
        if grow is None:
            return dataclasses.replace(base, hold_reason=TARGET_MET)
        shrink = grow.other
        gpus_per = {Role.PREFILL: allocation.gpus_per_prefill, Role.DECODE: allocation.gpus_per_decode}
        missing = target[grow] - current[grow]
        surplus = current[shrink] - target[shrink]  # never take the shrinking role below its own need
        candidates, blocked = self._eligible(reports, shrink, now)
        switches: list[Switch] = []
        freed_gpus = 0
        for report in candidates:
            if len(switches) >= surplus or freed_gpus >= missing * gpus_per[grow]:
                break
            switches.append(Switch(report.instance_id, shrink, grow, float(report.load())))
            freed_gpus += report.gpus
        new_instances = min(missing, freed_gpus // gpus_per[grow])
        shortfall = missing - new_instances
        wanted = min(surplus, math.ceil(missing * gpus_per[grow] / gpus_per[shrink])) - len(switches)
        return dataclasses.replace(
            base, switches=tuple(switches), blocked_by_dwell=min(blocked, max(0, wanted)) if shortfall else 0,
            shortfall=shortfall, new_instances=new_instances)


def _take_donors(candidates: list[InstanceReport], gpus: int) -> list[InstanceReport] | None:
    """Pop candidates from the front until they free ``gpus`` GPUs (one instance of the growing role); None when the
    candidates run out first (what was popped is spent: the caller stops looking)."""
    group, freed = [], 0
    while candidates and freed < gpus:
        group.append(candidates.pop(0))
        freed += group[-1].gpus
    return group if freed >= gpus else None


def _coverage(n: float, demand: float) -> float:
    return n / demand if demand > 0 else math.inf
