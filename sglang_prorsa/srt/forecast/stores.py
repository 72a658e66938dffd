"""Duration histories per conditioning class, and their vectorised use at refresh time.

A ``DurationStore`` keeps, for one kind of phase (tool -> next request, decode, reward, ...), a bounded history of
completed and censored durations per class. Classes are tuples of interned column values, finest first, for
example (task, tool) -> (task,) -> () for tool returns (B.5 conditions on task and tool; B.3 on the startup mode).
Every finished phase is recorded in each of its classes. At refresh, each live trajectory uses the finest class with
at least ``min_samples`` completions, else the finest with any, else the class's prior (an exponential with the
configured mean). Live trajectories are censored observations (still running at their elapsed time) of each class
they belong to, so a class's Kaplan-Meier curve is not biased toward the short durations that finish first.

``DurationStore.evaluate`` turns the live trajectories of one state into per-trajectory probabilities with a few
numpy passes: class resolution by look-up tables over interned ids, one bincount for the live censoring, one small
table per used class (grid.py), one gather. Memory is bounded: at most ``MAX_CLASSES`` classes per store, each with
at most ``history`` completed and ``history`` censored durations.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from sglang_prorsa.srt.forecast.grid import GridCurve, MAX_GRID_POINTS, censor_bins, chain_tables, event_bins

MAX_CLASSES = 4096
ID_COLUMNS = ("task", "tool", "mode")  # the id tuple of ``DurationStore.record_ids``
Key = tuple  # (level, *interned ids)


class DurationClass:
    """Recent durations of one class: completed and censored (aborted), each with its start time.

    Two estimates come out of it (``curve``). The *cohort*: every operation that started after the latest start
    among the evicted entries. Its completions are all still in the history and its running members are the live
    ones, so the product limit over them (running ones censored at their elapsed time) is unbiased, in a transient
    (a step that just started, where only the short operations have finished) as in steady state; it covers ages up
    to now - that start. Beyond that age, the *complete sample* of retained completions takes over (a sample of
    recent completions has the duration distribution in steady state; running items must not be added to it, they
    would count the long durations twice)."""

    __slots__ = ("completed", "starts", "censored", "censored_starts", "evicted_start", "_sum", "_hist")

    def __init__(self, history: int) -> None:
        self.completed: deque[float] = deque(maxlen=history)
        self.starts: deque[float] = deque(maxlen=history)
        self.censored: deque[float] = deque(maxlen=history)
        self.censored_starts: deque[float] = deque(maxlen=history)
        self.evicted_start = -math.inf  # the cohort is what started after this
        self._sum = 0.0
        self._hist: tuple | None = None  # (dt, histograms), rebuilt when dirty

    def record(self, duration: float, completed: bool, end: float = 0.0) -> None:
        values, starts = (self.completed, self.starts) if completed else (self.censored, self.censored_starts)
        if len(values) == values.maxlen:
            self.evicted_start = max(self.evicted_start, starts[0])
            if completed:
                self._sum -= values[0]
        values.append(duration)
        starts.append(end - duration)
        if completed:
            self._sum += duration
        self._hist = None

    @property
    def count(self) -> int:
        return len(self.completed)

    @property
    def mean(self) -> float:
        return self._sum / len(self.completed) if self.completed else 0.0

    def histograms(self, dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(cohort completions, cohort censored, all completions, all censored) per grid point."""
        if self._hist is None or self._hist[0] != dt:
            done = np.fromiter(self.completed, np.float64, len(self.completed))
            cens = np.fromiter(self.censored, np.float64, len(self.censored))
            in_done = np.fromiter(self.starts, np.float64, len(self.starts)) > self.evicted_start
            in_cens = np.fromiter(self.censored_starts, np.float64, len(self.censored_starts)) > self.evicted_start
            hist = lambda x, bins: np.bincount(bins(x, dt), minlength=1).astype(np.float64)  # noqa: E731
            self._hist = (dt, hist(done[in_done], event_bins), hist(cens[in_cens], censor_bins),
                          hist(done, event_bins), hist(cens, censor_bins))
        return self._hist[1:]


