"""Robustness variants of the generator, the trainer's weight-update hint in sync mode, and the floor oracle."""

import math

import numpy as np
import pytest

from sglang_prorsa.policy.forecast.sampler import InjectionPolicy
from sglang_prorsa.policy.lifecycle.events import EventKind
from sglang_prorsa.policy.lifecycle.tracker import TrajectoryTracker
from sglang_prorsa.workload import RolloutSimulator, WorkloadGenerator, config_for, preset
from sglang_prorsa.workload.oracle import FloorOracle
from sglang_prorsa.workload.presets import Bimodal, Gamma, LogNormal, Weibull, scaled, varied


def test_variants_keep_medians_and_change_shapes():
    base = preset("general_agent", "async")
    for shape, cls in (("gamma", Gamma), ("weibull", Weibull), ("bimodal", Bimodal)):
        spec = varied(base, tool_shape=shape)
        assert all(isinstance(t.duration_s, cls) for t in spec.task.tools)
        plans = [WorkloadGenerator(spec.task, 3).plan(i) for i in range(50)]
        assert plans == [WorkloadGenerator(spec.task, 3).plan(i) for i in range(50)]  # deterministic
    weib = varied(base, tool_shape="weibull").task.tools[0].duration_s
    assert weib.median == pytest.approx(base.task.tools[0].duration_s.median)
    assert varied(base, turns_scale=2.0).task.turns.median == 2 * base.task.turns.median
    assert varied(base, prewarm_hit_rate=0.5).task.prewarm_hit_rate == 0.5
    with pytest.raises(ValueError):
        varied(base, tool_shape="cubic")


def test_scaled_keeps_the_engine_utilisation():
    spec = scaled(preset("coding_agent", "async"), 1024)
    assert spec.rollout.concurrency == 1024 and spec.engine.prefill_instances == 32  # 8 per 256 live


def test_vectorised_draws_match_the_scalar_distribution():
    rng = np.random.default_rng(0)
    d = LogNormal(6.0, 0.8, 0.2, 180)
    draws = d.sample_many(rng, 200_000)
    assert np.median(draws) == pytest.approx(6.0, rel=0.02) and draws.min() >= 0.2 and draws.max() <= 180
    g = Gamma(mean=4.0, shape=3.0)
    assert g.sample_many(rng, 200_000).mean() == pytest.approx(4.0, rel=0.02)


def test_sync_trainer_reports_weight_updates_before_each_new_step():
    spec = preset("general_agent", "sync")
    events = list(RolloutSimulator(spec, seed=1, duration_s=3000).events())
    updates = [e.ts for e in events if e.kind is EventKind.WEIGHTS_UPDATED]
    launches = sorted({e.ts for e in events if e.kind is EventKind.SAMPLED})
    assert updates and len(updates) == len(launches) - 1  # none before the first step
    for ts, launch in zip(updates, launches[1:]):
        assert launch - ts == pytest.approx(spec.rollout.weights_updated_before_s)
    tracker = TrajectoryTracker()
    for e in events:
        tracker.apply(e)
    assert tracker.rejected_count == 0 and tracker.weight_version == str(len(updates))
    assert config_for(spec).injection.policy is InjectionPolicy.SYNC


def test_floor_oracle_probabilities_match_monte_carlo():
    spec = preset("general_agent", "async")
    oracle = FloorOracle(spec, seed=1, horizon_s=10.0, samples=50_000)
    tool = spec.task.tools[0]
    rng = np.random.default_rng(5)
    t, o = tool.duration_s.sample_many(rng, 200_000), spec.task.agent_overhead_s.sample_many(rng, 200_000)
    for e in (0.5, 6.0):
        keep = t > e
        mc = float(np.mean(t[keep] - e + o[keep] < 10.0))
        q = oracle._q(("tool", "tool:" + tool.name), oracle.pool["tool:" + tool.name], oracle.pool["overhead"], e, 10.0)
        assert q == pytest.approx(mc, abs=0.02)


def test_floor_oracle_forecasts_a_short_run():
    spec = scaled(preset("general_agent", "async"), 64)
    oracle = FloorOracle(spec, seed=2, horizon_s=10.0, samples=20_000)
    forecasts = []
    next_t = 0.0
    for event in RolloutSimulator(spec, seed=2, duration_s=120).events():
        while event.ts >= next_t:
            forecasts.append(oracle.forecast(next_t))
            next_t += 10.0
        oracle.observe(event)
    arrivals = [a for a, _ in forecasts]
    assert len(forecasts) == 12 and all(math.isfinite(a) and a >= 0 for a in arrivals)
    assert arrivals[0] == 0 and arrivals[1] > 0  # nothing seen before the first window; then returns are due
