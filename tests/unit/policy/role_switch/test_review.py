"""The move review (review.py) and its place in a control tick: hand-computed rates, verdicts, undo and refusal."""

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.role_switch.capacity import InstanceReport, Role
from sglang_prorsa.policy.role_switch.controller import ControlInputs, ControllerConfig, RoleSwitchController
from sglang_prorsa.policy.role_switch.planner import PlannerConfig
from sglang_prorsa.policy.role_switch.review import (
    REFUSED_BY_REVIEW,
    REVERTED,
    REVIEWING,
    MoveReview,
    ReviewConfig,
)
from sglang_prorsa.policy.role_switch.throughput import ThroughputConfig, ThroughputEstimator

P, D = Role.PREFILL, Role.DECODE
SHORT = ReviewConfig(window_s=60.0, settle_s=10.0, tolerance=0.05, block_s=300.0)


def fed(readings, config=SHORT):
    review = MoveReview(config)
    for t, total in readings:
        review.observe(t, total)
    return review


def test_rate_is_the_counter_between_the_readings_at_or_before_two_times():
    review = fed([(0.0, 0), (100.0, 50), (200.0, 150)])
    assert review.rate(0.0, 200.0) == 0.75  # 150 completions over 200 s
    assert review.rate(150.0, 200.0) == 1.0  # from the reading at 100 s: 100 over 100 s
    assert review.rate(-1.0, 200.0) is None  # nothing read that early
    assert review.rate(120.0, 130.0) is None  # one reading covers both ends


def test_a_move_is_reviewed_only_with_a_window_of_readings_behind_it():
    review = fed([(0.0, 0), (50.0, 50)])
    assert not review.start(50.0, ("p0",), P, D, 3)  # 50 s < the 60 s window: unreviewed
    assert review.pending is None and not review.holding(50.0)
    review.observe(60.0, 60)
    assert review.start(60.0, ("p0",), P, D, 3)
    assert review.pending.before_per_s == 1.0  # 60 completions over [0, 60]


def test_a_move_with_no_completion_in_the_window_before_it_is_not_reviewed():
    # 0 completions over [0, 60]: no fall can be measured, so the move is not held for a verdict
    review = fed([(0.0, 40), (60.0, 40)])
    assert not review.start(60.0, ("p0",), P, D, 3)
    assert review.pending is None and not review.holding(60.0)
    review.observe(61.0, 41)  # one completion since: reviewed
    assert review.start(61.0, ("p0",), P, D, 3)
    assert review.pending.before_per_s == pytest.approx(1 / 61)  # from the reading at 0 s: 1 over 61 s


@pytest.mark.parametrize("after_total, undone", [(130, True), (158, False)])
def test_a_move_whose_completions_fell_by_more_than_the_tolerance_is_undone_and_refused(after_total, undone):
    # 1 completion per s before the move at 60 s. The verdict is due at 60 + 10 + 60 = 130 s and counts from the
    # reading at 70 s (100): 130 at 130 s is 30 / 60 = 0.5 per s < 0.95 (undone); 158 is 58 / 60 = 0.967 (kept)
    review = fed([(0.0, 0), (60.0, 60)])
    assert review.start(60.0, ("p0",), P, D, 3)
    review.observe(70.0, 100)
    assert review.holding(129.0) and review.due(129.0) is None
    review.observe(130.0, after_total)
    verdict = review.due(130.0)
    assert verdict.after_per_s == pytest.approx((after_total - 100) / 60)
    assert verdict.undone is undone and review.pending is None and not review.holding(130.0)
    assert (review.verdicts, review.undone) == (1, int(undone))
    assert review.refused(3, D, 130.0) is undone
    assert review.refused(3, D, 429.9) is undone and not review.refused(3, D, 430.0)  # 130 + 300 s
    assert not review.refused(3, P, 130.0) and not review.refused(4, D, 130.0)  # the other direction, another split
    snapshot = review.snapshot(130.0)
    assert snapshot["last_verdict"]["undone"] is undone and snapshot["pending"] is None
    assert snapshot["refused"] == ([{"prefill_instances": 3, "to": "decode", "until_s": 430.0}] if undone else [])


def test_a_counter_that_went_back_starts_over_and_drops_the_review():
    review = fed([(0.0, 0), (60.0, 60)])
    assert review.start(60.0, ("p0",), P, D, 3)
    review.observe(70.0, 5)  # a restarted control plane
    assert review.pending is None and review.rate(0.0, 70.0) is None


