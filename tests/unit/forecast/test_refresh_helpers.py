"""The refresh's fast paths against the plain computations they replace (snapshot.py, admissions.py, grid.py,
stores.py, profile.py): the same numbers, item by item."""

import numpy as np
import pytest

from sglang_prorsa.srt.forecast.admissions import arrival_order
from sglang_prorsa.srt.forecast.grid import GridCurve, chain_tables, chain_windows
from sglang_prorsa.srt.forecast.profile import KVFootprint
from sglang_prorsa.srt.forecast.snapshot import state_order
from sglang_prorsa.srt.forecast.stores import DurationStore
from sglang_prorsa.srt.lifecycle.states import STATE_CODES

DT = 0.125


def test_state_order_is_the_stable_argsort_and_the_cumulative_counts():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 7, 1000, 70_000):
        state = rng.integers(-1, len(STATE_CODES), n).astype(np.int8)  # -1: a free slot
        order, ends = state_order(state)
        assert order.dtype == np.int64 and np.array_equal(order, np.argsort(state, kind="stable"))
        counts = np.bincount(state.astype(np.int64) + 1, minlength=len(STATE_CODES) + 1)
        assert np.array_equal(ends, np.cumsum(counts))


def test_arrival_order_is_a_stable_lexsort():
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 300):
        arrival = rng.integers(0, 6, n).astype(np.float64) / 4  # many equal times
        inst = rng.integers(0, 3, n)
        assert np.array_equal(arrival_order(arrival, inst), np.lexsort((arrival, inst)))
        assert np.array_equal(arrival_order(arrival), np.argsort(arrival, kind="stable"))


def test_chain_windows_hold_the_table_entry_of_each_grid_point():
    rng = np.random.default_rng(2)
    curves = [GridCurve.from_durations(rng.lognormal(1.5, 0.6, 200), rng.uniform(0, 20, 50), DT),
              GridCurve.from_durations([], [], DT, tail_mean_s=4.0),  # no completion: all tail
              GridCurve.from_durations([0.01, 0.02], [], DT)]  # completions at grid point 0 only
    then = GridCurve.from_durations(rng.exponential(2.0, 300), [], DT).cdf_from_start(82)
    for curve in curves:
        for follow in (None, then):
            tables = chain_tables(curve, (10.0, 0.625, 0.0), follow)
            for size in (1, 7, curve.last + 1, curve.last + 40):
                for table, (q_short, q_long) in zip(tables, chain_windows(curve, (10.0, 0.625, 0.0), follow, size)):
                    entry = np.minimum(np.arange(size), table.last)
                    assert np.array_equal(q_short, table.q_short[entry])
                    assert np.array_equal(q_long, table.q_long[entry])


def _store(rng) -> DurationStore:
    store = DurationStore("tool", [("task", "tool"), ("task",), ()], prior_s=5.0, min_samples=8)
    for k in range(400):
        task, tool = int(rng.integers(0, 2)), int(rng.integers(0, 3))
        store.record({"task": task, "tool": tool}, float(rng.lognormal(1.0 + tool, 0.5)), end=float(k))
    return store


@pytest.mark.parametrize("now", [None, 450.0])
@pytest.mark.parametrize("radix", [{"task": 3, "tool": 4}, {"task": 60, "tool": 40}])  # cells by finest / used class
def test_store_look_ups_and_sums_match_the_tables_item_by_item(now, radix):
    rng = np.random.default_rng(3)
    store, horizons = _store(rng), (10.0, 0.625, 0.0)
    n = 500
    ids = {"task": rng.integers(0, 3, n), "tool": rng.integers(0, 4, n)}
    elapsed = np.round(rng.uniform(0, 40, n) * 8) / 8  # half of them exactly on a grid point
    elapsed[::2] += rng.uniform(0, DT, n)[::2]
    then_cdf = GridCurve.from_durations(rng.exponential(1.0, 100), [], DT).cdf_from_start(82)
    for then in (None, lambda key: then_cdf):
        fitted = store.fit(ids, radix, elapsed, DT, now)
        tables = {j: chain_tables(fitted.curve(key), horizons, None if then is None else then(key))
                  for j, key in enumerate(fitted.used)}
        want = [np.array([tables[j][t].lookup(elapsed[i:i + 1])[0] for i, j in enumerate(fitted.res)])
                for t in range(len(horizons))]
        got = store.evaluate(ids, radix, elapsed, DT, horizons, then, now=now)
        for g, w in zip(got, want):
            assert g == pytest.approx(w, rel=1e-12, abs=1e-15)
        # the first 200 items evaluated, the others censored only (running in a later state of the phase)
        also = ({c: v[200:] for c, v in ids.items()}, elapsed[200:])
        part = store.evaluate({c: v[:200] for c, v in ids.items()}, radix, elapsed[:200], DT, horizons, then,
                              now=now, also=also)
        for g, w in zip(part, want):
            assert g == pytest.approx(w[:200], rel=1e-12, abs=1e-15)
        x = rng.uniform(1000, 5000, n)
        tokens, requests = store.fit(ids, radix, elapsed, DT, now).expected(None, elapsed, horizons, then, (x, None))
        assert tokens == pytest.approx([float((w * x).sum()) for w in want], rel=1e-12, abs=1e-12)
        assert requests == pytest.approx([float(w.sum()) for w in want], rel=1e-12, abs=1e-12)


def test_kv_footprint_of_many_is_the_scalar_one():
    rng = np.random.default_rng(4)
    tokens = np.concatenate((rng.uniform(-5, 5000, 200), rng.integers(0, 5000, 200).astype(np.float64)))
    for page in (1, 16, 64):
        kv = KVFootprint(page)
        assert np.array_equal(kv.many(tokens), [kv(x) for x in tokens])
