"""Whole runs: same seed -> identical results; the control plane sees a valid event stream; modes behave."""

import dataclasses

import pytest

from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import best_static, simulate

MODEL = load_model("mimo_v25_pro")
SMALL = ClusterConfig(gpus=64)  # 4 instances


def comparable(result) -> dict:
    d = result.to_dict()
    for key in ("wall_s", "sim_gpu_hours_per_wall_s"):
        d.pop(key)
    return d


@pytest.mark.parametrize("mode", ["colocated", "static", "adaptive"])
def test_same_seed_same_result(mode):
    rollout = RolloutConfig(preset="general_agent", staleness=2, group_size=8, groups_per_step=2, steps=2, seed=3)
    cluster = dataclasses.replace(SMALL, mode=mode, prefill_instances=2 if mode == "static" else 0)
    a, b = simulate(MODEL, cluster, rollout), simulate(MODEL, cluster, rollout)
    assert comparable(a) == comparable(b)
    c = simulate(MODEL, cluster, dataclasses.replace(rollout, seed=4))
    assert comparable(c) != comparable(a)


def test_adaptive_drives_the_control_plane():
    rollout = RolloutConfig(preset="coding_agent", staleness=2, group_size=8, groups_per_step=2, steps=2)
    r = simulate(MODEL, dataclasses.replace(SMALL, mode="adaptive"), rollout)
    assert r.steps_done == 2 and r.trajectories_finished > 0
    assert r.wape_prefill is not None and r.windows  # the predictor scored its windows
    assert r.theta_samples > 0  # prefill busy intervals reached the θ model
    assert sum(r.hold_reasons.values()) >= len(r.timeline)  # one decision per tick, plus weight-update ticks
    assert all(p.n_prefill + p.n_decode == r.instances for p in r.timeline)


def test_adaptive_fixes_a_starved_role():
    # Coding agent (256 trajectories) on 4 instances starting with 3 prefill : 1 decode: decode is short (its slots
    # are full), the switch goes its way and pays.
    rollout = RolloutConfig(preset="coding_agent", group_size=32, groups_per_step=8, steps=1)
    r = simulate(MODEL, dataclasses.replace(SMALL, mode="adaptive", prefill_instances=3), rollout)
    assert r.switches >= 1 and all(s["to"] == "decode" for s in r.switch_log)
    assert r.switches_paid >= 1 and sum(r.switches_per_step) == r.switches
    static = simulate(MODEL, dataclasses.replace(SMALL, mode="static", prefill_instances=3), rollout)
    assert r.mean_step_s < static.mean_step_s


def test_sync_math_static_and_colocated_finish_every_trajectory():
    rollout = RolloutConfig(preset="math", group_size=8, groups_per_step=4, steps=2)
    colo = simulate(MODEL, SMALL, rollout)
    best, runs = best_static(MODEL, dataclasses.replace(SMALL, mode="static"), rollout)
    assert colo.trajectories_finished == 64 and best.trajectories_finished == 64
    assert [r.prefill_instances for r in runs] == [1, 2, 3]
    assert best.mean_step_s == min(r.mean_step_s for r in runs)
    assert colo.switches == 0 and colo.wape_prefill is None
    assert 0.0 <= colo.interference_idle_ratio + colo.imbalance_idle_ratio == pytest.approx(colo.sync_idle_ratio)
    assert colo.sync_idle_ratio <= colo.gpu_idle_ratio <= 1.0


def test_mixed_batches_alternate_tasks():
    rollout = RolloutConfig(preset="math+coding_agent", group_size=4, groups_per_step=2, steps=1)
    r = simulate(MODEL, dataclasses.replace(SMALL, mode="static", prefill_instances=2), rollout)
    assert r.trajectories_finished == 8 and r.preset == "math+coding_agent"


def test_routing_changes_prefix_reuse():
    rollout = RolloutConfig(preset="coding_agent", group_size=8, groups_per_step=2, steps=1)
    base = dataclasses.replace(SMALL, mode="static", prefill_instances=2)
    sticky = simulate(MODEL, dataclasses.replace(base, routing="rank_aware"), rollout)
    default = simulate(MODEL, base, rollout)
    assert sticky.prefix_hit_ratio > default.prefix_hit_ratio > 0.0
