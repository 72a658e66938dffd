"""The refresh's fast paths against the plain computations they replace (snapshot.py, admissions.py, grid.py,
stores.py, profile.py): the same numbers, item by item."""

import numpy as np
import pytest

from sglang_prorsa.policy.forecast.admissions import arrival_order
from sglang_prorsa.policy.forecast.curve_history import CurveHistory
from sglang_prorsa.policy.forecast.grid import GridCurve, chain_tables, chain_windows
from sglang_prorsa.policy.forecast.profile import KVFootprint
from sglang_prorsa.policy.forecast.snapshot import state_order
from sglang_prorsa.policy.forecast.stores import DurationStore
from sglang_prorsa.policy.lifecycle.states import STATE_CODES

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
@pytest.mark.parametrize("horizons", [(10.0, 0.625, 0.0), (10.0, 0.0)])  # sums per cell / per item (one window)
def test_store_look_ups_and_sums_match_the_tables_item_by_item(now, radix, horizons):
    rng = np.random.default_rng(3)
    store = _store(rng)
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
        scale = rng.uniform(0, 1, n)  # a per-item factor (decode-return: P(the response calls a tool))
        fitted = store.fit(ids, radix, elapsed, DT, now)
        tokens, requests = fitted.expected(None, elapsed, horizons, then, (x, None), scale=scale)
        assert tokens == pytest.approx([float((w * scale * x).sum()) for w in want], rel=1e-12, abs=1e-12)
        assert requests == pytest.approx([float((w * scale).sum()) for w in want], rel=1e-12, abs=1e-12)


def test_kv_footprint_of_many_is_the_scalar_one():
    rng = np.random.default_rng(4)
    tokens = np.concatenate((rng.uniform(-5, 5000, 200), rng.integers(0, 5000, 200).astype(np.float64)))
    for page in (1, 16, 64):
        kv = KVFootprint(page)
        assert np.array_equal(kv.many(tokens), [kv(x) for x in tokens])


def _reference_curve(events, censored, dt, mean, live, splice):
    """The curve as ``DurationStore.curve`` built it before ``CurveHistory``: every histogram added per refresh."""
    def add(a, b):
        if b is None or not b.size:
            return a
        out = np.zeros(max(a.size, b.size))
        out[:a.size] += a
        out[:b.size] += b
        return out
    ev_c, ce_c, ev_all, ce_all = events
    if splice is None:
        return GridCurve(ev_c, add(ce_c, live), dt, mean)
    return GridCurve(ev_c, add(ce_c, None if live is None else live[:splice + 1]), dt, mean, late_events=ev_all,
                     late_censored=censored, splice_at=splice)


def _reference_tail_mean(censored, live, last, dt, mean):
    """curve_history.py's tail mean past grid point ``last``, written out with Python loops."""
    exposure = 0.0
    for hist in (censored, live if live is not None else []):
        for k, count in enumerate(hist):
            if k > last:
                exposure += (k - last) * count
    return mean + dt * exposure


def test_tail_mean_by_hand():
    # completions at grid points 1, 2, 3, 10 (L = 10); one censored at 12; live items at 20 (two) and 5: time at
    # risk past L = 2 + 2 * 10 = 22 grid points = 2.75 s at dt 0.125
    ev = np.array([0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1.0])
    history = CurveHistory(ev, np.zeros(1), ev, np.array([0] * 12 + [1.0]))
    live = np.zeros(21)
    live[20], live[5] = 2, 1
    curve = history.curve(live, None, 0.125, 4.0)
    assert curve.last == 10 and curve.tail_mean_s == pytest.approx(4.0 + 2.75)
    assert history.curve(None, None, 0.125, 4.0).tail_mean_s == pytest.approx(4.0 + 0.25)  # the censored one only
    # a thousand items 3,960 grid points past L = 40 at dt = 1: the tail mean is their time at risk plus the mean
    ev = np.zeros(41)
    ev[1:11], ev[40] = 1, 10
    h = CurveHistory(ev, np.zeros(1), ev, np.zeros(1))
    many = np.zeros(4001)
    many[4000] = 1000
    assert h.curve(None, None, 1.0, 7.0).tail_mean_s == 7.0
    assert h.curve(many, None, 1.0, 7.0).tail_mean_s == pytest.approx(1000 * 3960 + 7.0)


def test_curve_history_builds_the_same_curves_bit_for_bit():
    rng = np.random.default_rng(5)
    for trial in range(60):
        size = int(rng.integers(1, 300))
        ev_all = rng.integers(0, 4, size).astype(np.float64) * (rng.random(size) < 0.4)
        ev_c = ev_all[: int(rng.integers(1, size + 1))] * (rng.random() < 0.8)
        if trial % 7 == 0:
            ev_c = np.zeros(1)  # no cohort completion
        ce_all = rng.integers(0, 3, int(rng.integers(1, 400))).astype(np.float64)
        ce_c = ce_all[: int(rng.integers(1, ce_all.size + 1))]
        history = CurveHistory(ev_c, ce_c, ev_all, ce_all)
        for live in (None, np.zeros(0), rng.integers(0, 50, int(rng.integers(1, 500))).astype(np.float64)):
            for splice in (None, 0, int(rng.integers(0, size)), size + 5, 10_000):
                got = history.curve(live, splice, DT, 3.0)
                want_tail = _reference_tail_mean(ce_all, live, max(got.last, 0), DT, 3.0)
                assert got.tail_mean_s == pytest.approx(want_tail, rel=1e-12)
                want = _reference_curve((ev_c, ce_c, ev_all, ce_all), ce_all, DT, got.tail_mean_s, live, splice)
                assert got.last == want.last
                assert np.array_equal(got.surv, want.surv)
                for length in (1, got.last + 3, got.last + 90):  # a kept extension: views of the longest
                    assert np.array_equal(got.extended(length), want.extended(length))
                assert np.array_equal(got.extended(7), want.extended(7))


def test_calls_tool_table_is_the_clipped_turn_bucket_table():
    from types import SimpleNamespace

    from sglang_prorsa.policy.forecast.statistics import turn_bucket
    from sglang_prorsa.policy.forecast.terms import ArrivalTerms

    rng = np.random.default_rng(6)
    by_bucket = rng.random((3, 13))
    stats = SimpleNamespace(calls_tool_in_bucket=lambda t, b: float(by_bucket[t, b]))
    for turns in (rng.integers(0, 30, 500), rng.integers(0, 5000, 500), np.array([0, 127, 128, 4095, 4096, 10**6])):
        task = rng.integers(0, 3, turns.size)
        snap = SimpleNamespace(turn=turns.astype(np.int32), task=task.astype(np.int64), radix={"task": 3})
        terms = SimpleNamespace(snap=snap, stats=stats, _calls_lut=None)
        got = ArrivalTerms._calls_tool(terms, slice(0, turns.size))
        want = [by_bucket[t, turn_bucket(min(int(k), 127))] for t, k in zip(task, turns)]
        assert np.array_equal(got, want)
