"""One control tick of the role switcher: forecast numbers and instance reports in, a logged decision out.

Glue only: θ^P comes from ``ThroughputEstimator``, C^D_KV, K^D_t and G from the instance reports (capacity.py), the
target from Eq. 1 (allocator.py) and the role changes from the planner. The last decision, with every input of Eq. 1
that produced it, is kept as a plain JSON-able dict for the server to expose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from sglang_prorsa.srt.role_switch.allocator import Allocation, AllocationInputs, AllocatorConfig, allocate
from sglang_prorsa.srt.role_switch.capacity import (
    CapacityConfig,
    InstanceReport,
    decode_kv_capacity,
    decode_kv_footprint,
    gpu_budget,
)
from sglang_prorsa.srt.role_switch.planner import PlannerConfig, SwitchPlan, SwitchPlanner
from sglang_prorsa.srt.role_switch.throughput import ThroughputEstimator, WorkloadProfile
from sglang_prorsa.srt.utils.clock import Clock


@dataclass(frozen=True)
class ControllerConfig:
    horizon_s: float = 10.0  # S, the forecast horizon (Appendix B default)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)

    def __post_init__(self) -> None:
        planner, allocator = self.planner, self.allocator
        if (planner.min_prefill, planner.min_decode) != (allocator.min_prefill, allocator.min_decode):
            raise ValueError("planner and allocator must agree on the minimum instances per role")


@dataclass(frozen=True)
class Decision:
    time_s: float
    inputs: AllocationInputs
    allocation: Allocation
    plan: SwitchPlan
    profile: WorkloadProfile | None = None
    theta_p_measured: bool = False  # False: θ^P is still the profiled value for this workload profile

    def to_dict(self) -> dict:
        """Ŵ^P, K^D_t, K̂^D, θ^P, C^D_KV, δ, target and planned switches, as plain JSON types."""
        return {
            "time_s": self.time_s,
            "inputs": {
                "W_P": self.inputs.prefill_tokens_forecast,
                "S": self.inputs.horizon_s,
                "theta_P": self.inputs.theta_p,
                "theta_P_measured": self.theta_p_measured,
                "K_D_now": self.inputs.decode_kv_now,
                "K_D_forecast": self.inputs.decode_kv_forecast,
                "C_D_KV": self.inputs.decode_kv_capacity,
                "G": self.inputs.gpu_budget,
                "profile": asdict(self.profile) if self.profile is not None else None,
            },
            "allocation": self.allocation.to_dict(),
            "delta": self.allocation.to_dict()["delta"],
            "target": {"prefill": self.allocation.n_prefill, "decode": self.allocation.n_decode},
            "plan": self.plan.to_dict(),
        }


class RoleSwitchController:
    def __init__(self, config: ControllerConfig, throughput: ThroughputEstimator, clock: Clock) -> None:
        self.config = config
        self.throughput = throughput
        self._clock = clock
        self._planner = SwitchPlanner(config.planner)
        self._last: Decision | None = None

    def inputs_from(
        self,
        prefill_tokens_forecast: float,
        decode_kv_forecast: float,
        reports: Sequence[InstanceReport],
        profile: WorkloadProfile,
    ) -> AllocationInputs:
        """Assemble Eq. 1's inputs: the two forecasts plus θ^P, K^D_t, C^D_KV and G measured here."""
        return AllocationInputs(
            prefill_tokens_forecast=prefill_tokens_forecast,
            horizon_s=self.config.horizon_s,
            theta_p=self.throughput.estimate(profile),
            decode_kv_now=decode_kv_footprint(reports),
            decode_kv_forecast=decode_kv_forecast,
            decode_kv_capacity=decode_kv_capacity(reports, self.config.capacity),
            gpu_budget=gpu_budget(reports),
        )

    def step(
        self,
        prefill_tokens_forecast: float,
        decode_kv_forecast: float,
        reports: Sequence[InstanceReport],
        profile: WorkloadProfile,
    ) -> Decision:
        """A full tick from the forecaster's two numbers (Ŵ^P, K̂^D)."""
        inputs = self.inputs_from(prefill_tokens_forecast, decode_kv_forecast, reports, profile)
        return self.decide(inputs, reports, profile=profile)

    def decide(
        self, inputs: AllocationInputs, reports: Sequence[InstanceReport], profile: WorkloadProfile | None = None
    ) -> Decision:
        """Eq. 1 then the planner, on inputs the caller assembled (the cluster simulator passes its own)."""
        now = self._clock.now()
        allocation = allocate(inputs, self.config.allocator)
        plan = self._planner.plan(reports, allocation, now)
        measured = profile is not None and self.throughput.is_measured(profile)
        self._last = Decision(now, inputs, allocation, plan, profile, measured)
        return self._last

    def last_decision(self) -> dict | None:
        return self._last.to_dict() if self._last is not None else None
