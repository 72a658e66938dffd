"""Property tests of Eq. 1 against brute force over every integer allocation (small G)."""

import math
from fractions import Fraction

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sglang_prorsa.policy.role_switch.allocator import AllocationInputs, AllocatorConfig, allocate

demand_tokens = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
rates = st.floats(min_value=0.05, max_value=1e4, allow_nan=False)


@st.composite
def problems(draw):
    config = AllocatorConfig(
        gpus_per_prefill=draw(st.integers(1, 4)),
        gpus_per_decode=draw(st.integers(1, 4)),
        min_prefill=draw(st.integers(0, 2)),
        min_decode=draw(st.integers(0, 2)),
    )
    budget = draw(st.integers(0, 48))
    assume(config.gpus_per_prefill * config.min_prefill + config.gpus_per_decode * config.min_decode <= budget)
    inputs = AllocationInputs(
        prefill_tokens_forecast=draw(demand_tokens),
        horizon_s=draw(st.floats(min_value=0.5, max_value=60.0)),
        theta_p=draw(rates),
        decode_kv_now=draw(demand_tokens),
        decode_kv_forecast=draw(demand_tokens),
        decode_kv_capacity=draw(rates),
        gpu_budget=budget,
    )
    return inputs, config


def coverage(p: int, d: int, a: Fraction, b: Fraction) -> Fraction | float:
    sides = [Fraction(n) / x for n, x in ((p, a), (d, b)) if x > 0]
    return min(sides, default=math.inf)


def brute_force_best(inputs: AllocationInputs, config: AllocatorConfig) -> Fraction | float:
    """max coverage over all budget-feasible (p, d), enumerated without any structure assumption."""
    a, b = inputs.prefill_demand(), inputs.decode_demand()
    best = None
    for p in range(config.min_prefill, inputs.gpu_budget + 1):
        for d in range(config.min_decode, inputs.gpu_budget + 1):
            if config.gpus_per_prefill * p + config.gpus_per_decode * d <= inputs.gpu_budget:
                c = coverage(p, d, a, b)
                best = c if best is None else max(best, c)
    return best


def eq1_counts(c: Fraction, a: Fraction, b: Fraction, config: AllocatorConfig) -> tuple[int, int]:
    return max(config.min_prefill, math.ceil(a * c)), max(config.min_decode, math.ceil(b * c))


@settings(max_examples=300, deadline=None)
@given(problems())
def test_within_budget_and_optimal(problem):
    inputs, config = problem
    alloc = allocate(inputs, config)
    a, b = inputs.prefill_demand(), inputs.decode_demand()
    used = config.gpus_per_prefill * alloc.n_prefill + config.gpus_per_decode * alloc.n_decode
    assert used + alloc.spare_gpus == inputs.gpu_budget
    assert 0 <= alloc.spare_gpus
    assert alloc.n_prefill >= config.min_prefill and alloc.n_decode >= config.min_decode

    best = brute_force_best(inputs, config)
    achieved = coverage(alloc.n_prefill, alloc.n_decode, a, b)
    # The returned counts reach the best coverage any feasible allocation has (δ maximal, or max ratio minimal).
    assert achieved >= best
    assert alloc.feasible == (best >= 1)
    if math.isinf(best):
        assert math.isinf(alloc.delta)
        return
    assert math.isclose(alloc.coverage, float(best), rel_tol=1e-12)
    if alloc.feasible:
        assert math.isclose(alloc.delta, float(best - 1), rel_tol=1e-12, abs_tol=1e-12)
    # And they are Eq. 1's counts at 1 + δ = best, not merely some allocation that happens to reach it.
    assert (alloc.n_prefill, alloc.n_decode) == eq1_counts(best, a, b, config)


@settings(max_examples=200, deadline=None)
@given(problems())
def test_no_larger_margin_fits(problem):
    """δ is maximal: Eq. 1 at any coverage above the optimum asks for more GPUs than the budget. When feasible this
    is "no larger δ fits"; when not, "no smaller max demand ratio fits"."""
    inputs, config = problem
    alloc = allocate(inputs, config)
    if math.isinf(alloc.coverage):
        return
    a, b = inputs.prefill_demand(), inputs.decode_demand()
    best = brute_force_best(inputs, config)
    for epsilon in (Fraction(1, 10**12), Fraction(1, 1000), Fraction(1, 2)):
        p, d = eq1_counts(best + epsilon, a, b, config)
        assert config.gpus_per_prefill * p + config.gpus_per_decode * d > inputs.gpu_budget


@settings(max_examples=100, deadline=None)
@given(problems(), st.integers(1, 8))
def test_more_budget_never_lowers_coverage(problem, extra):
    inputs, config = problem
    richer = AllocationInputs(**{**inputs.__dict__, "gpu_budget": inputs.gpu_budget + extra})
    assert allocate(richer, config).coverage >= allocate(inputs, config).coverage
