"""Hand-checked allocations of Eq. 1. Demands are chosen so a = Ŵ^P/(S·θ^P) and b = (K^D_t + K̂^D)/C^D_KV are round."""

import json
import math

import pytest

from sglang_prorsa.policy.role_switch.allocator import AllocationInputs, AllocatorConfig, allocate


def inputs(a: float, b: float, budget: int) -> AllocationInputs:
    """Inputs with prefill demand a and decode demand b in instance units (S = 10 s, θ^P = 100 tok/s, C = 1000)."""
    return AllocationInputs(
        prefill_tokens_forecast=a * 1000,
        horizon_s=10.0,
        theta_p=100.0,
        decode_kv_now=b * 600,
        decode_kv_forecast=b * 400,
        decode_kv_capacity=1000.0,
        gpu_budget=budget,
    )


def test_feasible_balanced():
    # a = b = 3, G = 8: (4, 4) covers both by 4/3, so δ = 1/3 and n = ⌈3·4/3⌉ = 4 on each side.
    alloc = allocate(inputs(3, 3, 8))
    assert (alloc.n_prefill, alloc.n_decode) == (4, 4)
    assert alloc.feasible and alloc.delta == pytest.approx(1 / 3)
    assert alloc.spare_gpus == 0


def test_feasible_decode_heavy():
    # a = 2, b = 6, G = 12: p/2 = (12 − p)/6 at p = 3, d = 9 -> δ = 0.5.
    alloc = allocate(inputs(2, 6, 12))
    assert (alloc.n_prefill, alloc.n_decode) == (3, 9)
    assert alloc.delta == pytest.approx(0.5)


def test_infeasible_minimises_larger_ratio():
    # a = 3, b = 9, G = 8: even δ = 0 needs 12 GPUs. (2, 6) has ratios 3/2 and 9/6 = 3/2; every other split is worse.
    alloc = allocate(inputs(3, 9, 8))
    assert not alloc.feasible
    assert alloc.delta == 0.0
    assert (alloc.n_prefill, alloc.n_decode) == (2, 6)
    assert alloc.max_demand_ratio == pytest.approx(1.5)


def test_unequal_gpus_per_instance_decode_wider():
    # m^P = 1, m^D = 2, a = b = 3, G = 16: best p ∈ {5, 6} reaches 5/3; Eq. 1 at 1 + δ = 5/3 gives (5, 5) = 15 GPUs.
    alloc = allocate(inputs(3, 3, 16), AllocatorConfig(gpus_per_prefill=1, gpus_per_decode=2))
    assert (alloc.n_prefill, alloc.n_decode) == (5, 5)
    assert alloc.delta == pytest.approx(2 / 3)
    assert alloc.spare_gpus == 1


def test_unequal_gpus_per_instance_prefill_wider():
    # m^P = 2, m^D = 1, a = 1, b = 4, G = 10: p = 2 leaves 6 decode GPUs: min(2, 1.5) = 1.5; p = 1, 3 give 1.
    alloc = allocate(inputs(1, 4, 10), AllocatorConfig(gpus_per_prefill=2, gpus_per_decode=1))
    assert (alloc.n_prefill, alloc.n_decode) == (2, 6)
    assert alloc.delta == pytest.approx(0.5)
    assert alloc.spare_gpus == 0


def test_tie_takes_eq1_counts_and_reports_spare():
    # a = b = 1, G = 5: (2, 3) and (3, 2) both cover by 2; Eq. 1 at δ = 1 asks for (2, 2), one GPU spare.
    alloc = allocate(inputs(1, 1, 5))
    assert (alloc.n_prefill, alloc.n_decode) == (2, 2)
    assert alloc.delta == pytest.approx(1.0)
    assert alloc.spare_gpus == 1


def test_zero_prefill_demand_keeps_minimum_prefill():
    # a = 0, b = 3, G = 8: prefill keeps its one instance, decode gets 7 -> δ = 7/3 − 1.
    alloc = allocate(inputs(0, 3, 8))
    assert (alloc.n_prefill, alloc.n_decode) == (1, 7)
    assert alloc.delta == pytest.approx(4 / 3)


def test_zero_prefill_demand_without_minimum():
    alloc = allocate(inputs(0, 3, 8), AllocatorConfig(min_prefill=0))
    assert (alloc.n_prefill, alloc.n_decode) == (0, 8)
    assert alloc.delta == pytest.approx(5 / 3)


def test_zero_decode_demand():
    # b = 0, a = 2, G = 8: decode keeps one instance, prefill gets 7 -> coverage 3.5.
    alloc = allocate(inputs(2, 0, 8))
    assert (alloc.n_prefill, alloc.n_decode) == (7, 1)
    assert alloc.delta == pytest.approx(2.5)


def test_no_demand_at_all_is_unbounded_and_json_safe():
    alloc = allocate(inputs(0, 0, 8))
    assert (alloc.n_prefill, alloc.n_decode) == (1, 1)
    assert math.isinf(alloc.delta) and alloc.spare_gpus == 6
    assert json.loads(json.dumps(alloc.to_dict(), allow_nan=False))["delta"] is None


def test_exact_at_a_ceiling_step():
    # a = 0.7/(0.1·1.3) ≈ 5.38, no decode demand, G = 24: prefill binds at p = 23 with 1 + δ = 23/a. In floats
    # a·(23/a) = 23.000000000000004 and ⌈·⌉ would ask for 24 prefill instances, over budget with the decode minimum.
    alloc = allocate(AllocationInputs(0.7, 0.1, 1.3, 0.0, 0.0, 1.0, 24))
    assert (alloc.n_prefill, alloc.n_decode) == (23, 1)
    assert alloc.spare_gpus == 0


def test_budget_below_minimum_instances_is_an_error():
    with pytest.raises(ValueError):
        allocate(inputs(1, 1, 3), AllocatorConfig(gpus_per_prefill=2, gpus_per_decode=2))


@pytest.mark.parametrize("field", ["horizon_s", "theta_p", "decode_kv_capacity"])
def test_non_positive_rates_rejected(field):
    kwargs = dict(
        prefill_tokens_forecast=1.0, horizon_s=10.0, theta_p=1.0, decode_kv_now=0.0,
        decode_kv_forecast=0.0, decode_kv_capacity=1.0, gpu_budget=4,
    )
    kwargs[field] = 0.0
    with pytest.raises(ValueError):
        AllocationInputs(**kwargs)
