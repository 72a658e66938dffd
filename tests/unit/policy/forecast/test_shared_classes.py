"""A store shares one object between a new class and its only finer member, and splits it when an operation reaches
one and not the other: every class must hold exactly what recording into each class separately would hold."""

import numpy as np
import pytest

from sglang_prorsa.policy.forecast import stores
from sglang_prorsa.policy.forecast.durations import DurationClass
from sglang_prorsa.policy.forecast.stores import DurationStore

LEVELS = [("task", "tool"), ("task",), ()]


def check_against_separate_classes(store: DurationStore, records) -> None:
    separate: dict = {}
    for ids, duration, completed, end in records:
        store.record_ids(ids, duration, completed, end)
        for key in store.keys(dict(zip(stores.ID_COLUMNS, ids))):
            if key in store.classes:
                separate.setdefault(key, DurationClass(store.history)).record(max(0.0, duration), completed, end)
    assert set(separate) == set(store.classes)
    for key, want in separate.items():
        got = store.classes[key]
        assert got.count == want.count and got.mean == want.mean and got.evicted_start == want.evicted_start
        assert np.array_equal(got.completed, want.completed) and np.array_equal(got.censored, want.censored)
        for a, b in zip(got.histograms(0.25), want.histograms(0.25)):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("seed", range(4))
def test_shared_classes_hold_what_separate_ones_would(seed):
    rng = np.random.default_rng(seed)
    store = DurationStore("tool", LEVELS, 5.0, history=64, min_samples=8)
    records, end = [], 0.0
    for k in range(3000):
        # one (task, tool) for a while, then more tools, then a second task: shared objects split along the way
        tasks = 1 if k < 1500 else 2
        tools = 1 if k < 500 else 3
        end += float(rng.exponential(1.0))
        ids = (int(rng.integers(tasks)), int(rng.integers(tools)), 0)
        records.append((ids, float(rng.exponential(3.0)), bool(rng.random() < 0.8), end))
    check_against_separate_classes(store, records)
    assert store.classes[(1, 0)] is not store.classes[(2,)]  # two tasks: split


def test_one_task_shares_its_class_with_all_tasks():
    store = DurationStore("decode", [("task",), ()], 5.0, history=16)
    for k in range(40):
        store.record_ids((0, 0, 0), 1.0 + k % 3, True, float(k + 1))
    assert store.classes[(0, 0)] is store.classes[(1,)]
    store.record_ids((1, 0, 0), 2.0, True, 41.0)
    assert store.classes[(0, 0)] is not store.classes[(1,)]
    assert store.classes[(1,)].count == 16 and store.classes[(0, 0)].count == 16
    assert store.classes[(1,)].mean != store.classes[(0, 0)].mean


def test_a_full_store_splits_what_only_the_coarse_level_learns(monkeypatch):
    monkeypatch.setattr(stores, "MAX_CLASSES", 3)
    store = DurationStore("tool", LEVELS, 5.0, history=16)
    records = [((0, 0, 0), 1.0, True, 1.0), ((0, 1, 0), 2.0, True, 2.0), ((0, 0, 0), 3.0, True, 3.0),
               ((1, 0, 0), 4.0, False, 4.0), ((0, 2, 0), 5.0, True, 5.0)]
    check_against_separate_classes(store, records)
