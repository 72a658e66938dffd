"""Prefill-decode allocation of §4.2, Eq. 1: the target instance ratio n^P : n^D.

Eq. 1 sizes each role from the forecast with a shared safety margin δ ≥ 0:

    n^P = ⌈ Ŵ^P / (S·θ^P) · (1 + δ) ⌉        n^D = ⌈ (K^D_t + K̂^D) / C^D_KV · (1 + δ) ⌉

and picks the largest δ with m^P·n^P + m^D·n^D ≤ G. If even δ = 0 does not fit, it picks the budget-feasible integer
allocation minimising max(a/n^P, b/n^D), where a = Ŵ^P/(S·θ^P) and b = (K^D_t + K̂^D)/C^D_KV are the two demands
in instance units.

Algorithm. Both cases are one problem. Call ``coverage`` c(p, d) = min(p/a, d/b), the capacity-to-demand ratio of the
worse-served role (a side with zero demand is never the worse one). An allocation supports margin δ exactly when
c ≥ 1 + δ, and minimising the larger demand ratio is maximising c. So we find c* = max c(p, d) over integers
p ≥ P_min, d ≥ D_min, m^P·p + m^D·d ≤ G, then read the instance counts off Eq. 1 at 1 + δ* = c*:

  * for a fixed p the best d is d(p) = ⌊(G − m^P·p)/m^D⌋, so c* = max_p min(p/a, d(p)/b);
  * p/a increases and d(p)/b does not, so the predicate p·b ≤ d(p)·a holds on a prefix of [P_min, P_max]; a binary
    search finds its last p₁, and c* = max(p₁/a, d(p₁+1)/b) (left of p₁ the minimum is p/a ≤ p₁/a, right of it the
    minimum is d(p)/b ≤ d(p₁+1)/b);
  * n^P = max(P_min, ⌈a·c*⌉), n^D = max(D_min, ⌈b·c*⌉). These never exceed the optimal (p, d), so they fit, and any
    larger δ would need coverage above c*, which no budget-feasible allocation has: δ* is maximal.

Beyond the paper, ``decode_slot_demand`` (optional) lets b count request slots when the engines' batch limit binds
before their KV pools do (capacity.decode_slot_demand); with it 0, b is Eq. 1's KV term exactly.

Arithmetic is exact: the float inputs become ``Fraction``s (every float is a dyadic rational), so ceilings and the
comparisons p·b ≤ d·a never round the wrong way at a step of ⌈·⌉. Cost: O(log(G/m^P)) comparisons of rationals of
bounded size, i.e. about 12 steps for G = 4096 (microseconds); a linear scan over p would be O(G/m^P).

Ties: when several allocations reach c*, Eq. 1's ceilings pick the smallest one and report the rest as ``spare_gpus``.
The planner leaves spare capacity in whatever role it already has, which is what "fewest role changes" asks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from fractions import Fraction


@dataclass(frozen=True)
class AllocatorConfig:
    gpus_per_prefill: int = 1  # m^P: the prefill parallel configuration's GPUs per instance
    gpus_per_decode: int = 1  # m^D: may differ, e.g. a larger decode EP for more KV capacity (§4.2)
    min_prefill: int = 1  # never leave a role empty: a request arriving there would have nowhere to go
    min_decode: int = 1

    def __post_init__(self) -> None:
        if self.gpus_per_prefill < 1 or self.gpus_per_decode < 1:
            raise ValueError("GPUs per instance must be at least 1")
        if self.min_prefill < 0 or self.min_decode < 0:
            raise ValueError("minimum instance counts cannot be negative")


@dataclass(frozen=True)
class AllocationInputs:
    """The plain numbers Eq. 1 needs; the forecaster and the estimators fill them in."""

    prefill_tokens_forecast: float  # Ŵ^P: full-prompt tokens over the horizon (queued + in flight + predicted)
    horizon_s: float  # S
    theta_p: float  # θ^P: full-prompt tokens per second per prefill instance
    decode_kv_now: float  # K^D_t
    decode_kv_forecast: float  # K̂^D: KV of requests predicted to enter decode within the horizon
    decode_kv_capacity: float  # C^D_KV: usable KV per decode instance
    gpu_budget: int  # G
    # Beyond the paper: decode demand in request slots (instances), capacity.decode_slot_demand; 0 = KV only (Eq. 1).
    decode_slot_demand: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prefill_tokens_forecast", "decode_kv_now", "decode_kv_forecast", "decode_slot_demand"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        for name in ("horizon_s", "theta_p", "decode_kv_capacity"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        if self.gpu_budget < 0:
            raise ValueError(f"gpu_budget must be >= 0, got {self.gpu_budget}")

    def prefill_demand(self) -> Fraction:
        """a = Ŵ^P / (S·θ^P): prefill instances needed at δ = 0, before rounding up."""
        return Fraction(self.prefill_tokens_forecast) / (Fraction(self.horizon_s) * Fraction(self.theta_p))

    def decode_demand(self) -> Fraction:
        """b = (K^D_t + K̂^D) / C^D_KV: decode instances needed at δ = 0, before rounding up; the slot demand instead
        when it is larger (an engine whose batch limit binds before its KV pool does)."""
        kv = (Fraction(self.decode_kv_now) + Fraction(self.decode_kv_forecast)) / Fraction(self.decode_kv_capacity)
        return max(kv, Fraction(self.decode_slot_demand))


@dataclass(frozen=True)
class Allocation:
    """The target of Eq. 1 with what it was derived from.

    ``coverage`` = min over roles of capacity/demand for (n_prefill, n_decode) at the optimum, i.e. 1 + δ when
    feasible and 1 / (the minimised larger demand ratio) when not; ``inf`` when neither role has demand.
    """

    n_prefill: int
    n_decode: int
    delta: float  # δ*, 0.0 when even δ = 0 does not fit, inf when there is no demand at all
    coverage: float
    feasible: bool
    spare_gpus: int
    prefill_demand: float  # a
    decode_demand: float  # b
    gpus_per_prefill: int
    gpus_per_decode: int

    @property
    def max_demand_ratio(self) -> float:
        """The larger of the two demand-to-capacity ratios the infeasible case minimises."""
        if math.isinf(self.coverage):
            return 0.0
        return math.inf if self.coverage == 0 else 1.0 / self.coverage

    def to_dict(self) -> dict:
        out = asdict(self)
        # JSON has no infinity; None reads as "unbounded" (no demand on either side).
        for key in ("delta", "coverage"):
            if math.isinf(out[key]):
                out[key] = None
        return out


def coverage_of(n_prefill: int, n_decode: int, prefill_demand: float, decode_demand: float) -> float:
    """min(n^P/a, n^D/b), the worse-served role's capacity-to-demand ratio; inf when neither role has demand."""
    sides = [n / demand for n, demand in ((n_prefill, prefill_demand), (n_decode, decode_demand)) if demand > 0]
    return min(sides, default=math.inf)


