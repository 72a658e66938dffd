"""Kaplan-Meier conditional probabilities with censored (still running) items, hand-computed."""

import math

import numpy as np
import pytest

from sglang_prorsa.policy.forecast.distributions import ConditionalDurations, SurvivalCurve


def test_censoring_changes_the_conditional_probability():
    # completed: 2, 4, 6, 8; running: elapsed 3 and 5 (censored).
    # at-risk: u=2: 4 events + 2 censored = 6 -> S = 5/6; u=4: 3 + 1 (the 5) = 4 -> S = 5/6 * 3/4 = 0.625
    #          u=6: 2 -> S = 0.3125; u=8: 1 -> S = 0
    curve = SurvivalCurve(np.array([8.0, 2.0, 6.0, 4.0]), np.array([5.0, 3.0]), tail_mean_s=5.0)
    assert curve.survival(np.array([1.0, 2.0, 3.0, 4.0, 6.0, 8.0])) == pytest.approx([1, 5 / 6, 5 / 6, 0.625, 0.3125, 0])
    # q(e=3, S=3) = 1 - S(6^-)/S(3) = 1 - 0.625 / (5/6) = 0.25; ignoring censoring would give 1/3 ({4} of {4,6,8})
    assert curve.prob_within(np.array([3.0]), 3.0) == pytest.approx([0.25])
    naive = SurvivalCurve(np.array([2.0, 4.0, 6.0, 8.0]), np.array([]), 5.0)
    assert naive.prob_within(np.array([3.0]), 3.0) == pytest.approx([1 / 3])
    # q(e=5, S=2) = 1 - S(7^-)/S(5) = 1 - 0.3125/0.625 = 0.5; strict "<": q(e=3, S=1) excludes the event at 4
    assert curve.prob_within(np.array([5.0, 3.0]), 2.0) == pytest.approx([0.5, 0.25])
    assert curve.prob_within(np.array([3.0]), 1.0) == pytest.approx([0.0])


def test_tail_and_no_data_use_exponential_with_class_mean():
    curve = SurvivalCurve(np.array([2.0, 4.0]), np.array([]), tail_mean_s=3.0)
    # elapsed 4 >= last completion: memoryless tail, q = 1 - exp(-S / mean)
    assert curve.prob_within(np.array([4.0, 9.0]), 6.0) == pytest.approx([1 - math.exp(-2.0)] * 2)
    empty = SurvivalCurve(np.array([]), np.array([1.0]), tail_mean_s=10.0)
    assert empty.prob_within(np.array([0.0]), 10.0) == pytest.approx([1 - math.exp(-1.0)])
    assert curve.prob_within(np.array([1.0]), 0.0) == pytest.approx([0.0])


def test_mean_residual_within_horizon():
    curve = SurvivalCurve(np.array([2.0, 4.0, 6.0, 8.0]), np.array([]), 5.0)
    # from e=1 over S=6: completions at 2, 4, 6 (6 excluded: strict) each 1/4 -> E[T - 1 | 1 < T < 7] = mean(1, 3, 5) = 3
    assert curve.mean_residual_within(np.array([1.0]), 6.0) == pytest.approx([3.0])


def test_conditional_classes_fall_back_and_censor_running_items_in_every_class():
    d = ConditionalDurations(default_prior_s=7.0, priors={("cold",): 30.0}, min_samples=2)
    d.record((("prewarm", 1), ("prewarm",)), 2.0)
    for x in (4.0, 6.0):
        d.record((("prewarm", 2), ("prewarm",)), x)
    assert d.resolve((("prewarm", 1), ("prewarm",))) == ("prewarm",)  # 1 sample < 2: coarse class
    assert d.resolve((("prewarm", 2), ("prewarm",))) == ("prewarm", 2)
    assert d.mean(("cold",)) == 30.0 and d.mean(("prewarm",)) == 4.0
    snap = d.snapshot(
        [(("prewarm", 1), ("prewarm",)), (("prewarm", 2), ("prewarm",)), (("cold", 0), ("cold",))], [3.0, 3.0, 1.0]
    )
    q = snap.prob_within(2.0)
    # coarse class {2,4,6} censored at 3 and 3 (both prewarm items are running members of it):
    # u=2: n=5 -> 0.8; u=4: n=2 -> 0.4; q(e=3,S=2) = 1 - S(5^-)/S(3) = 1 - 0.4/0.8 = 0.5
    # fine class {4,6} censored at 3: u=4: n=2 -> 0.5; u=6: n=1 -> 0; q = 1 - 0.5/1 = 0.5
    # cold: no completions -> prior 30 s: 1 - exp(-2/30)
    assert q == pytest.approx([0.5, 0.5, 1 - math.exp(-2 / 30)])


def test_aborted_durations_are_censored_not_completed():
    d = ConditionalDurations(default_prior_s=5.0, min_samples=1)
    for x in (2.0, 4.0):
        d.record(((),), x)
    d.record(((),), 3.0, completed=False)
    # u=2: n=3 -> 2/3; u=4: n=1 -> 0. q(e=2.5, S=1) = 1 - S(3.5^-)/S(2.5) = 0; q(e=2.5, S=2) = 1
    snap = d.snapshot([((),)], [2.5])
    assert snap.prob_within(1.0) == pytest.approx([0.0])
    assert snap.prob_within(2.0) == pytest.approx([1.0])
