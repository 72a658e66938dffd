"""Stage waits (waits.py) and the planner's wait rule: hand-computed waits, rates and moves."""

import dataclasses
import math

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.role_switch.allocator import AllocationInputs, AllocatorConfig, allocate
from sglang_prorsa.policy.role_switch.capacity import InstanceReport, InstanceStatus, Role
from sglang_prorsa.policy.role_switch.controller import ControlInputs, ControllerConfig, RoleSwitchController
from sglang_prorsa.policy.role_switch.planner import (
    ACCEPTED,
    DONOR_AT_MINIMUM,
    PACED,
    WAITS_BALANCED,
    PlanContext,
    PlannerConfig,
    SwitchPlanner,
)
from sglang_prorsa.policy.role_switch.throughput import ThroughputConfig, ThroughputEstimator
from sglang_prorsa.policy.role_switch.waits import CompletionRate, StageWaits, move_shortens_waits, stage_waits

P, D = Role.PREFILL, Role.DECODE


def prefill(name, queued, inflight=0, **kw):
    return InstanceReport(name, P, queued_prompt_tokens=queued, inflight_prompt_tokens=inflight, **kw)


def decode(name, kv, queued=0, **kw):
    return InstanceReport(name, D, decode_kv_used=kv, decode_kv_capacity=1000, queued_requests=queued, **kw)


def cluster():
    return [prefill("p0", 3000, 1000), prefill("p1", 1000), prefill("p2", 0, 500, status=InstanceStatus.SWITCHING),
            decode("d0", 900, queued=30), decode("d1", 100), decode("d2", 500, queued=10)]


def test_waits_follow_littles_law_per_stage():
    # prefill: (3000 + 1000 + 1000) tokens on the 2 active prefill instances at 500 tokens/s each = 5 s
    # (the switching one is not serving yet); decode: 30 + 10 queued requests at 4 completions/s = 10 s
    waits = stage_waits(cluster(), 500.0, 4.0)
    assert waits == StageWaits(5.0, 10.0)
    assert waits.to_dict() == {"prefill_s": 5.0, "decode_s": 10.0}


def test_requests_returning_from_a_re_prefill_count_in_decodes_queue():
    # a weight update sent 20 decode requests back through prefill: decode's queue is 30 + 10 + 20 = 60 requests at
    # 4 completions/s = 15 s; prefill's wait is unchanged (their prompt tokens are already in its queue)
    assert stage_waits(cluster(), 500.0, 4.0, returning_requests=20) == StageWaits(5.0, 15.0)


@pytest.mark.parametrize("theta, rate", [(500.0, None), (500.0, 0.0), (0.0, 4.0)])
def test_waits_are_unknown_without_a_rate_or_a_throughput(theta, rate):
    assert stage_waits(cluster(), theta, rate) is None


def test_waits_are_unknown_without_an_active_prefill_instance():
    only_decode = [r for r in cluster() if r.role is D]
    assert stage_waits(only_decode, 500.0, 4.0) is None


def test_completion_rate_spans_about_one_window():
    rate = CompletionRate(window_s=60.0)
    assert rate.per_s() is None
    rate.observe(0.0, 0)
    assert rate.per_s() is None  # one reading: no span yet
    rate.observe(10.0, 50)
    assert rate.per_s() == 5.0
    for t, n in ((20.0, 60), (30.0, 70), (40.0, 80), (50.0, 90), (60.0, 100), (70.0, 400)):
        rate.observe(t, n)
    # the reading at 10 s is the newest at or before 70 - 60: the rate spans 10..70 s, (400 - 50) / 60
    assert rate.per_s() == pytest.approx(350 / 60)
    rate.observe(75.0, 10)  # the counter went back (a new control plane): start over
    assert rate.per_s() is None