def allocate(inputs: AllocationInputs, config: AllocatorConfig = AllocatorConfig()) -> Allocation:
    """Eq. 1: the largest shared margin δ within the GPU budget, or the minimax fallback when δ = 0 does not fit."""
    a, b = inputs.prefill_demand(), inputs.decode_demand()
    mp, md, budget = config.gpus_per_prefill, config.gpus_per_decode, inputs.gpu_budget
    p_min = config.min_prefill
    p_max = (budget - md * config.min_decode) // mp
    if p_max < p_min:
        raise ValueError(
            f"G={budget} cannot host the minimum {config.min_prefill} prefill x {mp} GPUs "
            f"+ {config.min_decode} decode x {md} GPUs"
        )

    best = _best_coverage(a, b, p_min, p_max, lambda p: (budget - mp * p) // md)
    if best is None:  # neither role has demand: any margin fits, keep the minimum of each role
        n_prefill, n_decode, coverage = config.min_prefill, config.min_decode, math.inf
    else:
        n_prefill = max(config.min_prefill, math.ceil(a * best))
        n_decode = max(config.min_decode, math.ceil(b * best))
        coverage = _to_float(best)
    feasible = best is None or best >= 1
    return Allocation(
        n_prefill=n_prefill,
        n_decode=n_decode,
        delta=coverage - 1 if feasible else 0.0,
        coverage=coverage,
        feasible=feasible,
        spare_gpus=budget - mp * n_prefill - md * n_decode,
        prefill_demand=float(a),
        decode_demand=float(b),
        gpus_per_prefill=mp,
        gpus_per_decode=md,
    )


def _to_float(x: Fraction) -> float:
    try:
        return float(x)
    except OverflowError:  # a vanishing demand (e.g. 5e-324 tokens) gives a coverage beyond float range
        return math.inf


def _best_coverage(
    a: Fraction, b: Fraction, p_min: int, p_max: int, decode_room: Callable[[int], int]
) -> Fraction | None:
    """c* = max over p in [p_min, p_max] of min(p/a, d(p)/b), with d(p) = decode_room(p) (see module docstring);
    None when neither role has demand and c* is unbounded."""
    if a == 0 and b == 0:
        return None
    if a == 0:  # only decode has demand: give it everything the prefill minimum leaves
        return Fraction(decode_room(p_min)) / b
    if b == 0:
        return Fraction(p_max) / a
    if p_min * b > decode_room(p_min) * a:  # decode is the worse-served role even at the fewest prefill instances
        return Fraction(decode_room(p_min)) / b
    lo, hi = p_min, p_max  # invariant: the predicate p·b <= d(p)·a holds at lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid * b <= decode_room(mid) * a:
            lo = mid
        else:
            hi = mid - 1
    best = Fraction(lo) / a
    if lo < p_max:
        best = max(best, Fraction(decode_room(lo + 1)) / b)
    return best
