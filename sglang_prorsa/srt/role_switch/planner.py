"""Switch planner (Appendix C): which instances change role to move the cluster toward the Eq. 1 target.

Rule of the paper: make only the role changes the target requires, each on the least-loaded eligible instance
(prefill load = queued + in-flight prompt tokens, decode load = decode KV footprint), and never touch an instance that
is already switching, draining or unhealthy.

The target counts are what each role *needs*; GPUs the allocator reports as spare keep whatever role they have, so
the plan moves only the growing role's shortfall. With m^P = m^D every change is one instance flipping role. With
m^P ≠ m^D the planner frees GPUs from least-loaded instances of the shrinking role until they can host the missing
instances of the growing role (``new_instances``); regrouping those GPUs is the executor's job.

Beyond the paper, two guards against flapping, both on by default (``PlannerConfig``):
  * dwell: an instance that got a new role less than ``min_dwell_s`` ago is not eligible to change again, so a
    switch (~5 s in the paper) is not undone before it has served at least a few horizons;
  * hysteresis: no switch unless the target improves coverage (min over roles of capacity/demand, see allocator)
    by more than a factor ``1 + hysteresis`` over the current roles. Forecast noise that moves the target by one
    instance around a near-tie then changes nothing. A role below its configured minimum is always fixed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_prorsa.srt.role_switch.allocator import Allocation, coverage_of
from sglang_prorsa.srt.role_switch.capacity import InstanceReport, InstanceStatus, Role, role_counts


@dataclass(frozen=True)
class PlannerConfig:
    min_dwell_s: float = 30.0  # three default horizons (S = 10 s); 0 turns the dwell guard off
    hysteresis: float = 0.1  # required relative coverage gain; 0 turns the band off
    min_prefill: int = 1  # must match AllocatorConfig: the roles the hysteresis band may never hold below
    min_decode: int = 1

    def __post_init__(self) -> None:
        if self.min_dwell_s < 0 or self.hysteresis < 0:
            raise ValueError("min_dwell_s and hysteresis must be >= 0")

    @classmethod
    def unguarded(cls) -> PlannerConfig:
        """The paper's planner as written: no dwell time, no hysteresis band."""
        return cls(min_dwell_s=0.0, hysteresis=0.0)


@dataclass(frozen=True)
class Switch:
    instance_id: str
    src: Role
    dst: Role
    load: float  # the load it had when chosen (prefill tokens or decode KV), for the decision log


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

    def to_dict(self) -> dict:
        return {
            "switches": [
                {"instance_id": s.instance_id, "from": s.src.value, "to": s.dst.value, "load": s.load}
                for s in self.switches
            ],
            "current": {r.value: n for r, n in self.current.items()},
            "target": {r.value: n for r, n in self.target.items()},
            "current_coverage": None if math.isinf(self.current_coverage) else self.current_coverage,
            "held_by_hysteresis": self.held_by_hysteresis,
            "blocked_by_dwell": self.blocked_by_dwell,
            "shortfall": self.shortfall,
            "new_instances": self.new_instances,
        }


class SwitchPlanner:
    def __init__(self, config: PlannerConfig = PlannerConfig()) -> None:
        self.config = config

    def plan(self, reports: Sequence[InstanceReport], allocation: Allocation, now: float) -> SwitchPlan:
        """Role changes that move ``reports`` toward ``allocation``'s target, as of time ``now``."""
        current = role_counts(reports)
        target = {Role.PREFILL: allocation.n_prefill, Role.DECODE: allocation.n_decode}
        current_coverage = coverage_of(
            current[Role.PREFILL], current[Role.DECODE], allocation.prefill_demand, allocation.decode_demand
        )
        unchanged = SwitchPlan(switches=(), current=current, target=target, current_coverage=current_coverage)

        grow = next((r for r in (Role.PREFILL, Role.DECODE) if current[r] < target[r]), None)
        if grow is None:
            return unchanged
        if self._within_band(current, current_coverage, allocation.coverage):
            return dataclasses.replace(unchanged, held_by_hysteresis=True)

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
        # Dwell only explains a shortfall when the instances it held back could have closed it.
        wanted = min(surplus, math.ceil(missing * gpus_per[grow] / gpus_per[shrink])) - len(switches)
        return SwitchPlan(
            switches=tuple(switches),
            current=current,
            target=target,
            current_coverage=current_coverage,
            blocked_by_dwell=min(blocked, max(0, wanted)) if shortfall else 0,
            shortfall=shortfall,
            new_instances=new_instances,
        )

    def _within_band(self, current: dict[Role, int], current_coverage: float, target_coverage: float) -> bool:
        """True when the target is not enough better than the current roles to be worth a switch."""
        if current[Role.PREFILL] < self.config.min_prefill or current[Role.DECODE] < self.config.min_decode:
            return False
        if self.config.hysteresis == 0:
            return False
        return current_coverage * (1 + self.config.hysteresis) >= target_coverage

    def _eligible(self, reports: Sequence[InstanceReport], role: Role, now: float) -> tuple[list[InstanceReport], int]:
        """Active instances of ``role`` past their dwell time, least loaded first; and how many dwell held back."""
        eligible, blocked = [], 0
        for report in reports:
            if report.role is not role or report.status is not InstanceStatus.ACTIVE:
                continue  # switching, draining or unhealthy: never a candidate
            if report.role_since is not None and now - report.role_since < self.config.min_dwell_s:
                blocked += 1
                continue
            eligible.append(report)
        eligible.sort(key=lambda r: (r.load(), r.instance_id))
        return eligible, blocked