def test_completion_rate_keeps_readings_for_keep_s_and_rates_any_kept_span():
    rate = CompletionRate(window_s=60.0, keep_s=150.0)
    for t in range(0, 301, 10):
        assert rate.observe(float(t), t * t // 10)  # 0, 10, 40, 90, ...: the rate grows with t
    assert rate.first_s == 150.0  # the newest reading at or before 300 - 150
    assert rate.per_s() == pytest.approx((9000 - 5760) / 60)  # still the last window: readings at 240 and 300 s
    assert rate.rate(150.0, 200.0) == pytest.approx((4000 - 2250) / 50)
    assert rate.rate(155.0, 205.0) == pytest.approx((4000 - 2250) / 50)  # the readings at or before each end
    assert rate.rate(149.0, 300.0) is None  # dropped
    assert not rate.observe(310.0, 5)  # the counter went back: started over
    assert rate.first_s == 310.0 and rate.rate(300.0, 310.0) is None


@pytest.mark.parametrize("window_s, keep_s, field", [(0.0, None, "window_s"), (60.0, 59.0, "keep_s"),
                                                     (60.0, math.inf, "keep_s")])
def test_completion_rate_rejects_bad_spans(window_s, keep_s, field):
    with pytest.raises(ValueError, match=field):
        CompletionRate(window_s, keep_s)


def alloc(budget=6):
    return allocate(AllocationInputs(300.0, 1.0, 100.0, 30.0, 0.0, 10.0, budget), AllocatorConfig())


WAIT_RULE = PlannerConfig(wait_balance=True)


def plan(reports, waits, now=100.0, config=WAIT_RULE):
    context = PlanContext(10.0, (1.0,), (1.0,), waits=waits)
    return SwitchPlanner(config).plan(reports, alloc(len(reports)), now, context)


def three_three(**decode_kw):
    return [prefill("p0", 100), prefill("p1", 900), prefill("p2", 400),
            decode("d0", 800, **decode_kw), decode("d1", 300, **decode_kw), decode("d2", 600, **decode_kw)]


def test_a_move_that_shortens_the_summed_wait_takes_the_least_loaded_instance_of_the_other_stage():
    # 3:3, decode 20 s, prefill 5 s. A fourth decode instance: decode's wait falls by 20/4 = 5 s; prefill's rises
    # by 5 x 1/2 = 2.5 s. 5 > 1.3 x 2.5 + 2/4 = 3.75: the least loaded prefill instance (p0) moves to decode
    p = plan(three_three(), StageWaits(5.0, 20.0))
    assert [(s.instance_id, s.src, s.dst) for s in p.switches] == [("p0", P, D)]
    assert p.considered[0].reason == ACCEPTED and p.hold_reason is None
    # the mirror image: the decode instance with the least KV (d1) moves to prefill
    p = plan(three_three(), StageWaits(20.0, 5.0))
    assert [(s.instance_id, s.src, s.dst) for s in p.switches] == [("d1", D, P)]


@pytest.mark.parametrize("waits", [StageWaits(5.0, 15.0), StageWaits(15.0, 5.0), StageWaits(5.0, 8.5),
                                   StageWaits(3.0, 5.0)])
def test_waits_no_move_shortens_hold(waits):
    # 3:3: 15 s falls by 15/4 = 3.75 s, exactly 1.3 x (5 x 1/2) + 2/4: not more, so no move. Under the rule's
    # first form (move while the longer wait exceeds 1.3 x the shorter + 2 s) 15 s against 5 s moved
    p = plan(three_three(), waits)
    assert p.switches == () and p.hold_reason == WAITS_BALANCED


def test_a_longer_wait_at_the_stage_with_more_instances_is_not_evened_out():
    """Measured on the MiMo-like coding agent (staleness 2, 16 groups; never-switching runs): at 2:6, the fastest
    split, prefill's wait read 13.8 s and decode's 39.8 s; at 3:5, 1.1 s and 68.7 s. Evening the waits out moved 2:6
    toward decode; the summed wait holds there and moves 3:5 to 2:6."""
    two_six = [prefill("p0", 100), prefill("p1", 900)] + [decode(f"d{k}", 100 * (k + 1)) for k in range(6)]
    # a 3rd prefill: 13.8/3 = 4.6 s less, decode +39.8/5 = 8.0 s; a 7th decode: 39.8/7 = 5.7 s less, prefill +13.8 s
    p = plan(two_six, StageWaits(13.8, 39.8))
    assert p.switches == () and p.hold_reason == WAITS_BALANCED
    three_five = [prefill("p0", 100), prefill("p1", 900), prefill("p2", 400)] + \
        [decode(f"d{k}", 100 * (k + 1)) for k in range(5)]
    # a 6th decode: 68.7/6 = 11.45 s less; prefill +1.1 x 1/2 = 0.55 s; 11.45 > 1.3 x 0.55 + 2/6
    p = plan(three_five, StageWaits(1.1, 68.7))
    assert [(s.instance_id, s.src, s.dst) for s in p.switches] == [("p0", P, D)]
    assert move_shortens_waits(StageWaits(1.1, 68.7), D, 5, 3, 1, 1.3, 2.0)
    assert not move_shortens_waits(StageWaits(13.8, 39.8), D, 6, 2, 1, 1.3, 2.0)
    assert not move_shortens_waits(StageWaits(13.8, 39.8), P, 2, 6, 1, 1.3, 2.0)
    # two donors for one receiver (instances of unequal size): 4 -> 2 donor instances, its wait rises by w x 2/2
    assert move_shortens_waits(StageWaits(1.0, 40.0), D, 3, 4, 2, 1.3, 2.0)  # 40/4 = 10 > 1.3 x 1 + 2/4
    assert not move_shortens_waits(StageWaits(20.0, 40.0), D, 3, 4, 2, 1.3, 2.0)  # 10 < 1.3 x 20 + 0.5
    assert not move_shortens_waits(StageWaits(0.0, 40.0), D, 3, 1, 1, 1.3, 2.0)  # no donor left


def test_with_no_queue_the_forecast_rules_act_ahead_of_the_work():
    # neither wait above the 2 s floor: the forecast rules decide. Eq. 1 here asks for 3 prefill : 3 decode with
    # prefill demand 3 on 3 instances (short: coverage 1 < 1.1), so they feed prefill; the waits never would
    assert StageWaits(2.0, 0.0).queued(2.0) is False and StageWaits(2.1, 0.0).queued(2.0) is True
    reports = [prefill("p0", 100), prefill("p1", 900), decode("d0", 800), decode("d1", 300), decode("d2", 600),
               decode("d3", 100)]
    context = PlanContext(10.0, (3.0,), (0.5,), waits=StageWaits(1.0, 0.0))
    p = SwitchPlanner(WAIT_RULE).plan(reports, alloc(6), 100.0, context)
    assert p.hold_reason != WAITS_BALANCED
    assert [(s.instance_id, s.dst) for s in p.switches] == [("d3", P)]
    queued = dataclasses.replace(context, waits=StageWaits(0.0, 2.5))  # 2.5 s > 1.3 x 0 s + 2 s: decode's turn
    assert [(s.instance_id, s.dst) for s in SwitchPlanner(WAIT_RULE).plan(
        reports, alloc(6), 100.0, queued).switches] == [("p0", D)]


def test_one_wait_move_per_pace_cluster_wide():
    recent = [prefill("p0", 100), prefill("p1", 900, role_since=80.0), decode("d0", 800), decode("d1", 300)]
    # 2:2, decode 40 s: falls by 40/3 = 13.3 s against 1.3 x (5 x 1/1) + 2/3 = 7.2 s, a move is due
    p = plan(recent, StageWaits(5.0, 40.0), now=100.0)  # p1 got its role 20 s ago, less than the 30 s pace
    assert p.switches == () and p.hold_reason == PACED
    assert [s.instance_id for s in plan(recent, StageWaits(5.0, 40.0), now=110.0).switches] == ["p0"]
    switching = [prefill("p0", 100), prefill("p1", 900), decode("d0", 800),
                 decode("d1", 300, status=InstanceStatus.SWITCHING)]
    assert plan(switching, StageWaits(5.0, 40.0)).hold_reason == PACED


def test_the_wait_rule_never_empties_a_role():
    # decode's 20 s is the longer wait (> 1.3 x 5 s + 2 s), but the one prefill instance cannot go
    reports = [prefill("p0", 100), decode("d0", 800), decode("d1", 300)]
    p = plan(reports, StageWaits(5.0, 20.0))
    assert p.switches == () and p.hold_reason == DONOR_AT_MINIMUM
    assert p.considered[0].instance_ids == ("p0",) and not p.considered[0].accepted


def test_without_waits_or_with_the_rule_off_the_forecast_rules_decide():
    off = PlannerConfig()  # the rule is opt-in
    assert not off.wait_balance
    assert plan(three_three(), StageWaits(5.0, 20.0), config=off).hold_reason != WAITS_BALANCED
    assert plan(three_three(), StageWaits(5.0, 8.0), config=off).hold_reason != WAITS_BALANCED
    assert plan(three_three(), None).hold_reason != WAITS_BALANCED
    assert not PlannerConfig.unguarded().wait_balance


@pytest.mark.parametrize("field, value", [("wait_ratio", 0.9), ("wait_ratio", math.inf), ("wait_floor_s", -1.0),
                                          ("wait_pace_s", math.nan)])
def test_bad_wait_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        PlannerConfig(**{field: value})


def test_the_controller_measures_the_waits_it_plans_with():
    clock = ManualClock(100.0)
    estimator = ThroughputEstimator(ThroughputConfig(profiled_theta=1000.0), clock)
    controller = RoleSwitchController(ControllerConfig(planner=WAIT_RULE), estimator, clock)
    reports = three_three(queued=20)  # 60 decode requests waiting
    theta = 1000.0  # the profiled θ, not yet measured
    decision = controller.tick(ControlInputs(1000.0, 100.0, decode_completions_per_s=3.0), reports)
    assert decision.demand["waits"] == {"prefill_s": pytest.approx(1400.0 / (3 * theta)), "decode_s": 20.0}
    assert decision.to_dict()["inputs"]["decode_completions_per_s"] == 3.0
    assert [(s.instance_id, s.dst) for s in decision.plan.switches] == [("p0", D)]  # 20 s against well under 1 s
    unmeasured = controller.tick(ControlInputs(1000.0, 100.0), reports)
    assert unmeasured.demand["waits"] is None
    # with the rule off the waits are still measured and reported, and the forecast rules decide
    off = RoleSwitchController(ControllerConfig(), ThroughputEstimator(ThroughputConfig(profiled_theta=1000.0), clock),
                               clock).tick(ControlInputs(1000.0, 100.0, decode_completions_per_s=3.0), reports)
    assert off.demand["waits"]["decode_s"] == 20.0 and off.hold_reason != WAITS_BALANCED
    with pytest.raises(ValueError, match="decode_completions_per_s"):
        ControlInputs(1.0, 1.0, decode_completions_per_s=-1.0)


def test_a_weight_update_does_not_pull_decode_instances_into_prefill():
    """Right after an update decode's queue is in prefill's: counted where it returns, decode still has the longer
    wait and no decode instance moves to prefill for the burst."""
    clock = ManualClock(100.0)
    reports = [prefill("p0", 30_000), decode("d0", 100), decode("d1", 100), decode("d2", 100)]
    # prefill: 30,000 tokens / (1 x 1,000 tokens/s) = 30 s; decode's queue reads empty (0 s)
    def tick(returning):
        controller = RoleSwitchController(ControllerConfig(planner=WAIT_RULE),
                                          ThroughputEstimator(ThroughputConfig(profiled_theta=1000.0), clock), clock)
        return controller.tick(ControlInputs(30_000.0, 100.0, decode_completions_per_s=2.0,
                                             decode_requests_returning=returning), reports)
    burst = tick(0.0)  # 30 s > 1.3 x 0 s + 2 s: a decode instance moves to prefill
    assert burst.demand["waits"] == {"prefill_s": 30.0, "decode_s": 0.0}
    assert [(s.src, s.dst) for s in burst.plan.switches] == [(D, P)]
    held = tick(60.0)  # the 60 requests being re-prefilled return to decode: 60 / 2 per s = 30 s of decode wait
    assert held.demand["waits"] == {"prefill_s": 30.0, "decode_s": 30.0}
    assert held.plan.switches == () and held.hold_reason == WAITS_BALANCED
    assert held.to_dict()["inputs"]["decode_requests_returning"] == 60.0
    with pytest.raises(ValueError, match="decode_requests_returning"):
        ControlInputs(1.0, 1.0, decode_requests_returning=-1.0)
