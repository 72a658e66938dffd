"""Censored survival on the time grid and chain tables (grid.py), hand-computed; stores with class fallback."""

import math

import numpy as np
import pytest

from sglang_prorsa.policy.forecast.grid import GridCurve, chain_table, grid_step, sum_cdf
from sglang_prorsa.policy.forecast.stores import DurationStore

DT = 0.125


def test_grid_step_is_a_power_of_two_near_s_over_64():
    assert grid_step(10.0) == 0.125 and grid_step(5.0) == 0.0625 and grid_step(60.0) == 0.5


def test_product_limit_with_live_items_censored():
    # completed 2, 4, 6, 8; running at 3 and 5. At risk: u=2: 6 -> S=5/6; u=4: 3 + 1 = 4 -> 0.625; u=6: 2 -> 0.3125
    curve = GridCurve.from_durations([8, 2, 6, 4], [5, 3], DT)
    assert curve.extended(65)[[16, 32, 48, 64]] == pytest.approx([5 / 6, 0.625, 0.3125, 0.0])
    # q(e=3, h=3) = 1 - S(6^-)/S(3) = 1 - 0.625/(5/6) = 0.25 (ignoring the censoring would give 1/3)
    assert chain_table(curve, 3.0).lookup(np.array([3.0])) == pytest.approx([0.25])
    naive = GridCurve.from_durations([2, 4, 6, 8], [], DT)
    assert chain_table(naive, 3.0).lookup(np.array([3.0])) == pytest.approx([1 / 3])
    # strict window end: from e=3 over 1 s the completion at exactly 4 is not inside
    assert chain_table(curve, 1.0).lookup(np.array([3.0])) == pytest.approx([0.0])


def test_live_item_past_the_mean_is_not_counted_in_full():
    # tool -> request durations 2, 4, 6, 15, 25 (mean 10.4); live tools at 11 (past the mean) and 3.
    # u=2: n=7 -> 6/7; u=4: n=5 -> 24/35; u=6: n=4 -> 18/35; u=15: n=2 -> 9/35; u=25: n=1 -> 0
    curve = GridCurve.from_durations([2, 4, 6, 15, 25], [11, 3], DT)
    q = chain_table(curve, 10.0).lookup(np.array([11.0, 3.0]))
    # e=11: 1 - S(21^-)/S(11) = 1 - (9/35)/(18/35) = 0.5;  e=3: 1 - S(13^-)/S(3) = 1 - (18/35)/(6/7) = 0.4
    assert q == pytest.approx([0.5, 0.4])


def test_tail_beyond_the_data_is_memoryless_with_the_class_mean():
    curve = GridCurve.from_durations([2, 4], [], DT, tail_mean_s=3.0)
    assert chain_table(curve, 6.0).lookup(np.array([4.0, 9.0])) == pytest.approx([1 - math.exp(-2.0)] * 2)
    prior = GridCurve(np.zeros(1), np.zeros(1), DT, 10.0)  # no completions at all: the prior
    assert chain_table(prior, 10.0).lookup(np.array([0.0, 37.0])) == pytest.approx([1 - math.exp(-1.0)] * 2)


def test_chain_of_two_phases_hand_computed():
    # A in {2, 6} (equal mass), B in {1, 3}; from e=1 over h=5: A-1+B in {2, 4, 6, 8} -> two of four are < 5
    a = GridCurve.from_durations([2, 6], [], DT)
    b = GridCurve.from_durations([1, 3], [], DT)
    table = chain_table(a, 5.0, b.cdf_from_start(50))
    assert table.lookup(np.array([1.0])) == pytest.approx([0.5])
    assert table.lookup(np.array([3.0])) == pytest.approx([0.5])  # A = 6 now certain: 3 + {1, 3} -> 4 < 5, 6 no
    assert table.lookup(np.array([0.0])) == pytest.approx([0.25])  # 2 + {1, 3} = {3, 5}: only 3 is < 5
    assert table.lookup(np.array([5.0])) == pytest.approx([1.0])  # 1 + {1, 3} < 5
    # unconditional sum: P(A + B < 7) = P({3, 5, 7, 9} < 7) = 0.5 -> the CDF at grid point 7/dt - 1
    assert sum_cdf([a, b], 80)[int(7 / DT) - 1] == pytest.approx(0.5)


def test_chain_matches_monte_carlo_between_grid_points():
    rng = np.random.default_rng(0)
    a, b = rng.lognormal(1.5, 0.5, 40_000), rng.exponential(2.0, 40_000)
    table = chain_table(GridCurve.from_durations(a, [], DT), 10.0, GridCurve.from_durations(b, [], DT).cdf_from_start(82))
    for e in (0.31, 2.05, 5.77):
        keep = a > e
        assert table.lookup(np.array([e]))[0] == pytest.approx(np.mean(a[keep] - e + b[keep] < 10), abs=0.01)