def _add(a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    if b is None or not b.size:
        return a
    out = np.zeros(max(a.size, b.size))
    out[: a.size] += a
    out[: b.size] += b
    return out


class DurationStore:
    def __init__(self, name: str, levels: Sequence[tuple[str, ...]], prior_s: float, *, history: int = 2048,
                 min_samples: int = 32, prior_of: Callable[[Key], float | None] | None = None) -> None:
        self.name = name
        self.levels = tuple(tuple(lv) for lv in levels)
        self.prior_s = float(prior_s)
        self.history = int(history)
        self.min_samples = int(min_samples)
        self._prior_of = prior_of
        self.classes: dict[Key, DurationClass] = {}
        # Bumped when a class appears or its completion count reaches 1 or ``min_samples``: the class resolution's
        # look-up tables depend on nothing else, so ``resolve`` builds them once per version (not once per refresh).
        self.version = 0
        self._resolution: tuple | None = None  # (version, radix of the finest columns, tables)
        self._chains: dict[tuple, list[DurationClass]] = {}  # (task, tool, mode) -> its classes (record_ids)

    # ----- recording (event path, O(levels)) -----
    def keys(self, ids: Mapping[str, int]) -> list[Key]:
        return [(i, *(ids[c] for c in lv)) for i, lv in enumerate(self.levels)]

    def record(self, ids: Mapping[str, int], duration: float, completed: bool = True, end: float = 0.0) -> None:
        """One finished (``completed``) or cut-short operation of ``duration`` seconds that ended at ``end``."""
        self.record_classes(self._classes_of(ids), duration, completed, end)

    def record_ids(self, ids: tuple[int, int, int], duration: float, completed: bool = True, end: float = 0.0) -> None:
        """``record`` for the ids ``(task, tool, mode)`` as a tuple (the tracker's event path): the classes of each id
        tuple are looked up once and kept (at most ``MAX_CLASSES`` tuples), not rebuilt per event."""
        classes = self._chains.get(ids)
        if classes is None:
            classes = self._classes_of(dict(zip(ID_COLUMNS, ids)))
            if len(self._chains) < MAX_CLASSES:
                self._chains[ids] = classes
        self.record_classes(classes, duration, completed, end)

    def record_classes(self, classes: list["DurationClass"], duration: float, completed: bool, end: float) -> None:
        duration = max(0.0, float(duration))
        end = float(end)
        for cls in classes:
            cls.record(duration, completed, end)
            if completed:
                n = len(cls.completed)
                if n == 1 or n == self.min_samples:
                    self.version += 1  # the class resolution (``resolve``) changes only here

    def _classes_of(self, ids: Mapping[str, int]) -> list["DurationClass"]:
        """The classes an operation with ``ids`` belongs to, finest first, created when first seen (when the store
        is full, only the coarsest level's classes are still created: they still learn)."""
        out, classes = [], self.classes
        for i, lv in enumerate(self.levels):
            key = (i,) if not lv else (i, ids[lv[0]]) if len(lv) == 1 else (i, *[ids[c] for c in lv])
            cls = classes.get(key)
            if cls is None:
                if len(classes) >= MAX_CLASSES and lv:
                    continue  # full: the coarser classes still learn
                cls = classes[key] = DurationClass(self.history)
                self.version += 1
            out.append(cls)
        return out

    def prior(self, key: Key) -> float:
        value = self._prior_of(key) if self._prior_of else None
        return self.prior_s if value is None else float(value)

    def tail_mean(self, key: Key) -> float:
        cls = self.classes.get(key)
        return cls.mean if cls is not None and cls.count else self.prior(key)

    def resolve_one(self, ids: Mapping[str, int]) -> Key:
        """The class one trajectory uses (for diagnostics and tests)."""
        keys = self.keys(ids)
        for key in keys:
            cls = self.classes.get(key)
            if cls is not None and cls.count >= self.min_samples:
                return key
        for key in keys:
            cls = self.classes.get(key)
            if cls is not None and cls.count:
                return key
        return keys[-1]

    def curve(self, key: Key, dt: float, live_censored: np.ndarray | None = None, now: float | None = None) -> GridCurve:
        """The class's survival curve. With ``now`` and the live items' elapsed-time histogram: the cohort estimate
        (live items censored) up to the cohort's age, the complete sample beyond; without: the complete sample."""
        cls = self.classes.get(key)
        if cls is None or not cls.count:
            return GridCurve(np.zeros(1), np.zeros(1), dt, self.prior(key))
        ev_c, ce_c, ev_all, ce_all = cls.histograms(dt)
        if now is None:
            return GridCurve(ev_all, ce_all, dt, cls.mean)
        age = now - cls.evicted_start
        if not math.isfinite(age):  # nothing evicted: the history holds every completion, the cohort is everything
            return GridCurve(ev_c, _add(ce_c, live_censored), dt, cls.mean)
        splice = int(max(0.0, age) / dt)
        live = None if live_censored is None else live_censored[: splice + 1]
        return GridCurve(ev_c, _add(ce_c, live), dt, cls.mean, late_events=ev_all, late_censored=ce_all,
                         splice_at=splice)

    # ----- refresh (vectorised over the live trajectories of one state) -----
    def resolve(self, ids: Mapping[str, np.ndarray], radix: Mapping[str, int], n: int | None = None,
                ) -> tuple[np.ndarray, list[Key], "Resolution"]:
        """Per live item: index into the returned list of used class keys (and the look-up tables behind it).

        Every level's columns are among the finest level's, so the resolution is a function of the finest class:
        it is built once over the finest class space (small: tasks x tools) and applied with one gather. The tables
        depend only on the classes' completion counts crossing 1 / ``min_samples`` (``version``) and on the radix,
        so they are kept between refreshes."""
        if n is None:
            n = next(iter(ids.values())).size if ids else 0
        fine = self.levels[0]
        lut, used, level_codes, rows = self._tables(radix)
        if len(fine) == 1:  # one column: its value is the code
            code = np.asarray(ids[fine[0]], np.int64)
        elif not fine:
            code = np.zeros(n, np.int64)
        else:
            code = np.asarray(ids[fine[0]], np.int64)
            for c in fine[1:]:
                code = code * radix[c] + ids[c]
        return lut[code], used, Resolution(code, level_codes, rows)

    def _tables(self, radix: Mapping[str, int]) -> tuple[np.ndarray, list[Key], list, list]:
        """(class index per finest class code, the used class keys, each level's code per finest class code, per used
        class the finest class codes that belong to it)."""
        fine = self.levels[0]
        radix_key = tuple(radix[c] for c in fine)
        cached = self._resolution
        if cached is not None and cached[0] == self.version and cached[1] == radix_key:
            return cached[2]
        space = math.prod(radix_key)
        # each column's value, then each level's code, over the finest class space
        values, stride = {}, 1
        for c in reversed(fine):
            values[c] = (np.arange(space) // stride) % radix[c]
            stride *= radix[c]
        level_codes = []
        for lv in self.levels:
            lc = np.zeros(space, np.int64)
            for c in lv:
                lc = lc * radix[c] + values[c]
            level_codes.append(lc)
        index_of: dict[Key, int] = {}
        lut = np.full(space, -1, np.int64)
        for min_count in (self.min_samples, 1):
            for level, lv in enumerate(self.levels):
                width = math.prod(radix[c] for c in lv)
                classes = np.full(width, -1, np.int64)
                for key, cls in self.classes.items():
                    if key[0] == level and cls.count >= min_count:
                        kc = _encode(lv, key[1:], radix)
                        if kc < width:
                            classes[kc] = index_of.setdefault(key, len(index_of))
                lut = np.where(lut < 0, classes[level_codes[level]], lut)
        last = len(self.levels) - 1
        if (lut < 0).any():  # no data at any level: the coarsest class's prior
            lv = self.levels[last]
            for lc in np.unique(level_codes[last][lut < 0]).tolist():
                key = (last, *_decode(lv, lc, radix))
                lut[(lut < 0) & (level_codes[last] == lc)] = index_of.setdefault(key, len(index_of))
        used = list(index_of)
        # per used class, the finest class codes that belong to it (its live-censoring histogram's rows)
        rows = [np.flatnonzero(level_codes[key[0]] == _encode(self.levels[key[0]], key[1:], radix))
                      for key in used]
        tables = (lut, used, level_codes, rows)
        self._resolution = (self.version, radix_key, tables)
        return tables

    def fit(self, ids: Mapping[str, np.ndarray], radix: Mapping[str, int], elapsed: np.ndarray, dt: float,
            now: float | None) -> "Fitted":
        """Resolve each live item's class; the used classes' curves (every item of the phase censored at its elapsed
        time; ``now`` None: complete-sample curves, no censoring) are built when first asked for."""
        res, used, resolution = self.resolve(ids, radix, elapsed.size)
        if now is None:
            return Fitted(self, res, used, {}, dt, now)
        if math.frexp(dt)[0] == 0.5:  # dt a power of two: elapsed * (1 / dt) is exactly elapsed / dt
            x = elapsed * (1.0 / dt)
            x += 1e-9
            floor = np.floor(x)
            bins = np.minimum(floor, MAX_GRID_POINTS - 1).astype(np.int64)  # = censor_bins(elapsed, dt)
        else:
            x = floor = None
            bins = censor_bins(elapsed, dt)
        fitted = Fitted(self, res, used, self._live_censoring(used, resolution, bins, radix), dt, now)
        if x is not None:  # the look-ups of the same items reuse their grid positions
            fitted.grid_of = (elapsed, x, floor, bins)
        return fitted

    def evaluate(self, ids: Mapping[str, np.ndarray], radix: Mapping[str, int], elapsed: np.ndarray, dt: float,
                 horizons: Sequence[float], then: Callable[[Key], np.ndarray | None] | None = None,
                 now: float | None = None, also: tuple[Mapping[str, np.ndarray], np.ndarray] | None = None,
                 ) -> list[np.ndarray]:
        """q_i = P(A - e_i + B < h | A > e_i) for each horizon h, per live trajectory i (see grid.py).

        ``then(key)`` gives the CDF on the grid of the phases that follow A for trajectories of class ``key``
        (None: the arrival is A's end). ``also`` = (ids, elapsed) of further items still running in this phase
        (in a later state of the same phase): censored like the others, not evaluated."""
        n = elapsed.size
        if n == 0:
            return [np.zeros(0) for _ in horizons]
        if also is not None and also[1].size:
            ids = {c: np.concatenate((ids[c], also[0][c])) for c in self.levels[0]}
            all_elapsed = np.concatenate((elapsed, also[1]))
        else:
            all_elapsed = elapsed
        fitted = self.fit(ids, radix, all_elapsed, dt, now)
        return fitted.probabilities(fitted.res[:n], elapsed, horizons, then)

    def _live_censoring(self, used: list[Key], resolution: "Resolution", ebins: np.ndarray,
                        radix: Mapping[str, int]) -> dict[int, np.ndarray]:
        """Per used class: histogram of the elapsed times of the live items that belong to it (at its level).

        One pass over the items: a histogram per finest class; a coarser class's is the sum of its finest classes'
        rows (integer counts: the same numbers as counting its members directly)."""
        out: dict[int, np.ndarray] = {}
        if not ebins.size:
            return out
        width = int(min(MAX_GRID_POINTS, ebins.max() + 1))
        space = resolution.level_codes[0].size
        if space == 1:
            fine = np.bincount(ebins, minlength=width)[None, :]
        else:
            fine = np.bincount(resolution.code * width + ebins, minlength=space * width).reshape(space, width)
        for j, rows in enumerate(resolution.rows):
            if rows.size == 1:
                out[j] = fine[rows[0]].astype(np.float64)
            elif rows.size == space:
                out[j] = fine.sum(axis=0).astype(np.float64)
            else:
                out[j] = fine[rows].sum(axis=0).astype(np.float64)
        return out


@dataclass(frozen=True)
class Resolution:
    code: np.ndarray  # per item: its finest class code
    level_codes: list  # per level: the level's class code of every finest class code
    rows: list = ()  # per used class: the finest class codes that belong to it


def _encode(columns: tuple, values, radix: Mapping[str, int]) -> int:
    code = 0
    for c, v in zip(columns, values):
        code = code * radix[c] + v
    return code


def _decode(columns: tuple, code: int, radix: Mapping[str, int]) -> list[int]:
    out = []
    for c in reversed(columns):
        out.append(code % radix[c])
        code //= radix[c]
    return out[::-1]


class Fitted:
    """A store's curves for one refresh: per used class, fitted with the live items' censoring. A curve is built
    when first asked for (``curve``, or ``probabilities`` for the classes its items use), then kept."""

    def __init__(self, store: DurationStore, res: np.ndarray, used: list[Key], live: dict[int, np.ndarray], dt: float,
                 now: float | None):
        self.store, self.res, self.used, self.dt = store, res, used, dt
        self._live, self._now = live, now
        self._built: dict[int, GridCurve] = {}
        self._index = {key: j for j, key in enumerate(used)}
        # (elapsed array, elapsed / dt + 1e-9, its floor, censor_bins) when the fit computed them (read only)
        self.grid_of: tuple | None = None

    @property
    def curves(self) -> list[GridCurve]:
        return [self._curve(j) for j in range(len(self.used))]

    def _curve(self, j: int) -> GridCurve:
        curve = self._built.get(j)
        if curve is None:
            curve = self._built[j] = self.store.curve(self.used[j], self.dt, self._live.get(j), self._now)
        return curve

    def curve(self, key: Key) -> GridCurve:
        j = self._index.get(key)
        return self._curve(j) if j is not None else self.store.curve(key, self.dt)

    def probabilities(self, res: np.ndarray, elapsed: np.ndarray, horizons: Sequence[float],
                      then: Callable[[Key], np.ndarray | None] | None) -> list[np.ndarray]:
        """q_i for each horizon, per item (``res``: the items' class indices, ``elapsed``: their elapsed times)."""
        if not res.size:
            return [np.zeros(0) for _ in horizons]
        k, w, short, long = self._lookup(res, elapsed, horizons, then)
        out = []
        for qs, ql in zip(short, long):
            lo = qs[k]
            out.append(lo + w * (ql[k] - lo))
        return out

    def expected(self, res: np.ndarray, elapsed: np.ndarray, horizons: Sequence[float],
                 then: Callable[[Key], np.ndarray | None] | None, weights: Sequence[np.ndarray | None],
                 ) -> list[list[float]]:
        """sum_i q_i(h) * weight_i for each weight (None: 1) and each horizon h: ``out[weight][horizon]``.

        The same numbers as summing ``probabilities`` times the weights, without the per-item q: with
        q_i = qs[k_i] + w_i (ql[k_i] - qs[k_i]), the sum is qs . A + (ql - qs) . B where A and B are the weights
        (and the weights times w) summed per table entry (two bincounts per weight, shared by all horizons)."""
        if not res.size:
            return [[0.0 for _ in horizons] for _ in weights]
        k, w, short, long = self._lookup(res, elapsed, horizons, then)
        size = short[0].size
        out = []
        for weight in weights:
            a = np.bincount(k, weight, minlength=size)
            bw = np.bincount(k, w if weight is None else w * weight, minlength=size)
            out.append([float((qs * a).sum() + ((ql - qs) * bw).sum()) for qs, ql in zip(short, long)])
        return out

    def _lookup(self, res: np.ndarray, elapsed: np.ndarray, horizons: Sequence[float],
                then: Callable[[Key], np.ndarray | None] | None) -> tuple:
        """(k, w, q_short per horizon, q_long per horizon): item i's q over horizon t is
        q_short[t][k_i] + w_i * (q_long[t][k_i] - q_short[t][k_i]) (grid.py's ``ChainTable.lookup``); the tables of
        the classes the items use, one after the other."""
        dt = self.dt
        # tables only for the classes these items use
        if len(self.used) > 1:
            present = np.flatnonzero(np.bincount(res, minlength=len(self.used)))
        else:
            present = np.zeros(1, np.int64)
        tables = [chain_tables(self._curve(j), horizons, then(self.used[j]) if then is not None else None)
                  for j in present.tolist()]
        # position on the grid: the elapsed time's grid point b (the tail entry beyond the data) and the fraction
        # of a step past it; off the grid the window covers (frac + 0.5) of point b + H (see ChainTable.lookup)
        grid = self.grid_of
        if grid is not None and grid[0] is elapsed:
            _, x, floor, b = grid  # shared: not written below
            w = np.subtract(x, floor)
            fresh = False
        else:
            x = elapsed * (1.0 / dt)  # elapsed >= 0
            x += 1e-9
            floor = np.floor(x)
            b = floor.astype(np.int64)
            w = np.subtract(x, floor, out=x)
            fresh = True
        w -= 1e-9  # the fraction of a step past b
        on_grid = w <= 1e-9
        w += 0.5
        np.minimum(w, 1.0, out=w)
        w[on_grid] = 0.0
        if present.size == 1:  # the common case: one class, no per-item class look-ups
            k = np.minimum(b, tables[0][0].last, out=b if fresh else None)
            qs = [t.q_short for t in tables[0]]
            ql = [t.q_long for t in tables[0]]
            return k, w, qs, ql
        # several classes: each class's tables padded with its tail entry to one length L, so that item i's entry is
        # row(i) * L + min(b_i, L - 1) (the same entry as min(b_i, last of its class) in its own table)
        width = max(tb[0].last for tb in tables) + 1
        if present.size == len(self.used):
            rows = res
        else:
            compact = np.zeros(len(self.used), np.int64)
            compact[present] = np.arange(present.size)
            rows = compact[res]
        k = np.minimum(b, width - 1, out=b if fresh else None)
        k += rows * width
        qs, ql = [], []
        for t in range(len(horizons)):
            for out, field in ((qs, "q_short"), (ql, "q_long")):
                flat = np.empty(present.size * width)
                for row, tb in enumerate(tables):
                    q = getattr(tb[t], field)
                    flat[row * width: row * width + q.size] = q
                    flat[row * width + q.size: (row + 1) * width] = q[-1]
                out.append(flat)
        return k, w, qs, ql
