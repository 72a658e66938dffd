"""The generator's held-out dimensions: tool-time shapes with their own parameter and scale, a bounded decode KV
cache in the simulator, trainers that send only some hints, and the seeded family built from them."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_prorsa.policy.lifecycle.events import ENGINE_EVENT_KINDS, EventKind
from sglang_prorsa.policy.lifecycle.states import TrajState
from sglang_prorsa.policy.lifecycle.tracker import TrajectoryTracker
from sglang_prorsa.workload import RolloutSimulator, WorkloadGenerator, preset
from sglang_prorsa.workload.family import DIMENSIONS, draw_settings, spec_from_params
from sglang_prorsa.workload.hints import HINT_SETS, TRAINER_HINT_KINDS, dropped_kinds, filter_hints
from sglang_prorsa.workload.presets import (
    TOOL_SHAPES,
    Bimodal,
    EngineModel,
    Gamma,
    LogNormal,
    Weibull,
    reshape_duration,
    scaled,
)


@pytest.mark.parametrize("shape, cls, param", [("lognormal", LogNormal, 0.9), ("gamma", Gamma, 2.0),
                                               ("weibull", Weibull, 0.6), ("bimodal", Bimodal, 0.5)])
def test_reshaped_tool_times_keep_the_scaled_median(shape, cls, param):
    base = LogNormal(6.0, 0.8, 0.2, 1e6)
    d = reshape_duration(base, shape, scale=2.5, param=param, spread=9.0)
    assert isinstance(d, cls)
    draws = d.sample_many(np.random.default_rng(1), 400_000)
    if shape == "bimodal":  # modes at median / 3 and median * 3, half the mass each
        assert d.fast.median == pytest.approx(5.0) and d.slow.median == pytest.approx(45.0)
    else:
        assert np.median(draws) == pytest.approx(15.0, rel=0.03)
    assert draws.min() >= 0.5  # the clipping range is scaled too
    with pytest.raises(ValueError):
        reshape_duration(base, "cubic")
    assert set(TOOL_SHAPES) == {"lognormal", "gamma", "weibull", "bimodal"}


def test_presets_keep_an_unbounded_decode():
    assert EngineModel().decode_kv_tokens is None
    assert all(preset(n).engine.decode_kv_tokens is None for n in ("coding_agent", "general_agent", "math"))


def _occupancy(spec, seed, events):
    """Max KV tokens held by requests decoding together (more than one), rebuilt from the plans."""
    gen = WorkloadGenerator(spec.task, seed)
    turn, held, used, peak = {}, {}, 0.0, 0.0
    for e in events:
        if e.kind is EventKind.REQUEST_ARRIVED:
            turn[e.trajectory_id] = (e.turn, e.prompt_tokens)
        elif e.kind is EventKind.PREFILL_END:
            k, x = turn[e.trajectory_id]
            plan = gen.plan(int(e.trajectory_id.rsplit("-", 1)[1]))
            held[e.trajectory_id] = x + plan.turns[k].output_tokens
            used += held[e.trajectory_id]
            if len(held) > 1:
                peak = max(peak, used)
        elif e.kind is EventKind.DECODE_END:
            used -= held.pop(e.trajectory_id)
    return peak


def test_a_bounded_decode_kv_cache_holds_finished_prefills_back():
    base = scaled(preset("general_agent", "async"), 64)
    free = list(RolloutSimulator(base, 4, 600).events())
    roomy = EngineModel(prefill_instances=base.engine.prefill_instances, decode_kv_tokens=1e12)
    same = list(RolloutSimulator(base.__class__(base.task, roomy, base.rollout), 4, 600).events())
    key = lambda e: (e.ts, e.trajectory_id, e.kind.value)  # noqa: E731  (ties may come out in another order)
    assert sorted(same, key=key) == sorted(free, key=key)  # a cache nobody fills changes nothing

    capacity = 200_000.0
    tight = base.__class__(base.task, EngineModel(prefill_instances=base.engine.prefill_instances,
                                                  decode_kv_tokens=capacity), base.rollout)
    sim = RolloutSimulator(tight, 4, 600)
    events = list(sim.events())
    assert sim.kv_waits > 0 and all(x.ts <= y.ts for x, y in zip(events, events[1:]))
    assert 0 < _occupancy(tight, 4, events) <= capacity
    tracker = TrajectoryTracker()
    for e in events:
        tracker.apply(e)
    assert tracker.rejected_count == 0
    waits = {}
    for e in events:  # prefill_start -> prefill_end now includes the wait for KV
        if e.kind is EventKind.PREFILL_START:
            waits[e.trajectory_id] = e.ts
        elif e.kind is EventKind.PREFILL_END:
            waits[e.trajectory_id] = e.ts - waits[e.trajectory_id]
    assert max(waits.values()) > 10 * tight.engine.profile()(20_000)


@pytest.mark.parametrize("hints", list(HINT_SETS))
def test_trainers_that_send_only_some_hints(hints):
    events = list(RolloutSimulator(scaled(preset("coding_agent", "sync"), 32), 2, 900).events())
    kept = list(filter_hints(events, hints))
    drop = dropped_kinds(hints)
    assert not any(e.kind in drop for e in kept)
    engine = [e for e in events if e.kind in ENGINE_EVENT_KINDS]
    assert [(e.trajectory_id, e.kind, e.ts, e.prompt_tokens) for e in kept if e.kind in ENGINE_EVENT_KINDS] == \
        [(e.trajectory_id, e.kind, e.ts, e.prompt_tokens) for e in engine]  # every engine event, in order
    tracker = TrajectoryTracker()
    for e in kept:
        tracker.apply(e)
    assert tracker.rejected_count == 0
    if hints == "none":
        assert drop == TRAINER_HINT_KINDS
        assert all(e.task is None and e.group_id is None and e.turn is None for e in kept)
    if hints in ("none", "no_reward"):  # nothing says a trajectory finished: its last response leaves it decoded
        assert tracker.finished_total == 0 and tracker.count(TrajState.DECODED) > 0
    else:
        assert tracker.finished_total > 0
    with pytest.raises(ValueError):
        dropped_kinds("some")


def test_the_family_is_deterministic_and_covers_its_dimensions():
    a, b = draw_settings(7, 24), draw_settings(7, 24)
    assert a == b and a != draw_settings(8, 24)
    for name, (values, _) in DIMENSIONS.items():
        assert set(values) <= {s[name] for s in a}, name
    for p in a[:6]:
        spec = spec_from_params(p)
        assert spec.rollout.group_size == p["group_size"] and spec.engine.decode_kv_tokens == p["decode_kv_tokens"]
        assert spec.engine.prefill_instances == p["prefill_instances"]
        assert (spec.task.uses_sandbox, spec.rollout.mode) == (p["cold_fraction"] is not None, p["mode"])
