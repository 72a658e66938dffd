"""The live trajectories' columns as one refresh sees them, and the per-source sums a refresh accumulates.

The tracker keeps numeric columns per slot (lifecycle/columns.py). A refresh sorts the slots by state once (a radix
sort of the 8-bit state column, ``state_order``) and gathers each column in that order only for the states that read
it, so every state, and every run of consecutive states, is a contiguous slice: the terms (terms.py, samples.py) read
views and small gathers, never scan the whole table per term (issue 10, item 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sglang_prorsa.policy.lifecycle.states import STATE_CODES, TrajState


@dataclass
class SourceSums:
    """Raw (uncorrected) predicted arrivals of one source over S, and over h* with their KV and prefill work."""

    arrivals: float = 0.0  # tokens arriving before t + S
    admitted: float = 0.0  # tokens arriving before t + h* (admitted to decode before t + S)
    count: float = 0.0  # expected requests before t + S
    admitted_count: float = 0.0
    admitted_kv: float = 0.0  # kappa_D of the admitted tokens (set by ``finish``)
    work_s: float = 0.0  # expected prefill seconds of the arrivals before t + S: the next refresh's load (``finish``)

    def add(self, q_s: np.ndarray, q_h: np.ndarray, x: np.ndarray) -> None:
        # elementwise products, not np.dot: BLAS threads cost more than they save on a busy machine
        self.arrivals += float((q_s * x).sum())
        self.admitted += float((q_h * x).sum())
        self.count += float(q_s.sum())
        self.admitted_count += float(q_h.sum())

    def add_expected(self, tokens: list[float], requests: list[float]) -> None:
        """Totals from ``Fitted.expected``: [over S, over h*] of sum q_i x_i and of sum q_i."""
        self.arrivals += tokens[0]
        self.admitted += tokens[1]
        self.count += requests[0]
        self.admitted_count += requests[1]

    def add_new(self, n_arrivals: float, n_admitted: float, x: float) -> None:
        self.arrivals += n_arrivals * x
        self.count += n_arrivals
        self.admitted += n_admitted * x
        self.admitted_count += n_admitted

    def finish(self, prefill_time, page_size: int) -> None:
        """Work and KV from the totals (fractional requests): g at the mean predicted length, and kappa_D's page
        rounding as half a page per request on average (predicted lengths are estimates anyway)."""
        self.work_s = self.count * float(prefill_time(np.array([self.arrivals / self.count]))[0]) if self.count else 0.0
        self.admitted_kv = self.admitted + self.admitted_count * (page_size - 1) / 2.0


class Snapshot:
    """The live trajectories' columns, read once per refresh and ordered by state (one sort of the slots by state,
    ``state_order``; each column gathered once, when first needed), so every state is a contiguous slice: a term
    reads views, never gathers. Consecutive state codes (e.g. decoded, tool, tool_done) form one slice too."""

    COLUMNS = ("entered", "prompt", "next_prompt", "task", "tool", "turn", "group", "mode", "instance", "launched",
               "sandbox", "decoded", "tool_start")
    # read for most states: gathered once for every live slot (one gather; slices are views), the others per slice
    WHOLE = frozenset({"entered", "prompt", "next_prompt", "task"})
    # used as indices into small tables: gathered as int64 (numpy gathers several times faster by int64 indices than
    # by the columns' int32, which it converts element by element)
    INDEX = frozenset({"task", "tool", "group", "instance"})  # (turn: only added to an int64 code, terms.py)

    def __init__(self, now: float, engine_shift: float, columns, radix: dict) -> None:
        self.now = now
        self.engine_shift = engine_shift  # seconds the engine states' clocks are behind (a pause in progress)
        self.radix = radix
        self._columns = columns
        self._order, self._ends = state_order(columns.view("state"))
        self._elapsed: dict[tuple, np.ndarray] = {}
        self._spans: dict[tuple, slice] = {}
        self._hinted: bool | None = None

    @property
    def hinted(self) -> bool:
        """Whether any slot holds a trainer's next-prompt estimate; if none does, every live item's is -1 and the
        column need not be read (one compare over the slots instead of a gather and a pass per state)."""
        if self._hinted is None:
            self._hinted = bool((self._columns.view("next_prompt") >= 0).any())
        return self._hinted

    def __getattr__(self, name: str) -> "_SortedColumn":
        """A column, set up at its first read; kept as an attribute, so that later reads skip this look-up."""
        if name not in Snapshot.COLUMNS:
            raise AttributeError(name)
        whole = name in Snapshot.WHOLE
        col = _SortedColumn(self._columns.view(name), self._order, int(self._ends[0]) if whole else None,
                            name in Snapshot.INDEX)
        self.__dict__[name] = col
        return col

    def members(self, state: TrajState) -> slice:
        return self.span(state)

    def span(self, *states: TrajState) -> slice:
        """The slice of ``states`` (consecutive state codes) in the sorted columns."""
        sl = self._spans.get(states)
        if sl is None:
            codes = sorted(STATE_CODES[s] for s in states)
            assert codes == list(range(codes[0], codes[-1] + 1)), "states must have consecutive codes"
            sl = self._spans[states] = slice(int(self._ends[codes[0]]), int(self._ends[codes[-1] + 1]))
        return sl

    @staticmethod
    def count(sl: slice) -> int:
        return sl.stop - sl.start

    def elapsed(self, idx, engine: bool = False, since: np.ndarray | None = None) -> np.ndarray:
        """Seconds the items ``idx`` have spent in their state (``since``: in the phase that started then); the
        same array for the same slice within a refresh (read it, don't write it)."""
        key = (idx.start, idx.stop, engine) if since is None and isinstance(idx, slice) else None
        out = self._elapsed.get(key) if key is not None else None
        if out is None:
            now = self.now - self.engine_shift if engine else self.now
            out = np.subtract(now, (self.entered if since is None else since)[idx])
            if out.size and out.min() < 0:  # a min pass; the clip pass only when some item started after now
                np.maximum(out, 0.0, out=out)
            if key is not None:
                self._elapsed[key] = out
        return out

    def running(self, states: tuple[TrajState, ...], since: str) -> tuple["_Ids", np.ndarray]:
        """(ids, elapsed) of the members of ``states`` whose phase started at column ``since`` (-1: not in it),
        in sorted order (the members of the lowest state code first)."""
        sl = self.span(*states)
        start = getattr(self, since)[sl]
        keep = start >= 0
        return _Ids(self, sl, keep), np.maximum(self.now - start[keep], 0.0)

    def ids(self, idx, keep: np.ndarray | None = None) -> "_Ids":
        """The class columns (task, tool, mode) of the items ``idx``, gathered when a store asks for them."""
        return _Ids(self, idx, keep)


def state_order(state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slots sorted by state code, stable; ends) with ``ends[code + 1]`` the number of slots with a state code <=
    code (FREE = -1 first): ``np.argsort(state, kind="stable")`` and the cumulative state counts.

    The stable argsort of an 8-bit column is numpy's radix sort: one counting pass and one scatter, O(slots) and
    about ten times faster here than a comparison sort of (state, slot) int32 keys (3.1 ms at 131k slots when no SIMD
    sort is dispatched). The counts are binary searches in the sorted codes (a gather of bytes), not a bincount."""
    order = np.argsort(state, kind="stable")  # int64 positions: numpy gathers faster by them than by int32 ones
    codes = state.take(order)
    levels = len(STATE_CODES) + 1  # FREE and the states
    ends = np.searchsorted(codes, np.arange(-1, levels - 1, dtype=codes.dtype), side="right")
    return order, ends


class _SortedColumn:
    """A column in state order, gathered per slice on demand (a term touches only its states' rows)."""

    def __init__(self, values: np.ndarray, order: np.ndarray, live_start: int | None = None,
                 wide: bool = False) -> None:
        self._values, self._order = values, order
        self._cache: dict[tuple[int, int], np.ndarray] = {}
        self._live_start = live_start  # not None: gather all live slots (from this position) at the first read
        self._whole: np.ndarray | None = None
        self._wide = wide  # gathered as int64

    def _gather(self, positions: np.ndarray) -> np.ndarray:
        out = self._values.take(positions)  # take: faster than fancy indexing for a 1-d gather
        return out.astype(np.int64) if self._wide else out

    def __getitem__(self, sl: slice) -> np.ndarray:
        if self._live_start is not None:
            if self._whole is None:
                self._whole = self._gather(self._order[self._live_start:])
            return self._whole[sl.start - self._live_start:sl.stop - self._live_start]
        key = (sl.start, sl.stop)
        out = self._cache.get(key)
        if out is None:
            out = self._cache[key] = self._gather(self._order[sl])
        return out


class _Ids(Mapping):
    _COLUMNS = ("task", "tool", "mode")

    def __init__(self, snap: Snapshot, sl: slice, keep: np.ndarray | None) -> None:
        self._snap, self._sl, self._keep = snap, sl, keep
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        out = self._cache.get(name)
        if out is None:
            raw = getattr(self._snap, name)[self._sl]
            out = np.maximum(raw, 0) if name == "tool" else (raw == 1) if name == "mode" else raw
            if self._keep is not None:
                out = out[self._keep]
            self._cache[name] = out
        return out

    def __iter__(self):
        return iter(self._COLUMNS)

    def __len__(self) -> int:
        return len(self._COLUMNS)