def test_old_readings_are_dropped_but_one_at_the_window_edge_is_kept():
    review = fed([(float(t), t) for t in range(0, 1001, 10)])
    # kept: 2 x 60 + 10 = 130 s back from 1000 s, and the reading at or before 870 s
    assert review.rate(870.0, 1000.0) == 1.0 and review.rate(869.0, 1000.0) is None


@pytest.mark.parametrize("field, value", [("window_s", 0.0), ("settle_s", -1.0), ("tolerance", 1.0),
                                          ("block_s", float("inf"))])
def test_bad_review_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        ReviewConfig(**{field: value})


def test_bad_completion_counts_are_refused():
    for value in (-1, 1.5, True):
        with pytest.raises(ValueError, match="decode_completions_total"):
            ControlInputs(1.0, 1.0, decode_completions_total=value)


# ----- in a control tick -----
def prefill(name, queued):
    return InstanceReport(name, P, queued_prompt_tokens=queued)


def decode(name, kv, queued=20):
    return InstanceReport(name, D, decode_kv_used=kv, decode_kv_capacity=1000, queued_requests=queued)


def three_three():
    return [prefill("p0", 100), prefill("p1", 900), prefill("p2", 400),
            decode("d0", 800), decode("d1", 300), decode("d2", 600)]


def after_move():
    """p0 serves decode: 2:4."""
    return [decode("p0", 0), prefill("p1", 900), prefill("p2", 400),
            decode("d0", 800), decode("d1", 300), decode("d2", 600)]


def test_the_controller_holds_while_a_move_is_reviewed_undoes_it_and_refuses_it_for_block_s():
    clock = ManualClock(0.0)
    controller = RoleSwitchController(
        ControllerConfig(planner=PlannerConfig(wait_balance=True), review=SHORT),
        ThroughputEstimator(ThroughputConfig(profiled_theta=1000.0), clock), clock)

    def tick(t, total, reports):
        clock.set(t)
        return controller.tick(ControlInputs(1000.0, 100.0, decode_completions_per_s=3.0,
                                             decode_completions_total=total), reports)

    controller.review.observe(0.0, 0)
    # 60 decode requests queued at 3 per s: 20 s against well under 1 s at prefill, so p0 moves to decode
    # (test_waits.py), now under review at 1 completion per s
    moved = tick(60.0, 60, three_three())
    assert [(s.instance_id, s.dst) for s in moved.plan.switches] == [("p0", D)]
    assert moved.to_dict()["review"]["pending"]["before_per_s"] == 1.0
    assert moved.to_dict()["inputs"]["decode_completions_total"] == 60
    # 2:4 with 80 queued requests: the wait rule would move p1 too, but the move is under review
    held = tick(70.0, 100, after_move())
    assert held.plan.switches == () and held.hold_reason == REVIEWING
    # due at 130 s: (130 - 100) / 60 = 0.5 per s after, against 1.0 before: p0 goes back to prefill
    undo = tick(130.0, 130, after_move())
    assert [(s.instance_id, s.src, s.dst) for s in undo.plan.switches] == [("p0", D, P)]
    assert undo.plan.considered[0].reason == REVERTED and undo.hold_reason is None
    assert undo.to_dict()["review"]["undone"] == 1
    # back at 3:3 the same move is refused until 130 + 300 s, then made again and reviewed again
    refused = tick(200.0, 200, three_three())
    assert refused.plan.switches == () and refused.hold_reason == REFUSED_BY_REVIEW
    again = tick(430.0, 430, three_three())
    assert [(s.instance_id, s.dst) for s in again.plan.switches] == [("p0", D)]
    assert controller.review.pending.started_s == 430.0


def test_without_a_review_or_a_counter_the_plan_is_the_planners():
    clock = ManualClock(100.0)
    for config, total in ((ControllerConfig(planner=PlannerConfig(wait_balance=True)), 100),
                          (ControllerConfig(planner=PlannerConfig(wait_balance=True), review=SHORT), None)):
        controller = RoleSwitchController(config, ThroughputEstimator(ThroughputConfig(profiled_theta=1000.0), clock),
                                          clock)
        decision = controller.tick(ControlInputs(1000.0, 100.0, decode_completions_per_s=3.0,
                                                 decode_completions_total=total), three_three())
        assert [(s.instance_id, s.dst) for s in decision.plan.switches] == [("p0", D)]
        assert decision.to_dict()["review"] == (None if config.review is None else
                                                {"pending": None, "last_verdict": None, "verdicts": 0,
                                                 "undone": 0, "refused": []})
