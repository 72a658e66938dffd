"""DurationClass keeps its histories in numpy ring buffers: the same numbers as the bounded deques they replaced."""

from collections import deque

import numpy as np
import pytest

from sglang_prorsa.policy.forecast.grid import censor_bins, event_bins
from sglang_prorsa.policy.forecast.stores import DurationClass

DT = 0.25


class DequeReference:
    """The previous implementation's bookkeeping, kept here as the oracle."""

    def __init__(self, history: int) -> None:
        self.done, self.done_starts = deque(maxlen=history), deque(maxlen=history)
        self.cens, self.cens_starts = deque(maxlen=history), deque(maxlen=history)
        self.evicted_start = -np.inf

    def record(self, duration: float, completed: bool, end: float) -> None:
        values, starts = (self.done, self.done_starts) if completed else (self.cens, self.cens_starts)
        if len(values) == values.maxlen:
            self.evicted_start = max(self.evicted_start, starts[0])
        values.append(duration)
        starts.append(end - duration)

    def histograms(self) -> list[np.ndarray]:
        done, cens = np.array(self.done), np.array(self.cens)
        in_done = np.array(self.done_starts) > self.evicted_start
        in_cens = np.array(self.cens_starts) > self.evicted_start
        hist = lambda x, bins: np.bincount(bins(x, DT), minlength=1).astype(np.float64)  # noqa: E731
        return [hist(done[in_done] if done.size else done, event_bins),
                hist(cens[in_cens] if cens.size else cens, censor_bins), hist(done, event_bins),
                hist(cens, censor_bins)]


@pytest.mark.parametrize("history,records", [(5, 3), (5, 23), (16, 16), (16, 17), (64, 1000), (2048, 3000)])
def test_ring_buffers_match_bounded_deques(history, records):
    rng = np.random.default_rng(history * 7919 + records)
    ring, oracle = DurationClass(history), DequeReference(history)
    end, total = 0.0, []
    for _ in range(records):
        end += float(rng.exponential(1.0))
        duration, completed = float(rng.exponential(3.0)), bool(rng.random() < 0.8)
        ring.record(duration, completed, end)
        oracle.record(duration, completed, end)
        if completed:
            total.append(duration)
    kept = total[-history:]
    assert ring.count == len(oracle.done) == len(kept)
    assert ring.completed.tolist() == list(oracle.done) == kept  # oldest first, the newest ``history`` kept
    assert ring.censored.tolist() == list(oracle.cens)
    assert ring.evicted_start == oracle.evicted_start
    assert ring.mean == pytest.approx(sum(kept) / len(kept) if kept else 0.0, rel=1e-12)
    for got, want in zip(ring.histograms(DT), oracle.histograms()):
        assert np.array_equal(got, want)


def test_buffers_grow_with_what_was_recorded():
    cls = DurationClass(2048)
    for k in range(40):
        cls.record(1.0, True, float(k + 1))
    assert cls.count == 40 and cls.evicted_start == -np.inf
    done_slots, censored_slots = cls.allocated
    assert 40 <= done_slots <= 64 and censored_slots == 0  # not 2,048 slots per class up front
