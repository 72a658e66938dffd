"""Switch cost and move gain (cost.py), hand-computed."""

import pytest

from sglang_prorsa.policy.role_switch.capacity import InstanceReport, Role
from sglang_prorsa.policy.role_switch.cost import CostConfig, move_gain_gpu_s, served, switch_cost

P, D = Role.PREFILL, Role.DECODE


def test_decode_switch_pays_downtime_and_migration():
    config = CostConfig(kv_bytes_per_token=100_000, kv_move_gbytes_per_s=50.0)
    report = InstanceReport("d0", D, gpus=16, decode_kv_used=400_000, decode_kv_capacity=1_000_000)
    cost = switch_cost(report, config, refill_seconds_per_token=1e-5, prefill_gpus=16)
    # downtime 5 s x 16 GPUs; move 4e5 tokens x 1e5 B / 50 GB/s = 0.8 s, on 40 % of the instance's work
    assert cost.downtime_gpu_s == 80.0
    assert cost.migration_gpu_s == pytest.approx(0.8 * 0.4 * 16)
    assert cost.refill_gpu_s == 0.0
    assert cost.total_gpu_s == pytest.approx(85.12)


def test_prefill_switch_pays_the_cache_it_drops():
    report = InstanceReport("p0", P, gpus=16, prefix_cache_tokens=1_000_000, last_switch_s=7.5)
    cost = switch_cost(report, CostConfig(cache_reuse_fraction=0.5), refill_seconds_per_token=1e-5, prefill_gpus=16)
    assert cost.switch_s == 7.5 and cost.downtime_gpu_s == 120.0  # its own measured switch, not the default
    assert cost.refill_gpu_s == pytest.approx(0.5 * 1e6 * 1e-5 * 16)  # 80 GPU-s of cold re-prefill
    assert cost.migration_gpu_s == 0.0
    assert cost.to_dict()["total_gpu_s"] == pytest.approx(200.0)


def test_served_caps_at_demand():
    assert served(5, 3.2) == 3.2 and served(2, 3.2) == 2 and served(4, 0.0) == 0.0


def test_gain_counts_only_needed_service():
    # receiver needs 3, has 2: +1 instance serves 1 per window; donor 6 for demand 3 loses nothing.
    assert move_gain_gpu_s(6, 2, 1, 1, [3, 3, 3], [3, 3, 3], 1, 1, 10.0) == pytest.approx(30.0)
    # donor demand 5.5: going 6 -> 5 loses 0.5 per window
    assert move_gain_gpu_s(6, 2, 1, 1, [5.5] * 3, [3] * 3, 1, 1, 10.0) == pytest.approx(15.0)
    # receiver already covered: no gain, only the donor's loss
    assert move_gain_gpu_s(6, 4, 1, 1, [6] * 2, [3] * 2, 1, 1, 10.0) == pytest.approx(-20.0)


def test_gain_with_unequal_shapes():
    # two 1-GPU prefill instances become one 2-GPU decode instance
    assert move_gain_gpu_s(4, 1, 2, 1, [1.0], [2.0], 1, 2, 10.0) == pytest.approx(20.0)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="cache_reuse_fraction"):
        CostConfig(cache_reuse_fraction=1.5)
    with pytest.raises(ValueError, match="default_switch_s"):
        CostConfig(default_switch_s=-1)


def test_only_hits_that_would_happen_are_lost():
    # 10M tokens cached, but the instance would serve only 200k hits over the lookahead: those are the loss
    report = InstanceReport("p0", P, gpus=16, prefix_cache_tokens=10_000_000)
    capped = switch_cost(report, CostConfig(), refill_seconds_per_token=1e-5, prefill_gpus=16, reusable_tokens=2e5)
    assert capped.refill_gpu_s == pytest.approx(2e5 * 1e-5 * 16)
    uncapped = switch_cost(report, CostConfig(), refill_seconds_per_token=1e-5, prefill_gpus=16)
    assert uncapped.refill_gpu_s == pytest.approx(1e7 * 1e-5 * 16)