def test_store_falls_back_to_coarser_classes_and_censors_live_items_in_each():
    store = DurationStore("tool", [("task", "tool"), ("task",), ()], prior_s=5.0, min_samples=2)
    for d in (2.0, 4.0, 6.0):
        store.record({"task": 0, "tool": 1}, d, end=d)
    store.record({"task": 0, "tool": 2}, 8.0, end=8.0)
    assert store.resolve_one({"task": 0, "tool": 1}) == (0, 0, 1)  # 3 samples >= 2
    assert store.resolve_one({"task": 0, "tool": 2}) == (1, 0)  # 1 sample: the task's class {2, 4, 6, 8}
    assert store.resolve_one({"task": 5, "tool": 0}) == (2,)  # unseen task: all tasks
    radix = {"task": 6, "tool": 3}
    ids = {"task": np.array([0, 0, 0]), "tool": np.array([1, 1, 2])}
    elapsed = np.array([1.0, 5.0, 1.0])
    (q,) = store.evaluate(ids, radix, elapsed, DT, (4.0,), now=20.0)
    # tool 1: {2, 4, 6}, the live items censored at 1 and 5: u=2: n=4 -> 3/4; u=4: n=3 -> 1/2; u=6: n=1 -> 0
    #   q(e=1, h=4) = 1 - S(5^-)/S(1) = 1/2 (complete sample alone: 1 - 1/3 = 2/3); q(e=5, h=4) = 1 - 0 = 1
    # tool 2 uses (task 0,): {2, 4, 6, 8} with all three live items censored (at 1, 5, 1): u=2: n=5 -> 4/5;
    #   u=4: n=4 -> 3/5; q(e=1, h=4) = 1 - S(5^-)/S(1) = 1 - 3/5 = 2/5
    assert q == pytest.approx([0.5, 1.0, 0.4])
    (q,) = store.evaluate(ids, radix, elapsed, DT, (4.0,))  # no `now`: the complete sample, nothing censored
    assert q == pytest.approx([2 / 3, 1.0, 0.5])
    # an unseen task: all tasks {2, 4, 6, 8} censored at 0: q(0, 3) = 1 - S(3^-)/S(0) = 1 - 3/4
    (q,) = store.evaluate({"task": np.array([3]), "tool": np.array([0])}, radix, np.array([0.0]), DT, (3.0,), now=20.0)
    assert q == pytest.approx([0.25])
    # nothing recorded at any level: the prior, an exponential with mean 5 s
    empty = DurationStore("x", [("task",), ()], prior_s=5.0)
    (q,) = empty.evaluate({"task": np.array([0, 1])}, {"task": 2}, np.array([0.0, 40.0]), DT, (3.0,))
    assert q == pytest.approx([1 - math.exp(-3.0 / 5.0)] * 2)


def test_cohort_after_evictions_splices_with_the_complete_sample():
    # history of 4: durations 1..6 started at 0, 1, 2, ...; the first two are evicted (latest evicted start: 1)
    store = DurationStore("x", [()], prior_s=5.0, history=4, min_samples=1)
    for k, d in enumerate((1.0, 1.0, 2.0, 2.0, 4.0, 4.0)):
        store.record({}, d, end=k + d)
    cls = store.classes[(0,)]
    assert cls.evicted_start == 1.0 and list(cls.completed) == [2.0, 2.0, 4.0, 4.0]
    # at now = 10 the cohort is what started after 1 (age 9): starts 2..5 completed {2, 2, 4, 4}, plus the live
    # items censored (at 0.5 and 3): u=2: n=5 -> 3/5; u=4: n=2 -> 0; q(0.5, h=2) = 1 - S(2.5^-)/S(0.5) = 2/5
    (q,) = store.evaluate({}, {}, np.array([0.5, 3.0]), DT, (2.0,), now=10.0)
    assert q[0] == pytest.approx(0.4)
    # a live item that started before the cohort (elapsed 9.5 > age 9) is not censored in it (else u=2: n=6 -> 2/3)
    (q,) = store.evaluate({}, {}, np.array([0.5, 3.0, 9.5]), DT, (2.0,), now=10.0)
    assert q[0] == pytest.approx(0.4)
    # the complete sample {2, 2, 4, 4} alone (no `now`): 1 - S(2.5^-) = 1/2
    assert store.evaluate({}, {}, np.array([0.5]), DT, (2.0,))[0] == pytest.approx([0.5])


def test_store_memory_is_bounded():
    store = DurationStore("reward", [("task",), ()], prior_s=5.0, history=16)
    for i in range(1000):
        store.record({"task": i % 4}, float(i), completed=i % 3 != 0)
    assert len(store.classes) == 5
    assert all(len(c.completed) <= 16 and len(c.censored) <= 16 for c in store.classes.values())


def test_empty_window_table_has_the_same_shape():
    curve = GridCurve.from_durations([2, 4, 6], [], DT)
    full, empty = chain_table(curve, 10.0), chain_table(curve, 0.0)
    assert empty.q_short.shape == full.q_short.shape and not empty.q_short.any()
