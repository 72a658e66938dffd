"""The recent durations of one conditioning class (stores.py), kept in ring buffers.

Recording is on the tracker's event path (a few per event), reading at refresh (once per class that recorded since).
The rings are ``array.array``s: a per-item write or read from Python costs about half of a numpy scalar's, and the
refresh reads them as zero-copy numpy views. A ring never resizes in place (it grows into a new array), so a view
still alive can never make a write fail.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from sglang_prorsa.policy.forecast.curve_history import CurveHistory
from sglang_prorsa.policy.forecast.grid import GridCurve, censor_bins, event_bins


class DurationClass:
    """Recent durations of one class: completed and censored (aborted), each with its start time.

    Two estimates come out of it (``curve``). The *cohort*: every operation that started after the latest start
    among the evicted entries. Its completions are all still in the history and its running members are the live
    ones, so the product limit over them (running ones censored at their elapsed time) is unbiased, in a transient
    (a step that just started, where only the short operations have finished) as in steady state; it covers ages up
    to now - that start. Beyond that age, the *complete sample* of retained completions takes over (a sample of
    recent completions has the duration distribution in steady state; running items must not be added to it, they
    would count the long durations twice)."""

    # Ring buffers, not deques: a refresh reads every history as an array, and converting a 2,048-entry deque cost
    # more than the rest of a class's curve. They grow by doubling up to ``history`` (memory follows what was
    # recorded, as with deques); once full, each new entry overwrites the oldest.
    __slots__ = ("history", "_done", "_done_starts", "_n_done", "_cens", "_cens_starts", "_n_cens", "evicted_start",
                 "_sum", "_hist", "_curves")

    def __init__(self, history: int) -> None:
        self.history = int(history)
        first = min(self.history, 16)
        self._done, self._done_starts, self._n_done = _ring(first), _ring(first), 0
        self._cens, self._cens_starts, self._n_cens = _ring(0), _ring(0), 0
        self.evicted_start = -math.inf  # the cohort is what started after this
        self._sum = 0.0
        # (dt, histograms), rebuilt when dirty
        self._hist: tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        # (dt, CurveHistory, complete-sample curve or None), likewise
        self._curves: tuple[float, CurveHistory, GridCurve | None] | None = None

    def record(self, duration: float, completed: bool, end: float = 0.0) -> int:
        """One duration that ended at ``end``; returns the completed count after it (-1 for a censored one)."""
        history = self.history
        if completed:
            values, starts, n = self._done, self._done_starts, self._n_done
            self._n_done = n + 1
        else:
            values, starts, n = self._cens, self._cens_starts, self._n_cens
            self._n_cens = n + 1
        if n >= history:  # full: overwrite the oldest
            i = n % history
            oldest = starts[i]
            if oldest > self.evicted_start:
                self.evicted_start = oldest
            if completed:
                self._sum -= values[i]
        else:
            i = n
            if n == len(values):
                values, starts = self._grow(completed, n)
        values[i] = duration
        starts[i] = end - duration
        self._hist = self._curves = None
        if completed:
            self._sum += duration
            return n + 1 if n < history else history
        return -1

    def _grow(self, completed: bool, n: int) -> tuple[array, array]:
        size = min(self.history, max(16, 2 * n))
        old = (self._done, self._done_starts) if completed else (self._cens, self._cens_starts)
        values, starts = _ring(size), _ring(size)
        values[:n], starts[:n] = old[0][:n], old[1][:n]
        if completed:
            self._done, self._done_starts = values, starts
        else:
            self._cens, self._cens_starts = values, starts
        return values, starts

    def copy(self) -> "DurationClass":
        """An independent class with the same history (stores.py splits a shared class with it)."""
        twin = DurationClass(self.history)
        twin._done, twin._done_starts = array("d", self._done), array("d", self._done_starts)
        twin._cens, twin._cens_starts = array("d", self._cens), array("d", self._cens_starts)
        twin._n_done, twin._n_cens = self._n_done, self._n_cens
        twin.evicted_start, twin._sum = self.evicted_start, self._sum
        return twin

    @property
    def count(self) -> int:
        return min(self._n_done, self.history)

    @property
    def mean(self) -> float:
        return self._sum / self.count if self._n_done else 0.0

    @property
    def allocated(self) -> tuple[int, int]:
        """Buffer slots held (completed, censored): they follow what was recorded, up to ``history`` each."""
        return len(self._done), len(self._cens)

    @property
    def completed(self) -> np.ndarray:
        """The completed durations kept, oldest first (diagnostics and tests; the refresh reads the buffers)."""
        return _in_order(self._done, self._n_done, self.history)

    @property
    def censored(self) -> np.ndarray:
        return _in_order(self._cens, self._n_cens, self.history)

    def histograms(self, dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(cohort completions, cohort censored, all completions, all censored) per grid point (bin counts: the
        order within the buffers does not matter)."""
        if self._hist is None or self._hist[0] != dt:
            nd, nc = min(self._n_done, self.history), min(self._n_cens, self.history)
            # each entry's grid point once: the cohort's histograms count a subset of the same points
            done, cens = event_bins(_view(self._done, nd), dt), censor_bins(_view(self._cens, nc), dt)
            in_done = _view(self._done_starts, nd) > self.evicted_start
            in_cens = _view(self._cens_starts, nc) > self.evicted_start
            hist = lambda bins: np.bincount(bins, minlength=1).astype(np.float64)  # noqa: E731
            self._hist = (dt, hist(done[in_done]), hist(cens[in_cens]), hist(done), hist(cens))
        return self._hist[1:]

    def curve_history(self, dt: float) -> CurveHistory:
        """The history's part of this class's curves (curve_history.py), kept until the class records again."""
        if self._curves is None or self._curves[0] != dt:
            self._curves = (dt, CurveHistory(*self.histograms(dt)), None)
        return self._curves[1]

    def complete_curve(self, dt: float) -> GridCurve:
        """The complete sample's curve (no live items censored), kept until the class records again."""
        history = self.curve_history(dt)
        assert self._curves is not None  # curve_history just set it
        curve = self._curves[2]
        if curve is None:
            _, _, ev_all, ce_all = self.histograms(dt)
            nz = np.flatnonzero(ev_all)
            curve = GridCurve(ev_all, ce_all, dt, history.tail_mean(None, int(nz[-1]) if nz.size else 0, dt, self.mean))
            self._curves = (dt, history, curve)
        return curve


def _ring(size: int) -> array:
    return array("d", bytes(8 * size))  # zeros


def _view(ring: array, n: int) -> np.ndarray:
    """The first ``n`` entries as a numpy view (read it, don't keep it)."""
    return np.frombuffer(ring, np.float64, n)


def _in_order(ring: array, n: int, history: int) -> np.ndarray:
    if n <= history:
        return _view(ring, n).copy()
    i = n % history
    buffer = _view(ring, history)
    return np.concatenate((buffer[i:], buffer[:i]))
