import pytest

from sglang_prorsa.policy.role_switch.capacity import (
    CapacityConfig,
    InstanceReport,
    InstanceStatus,
    Role,
    decode_kv_capacity,
    decode_kv_footprint,
    gpu_budget,
    role_counts,
)

P, D = Role.PREFILL, Role.DECODE


def reports():
    return [
        InstanceReport("p0", P, queued_prompt_tokens=300, inflight_prompt_tokens=200),
        InstanceReport("d0", D, decode_kv_used=5_000, decode_kv_capacity=100_000),
        InstanceReport("d1", D, decode_kv_used=7_000, decode_kv_capacity=90_000),
        # Switching away from decode: still holds KV that must move to another decode instance.
        InstanceReport("d2", P, status=InstanceStatus.DRAINING, decode_kv_used=3_000, decode_kv_capacity=50_000),
        InstanceReport("x0", D, status=InstanceStatus.UNHEALTHY, gpus=2, decode_kv_used=1_000),
    ]


def test_capacity_is_smallest_active_decode_pool():
    # d2's small pool does not count: it is leaving decode.
    assert decode_kv_capacity(reports(), CapacityConfig()) == 90_000


def test_capacity_usable_fraction():
    assert decode_kv_capacity(reports(), CapacityConfig(usable_fraction=0.5)) == 45_000


def test_capacity_falls_back_to_profile():
    only_prefill = [InstanceReport("p0", P)]
    assert decode_kv_capacity(only_prefill, CapacityConfig(profiled_decode_kv_capacity=64_000)) == 64_000
    with pytest.raises(ValueError):
        decode_kv_capacity(only_prefill, CapacityConfig())


def test_footprint_counts_every_holder():
    assert decode_kv_footprint(reports()) == 5_000 + 7_000 + 3_000 + 1_000


def test_budget_and_counts_skip_unhealthy():
    assert gpu_budget(reports()) == 4
    assert role_counts(reports()) == {P: 2, D: 2}  # d2 counted under the role it is switching to


def test_loads():
    p0, d0 = reports()[:2]
    assert p0.load() == 500
    assert d0.load() == 5_000
