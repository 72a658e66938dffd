"""sim/stage_clock.py: each turn's realised prefill, wait for a decode slot and decode, hand-computed and on real
simulations."""

import pytest

from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import simulate
from sglang_prorsa.sim.stage_clock import StageClock, TurnTimes


def test_a_turns_stage_times_are_the_spans_between_its_moments():
    clock = StageClock()
    pd, colocated, again, aborted, unseen = object(), object(), object(), object(), object()
    clock.arrived(pd, 1.0)
    clock.prefilled(pd, 3.0)
    clock.admitted(pd, 4.5)
    clock.decoded(pd, 10.0)  # prefill 2 s, slot wait 1.5 s, decode 5.5 s
    clock.arrived(colocated, 0.0)
    clock.prefilled(colocated, 2.0)
    clock.decoded(colocated, 5.0)  # no admission: decoding starts where prefill ended
    clock.arrived(again, 0.0)
    clock.prefilled(again, 1.0)
    clock.admitted(again, 1.0)
    clock.reprefilled(again)  # a weight update sent it back through prefill
    clock.prefilled(again, 7.0)
    clock.decoded(again, 9.0)
    clock.arrived(aborted, 0.0)
    clock.dropped(aborted)
    clock.decoded(aborted, 3.0)
    clock.decoded(unseen, 3.0)  # arrived before the clock was attached
    assert clock.turns == [TurnTimes(1.0, 2.0, 1.5, 5.5), TurnTimes(0.0, 2.0, 0.0, 3.0)]
    assert clock.turns[0].total_s == 9.0 and clock.reprefilled_turns == 1
    assert clock.means() == {"turns": 2, "prefill_s": 2.0, "slot_wait_s": 0.75, "decode_s": 4.25, "total_s": 7.0}
    assert clock.means(since=0.5) == {"turns": 1, "prefill_s": 2.0, "slot_wait_s": 1.5, "decode_s": 5.5,
                                      "total_s": 9.0}
    assert clock.means(since=2.0) == {"turns": 0}


def _run(mode, prefill, clock=None):
    rollout = RolloutConfig(preset="coding_agent", staleness=2, group_size=8, groups_per_step=4, steps=4, seed=0)
    return simulate(load_model("mimo_v25_pro"), ClusterConfig(gpus=128, mode=mode, prefill_instances=prefill),
                    rollout, stage_clock=clock)


@pytest.mark.parametrize("mode, prefill", [("static", 7), ("static", 1), ("colocated", 0)])
def test_recording_does_not_change_the_simulation(mode, prefill):
    clock = StageClock()
    with_clock, without = _run(mode, prefill, clock), _run(mode, prefill)
    assert (with_clock.events, with_clock.step_times_s) == (without.events, without.step_times_s)
    assert len(clock.turns) > 100
    # a prefill's end is its iteration's end, which the simulator may stamp ahead of the event it handles: a span
    # may dip below 0 by a fraction of an iteration, never more
    assert all(t.prefill_s > -0.5 and t.slot_wait_s > -0.5 and t.decode_s > 0 for t in clock.turns)
    means = clock.means()
    assert means["prefill_s"] > 0 and means["slot_wait_s"] >= 0 and means["decode_s"] > 0
    if mode == "colocated":
        assert all(t.slot_wait_s == 0 for t in clock.turns)


def test_a_starved_stage_shows_where_the_time_goes():
    """8 instances of 16 GPUs: 7 prefill : 1 decode leaves decode short (turns wait for a slot), 1 : 7 prefill."""
    decode_short, prefill_short = StageClock(), StageClock()
    _run("static", 7, decode_short)
    _run("static", 1, prefill_short)
    short_d, short_p = decode_short.means(), prefill_short.means()
    assert short_d["slot_wait_s"] > short_p["slot_wait_s"]
    assert short_p["prefill_s"] > short_d["prefill_s"]
