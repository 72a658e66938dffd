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
table per used class (grid.py), one gather. Each item sits in a cell (its finest class, its elapsed time's grid
point): the live censoring counts the cells, and ``Fitted.expected`` sums a refresh's arrivals over the same cells
(two bincounts per weight), without the per-item probabilities. Memory is bounded: at most ``MAX_CLASSES`` classes
per store, each with at most ``history`` completed and ``history`` censored durations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from sglang_prorsa.policy.forecast.curve_history import exposure_past
from sglang_prorsa.policy.forecast.durations import DurationClass
from sglang_prorsa.policy.forecast.grid import MAX_GRID_POINTS, GridCurve, censor_bins, chain_windows, window_points

MAX_CLASSES = 4096
_sum = np.add.reduce  # ndarray.sum without its Python wrapper (the same pairwise sum)
ID_COLUMNS = ("task", "tool", "mode")  # the id tuple of ``DurationStore.record_ids``
Key = tuple  # (level, *interned ids)
_UNGROUPED: np.ndarray = np.empty(0, np.int64)  # GridItems' cells, classes and counts before ``grouped`` (none)
_UNGROUPED.flags.writeable = False


def unfinished_tail_mean(cls: DurationClass | None, dt: float, live: np.ndarray | None, prior_s: float) -> float:
    """The exponential mean of a class with no completion: the prior mean lengthened by the time its censored
    (aborted) durations and its live items have spent past twice the prior mean (curve_history.py's tail estimate
    counts from the longest completion; here there is none, only a guess). Operations that have run far longer than
    expected without one completing make the prior longer: with the prior alone, episodes that never come back (a
    single-turn task whose trainer sends no reward hint) kept a constant chance of a next request in every window.
    A class's first batch, started together and none done yet, says nothing against the prior until it has run
    well past it (counted from zero, 180 sandboxes 2.5 s old made a 3 s prior 450 s, and the demo's surge vanished)."""
    point = 2 * int(round(prior_s / dt))
    exposure = exposure_past(live, point) if live is not None else 0.0
    if cls is not None:
        exposure += exposure_past(cls.histograms(dt)[3], point)
    return dt * exposure + prior_s


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
        # A class created together with its only finer member shares that member's object until some operation
        # reaches one and not the other (a second member, or a full store): until then both recorded the same
        # durations in the same order, so one object holds both. With one task, (task,) and () are the same class:
        # an operation is then written to fewer classes. Shared objects: id -> the keys that share it.
        self._shared: dict[int, list[Key]] = {}

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
        duration = float(duration)
        if not duration > 0.0:  # max(0.0, duration), NaN included
            duration = 0.0
        end, min_samples = float(end), self.min_samples
        for cls in classes:
            n = cls.record(duration, completed, end)  # the completed count (-1: censored)
            if n == 1 or n == min_samples:
                self.version += 1  # the class resolution (``resolve``) changes only here

    def _classes_of(self, ids: Mapping[str, int]) -> list["DurationClass"]:
        """The classes an operation with ``ids`` belongs to, finest first, each object once, created when first seen
        (when the store is full, only the coarsest level's classes are still created: they still learn)."""
        keys: list[Key] = []
        out: list[DurationClass] = []
        classes = self.classes
        fresh = None  # the class this call created at the previous level
        for i, lv in enumerate(self.levels):
            key = (i,) if not lv else (i, ids[lv[0]]) if len(lv) == 1 else (i, *[ids[c] for c in lv])
            cls = classes.get(key)
            if cls is None:
                if len(classes) >= MAX_CLASSES and lv:
                    fresh = None
                    continue  # full: the coarser classes still learn
                if fresh is not None:  # both new, the finer its only member: the same records from here on
                    cls = classes[key] = fresh
                    self._shared.setdefault(id(fresh), [keys[-1]]).append(key)
                else:
                    cls = classes[key] = fresh = DurationClass(self.history)
                self.version += 1
            else:
                fresh = None
            keys.append(key)
            if not any(c is cls for c in out):
                out.append(cls)
        for j, cls in enumerate(out):
            sharers = self._shared.get(id(cls))
            if sharers is not None and not all(k in keys for k in sharers):
                out[j] = self._split(cls, [k for k in sharers if k in keys], [k for k in sharers if k not in keys])
        return out

    def _split(self, shared: DurationClass, ours: list[Key], others: list[Key]) -> DurationClass:
        """An operation reaches the keys ``ours`` of a shared class and not ``others``: ours get their own copy."""
        twin = shared.copy()
        del self._shared[id(shared)]
        for keys, cls in ((ours, twin), (others, shared)):
            for key in keys:
                self.classes[key] = cls
            if len(keys) > 1:
                self._shared[id(cls)] = keys
        self._chains.clear()  # cached chains may hold the shared object for our keys
        return twin

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
        if cls is None or not cls.count:  # all tail: the prior, lengthened by the time at risk with no completion
            return GridCurve(np.zeros(1), np.zeros(1), dt, unfinished_tail_mean(cls, dt, live_censored, self.prior(key)))
        if now is None:
            return cls.complete_curve(dt)
        history = cls.curve_history(dt)
        age = now - cls.evicted_start
        if not math.isfinite(age):  # nothing evicted: the history holds every completion, the cohort is everything
            return history.curve(live_censored, None, dt, cls.mean)
        return history.curve(live_censored, int(max(0.0, age) / dt), dt, cls.mean)

    # ----- refresh (vectorised over the live trajectories of one state) -----
    def resolve(self, ids: Mapping[str, np.ndarray], radix: Mapping[str, int], n: int | None = None,
                ) -> tuple[np.ndarray, list[Key], "Resolution"]:
        """Per live item: index into the returned list of used class keys (and the look-up tables behind it).

        Every level's columns are among the finest level's, so the resolution is a function of the finest class:
        it is built once over the finest class space (small: tasks x tools) and applied with one gather. The tables
        depend only on the classes' completion counts crossing 1 / ``min_samples`` (``version``) and on the radix,
        so they are kept between refreshes."""
        lut, used, level_codes, rows = self._tables(radix)
        code = self._codes(ids, radix, n)
        return lut[code], used, Resolution(code, level_codes, rows)

    def _codes(self, ids: Mapping[str, np.ndarray], radix: Mapping[str, int], n: int | None) -> np.ndarray:
        """Each item's finest class code."""
        fine = self.levels[0]
        if len(fine) == 1:  # one column: its value is the code
            return np.asarray(ids[fine[0]], np.int64)
        if not fine:
            if n is None:
                n = next(iter(ids.values())).size if ids else 0
            return np.zeros(n, np.int64)
        code = np.asarray(ids[fine[0]], np.int64)
        for c in fine[1:]:
            code = code * radix[c] + ids[c]
        return code

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
        if now is None or not elapsed.size:
            res, used, _ = self.resolve(ids, radix, elapsed.size)
            return Fitted(self, res, used, {}, dt, now)
        lut, used, _, rows = self._tables(radix)
        code = self._codes(ids, radix, elapsed.size)
        if math.frexp(dt)[0] == 0.5:  # dt a power of two: elapsed * (1 / dt) is exactly elapsed / dt
            items = GridItems(elapsed, dt)  # the look-ups' grid points are the censoring ones (censor_bins)
            bins, width = items.bins, items.width
            assert bins is not None  # not grouped yet
        else:
            items, bins = None, censor_bins(elapsed, dt)
            width = int(bins.max()) + 1
        space = lut.size
        cell = bins  # (finest class, grid point), in place: the grid points are not needed on their own
        if space > 1:
            cell += code * width
        live, fine = self._live_censoring(rows, cell, width, space)
        fitted = Fitted(self, None, used, live, dt, now, code=code, lut=lut)
        # The fit's own items are looked up by the same cells: per-class cells need a gather and a bincount more;
        # cells per finest class cost O(classes x width) per weighted sum, so only while that is small.
        if items is not None and (space <= 4 * len(used) or space * width <= elapsed.size):
            fitted.own = items.grouped(cell, lut, fine.sum(axis=1), fine.ravel())
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
            fitted = self.fit(ids, radix, np.concatenate((elapsed, also[1])), dt, now)
            return fitted.probabilities(fitted.res[:n], elapsed, horizons, then)
        fitted = self.fit(ids, radix, elapsed, dt, now)
        return fitted.probabilities(None, elapsed, horizons, then)

    @staticmethod
    def _live_censoring(rows: Sequence[np.ndarray], cell: np.ndarray, width: int, space: int,
                        ) -> tuple[dict[int, np.ndarray], np.ndarray]:
        """Per used class: histogram of the elapsed times of the live items that belong to it (at its level); and
        the items per cell (finest class, grid point).

        One pass over the items: a histogram per finest class (``cell`` = finest class * width + grid point); a
        coarser class's is the sum of its finest classes' rows (integer counts: the same numbers as counting its
        members directly)."""
        fine = np.bincount(cell, minlength=space * width).reshape(space, width)
        out: dict[int, np.ndarray] = {}
        for j, r in enumerate(rows):
            if r.size == 1:
                out[j] = fine[r[0]].astype(np.float64)
            elif r.size == space:
                out[j] = fine.sum(axis=0).astype(np.float64)
            else:
                out[j] = fine[r].sum(axis=0).astype(np.float64)
        return out, fine


@dataclass(frozen=True)
class Resolution:
    code: np.ndarray  # per item: its finest class code
    level_codes: list  # per level: the level's class code of every finest class code
    rows: Sequence[np.ndarray] = ()  # per used class: the finest class codes that belong to it


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


class GridItems:
    """Items placed on the grid for table look-ups (grid.py's ``ChainTable.lookup``): each item's grid point (its
    elapsed time's, capped at the last one) and, when first asked for, its weight within the step; once grouped,
    its cell ``group * width + grid point`` among ``size`` cells, a group being a finest class (a fit's own items)
    or a used class, ``classes`` the used class of each group, ``counts`` its items (and ``cell_counts`` the items
    per cell, when known)."""

    def __init__(self, elapsed: np.ndarray, dt: float) -> None:
        x = elapsed * (1.0 / dt)  # elapsed >= 0
        x += 1e-9
        floor = np.floor(x)
        top = float(floor.max()) if floor.size else -1.0
        self.bins: np.ndarray | None  # None once grouped: the cells replace them
        if top > MAX_GRID_POINTS - 1:  # (a max pass spares the clip pass when nothing is that old)
            top = MAX_GRID_POINTS - 1
            self.bins = np.minimum(floor, top).astype(np.int64)
        else:
            self.bins = floor.astype(np.int64)
        self.width = int(top) + 1
        self.elapsed = elapsed
        self._x: np.ndarray | None = x  # x and floor: released once the weight is computed
        self._floor: np.ndarray | None = floor
        self._weight: np.ndarray | None = None
        self.cell = self.classes = self.counts = _UNGROUPED  # (no cells until ``grouped``)
        self.cell_counts: np.ndarray | None = None
        self.size = 0

    def grouped(self, cell: np.ndarray, classes: np.ndarray, counts: np.ndarray,
                cell_counts: np.ndarray | None = None) -> "GridItems":
        self.cell, self.classes, self.counts, self.cell_counts = cell, classes, counts, cell_counts
        self.bins = None  # the cells replace them (a fit adds the class to them in place)
        self.size = classes.size * self.width
        return self

    @classmethod
    def by_class(cls, res: np.ndarray, elapsed: np.ndarray, dt: float, n_classes: int) -> "GridItems":
        items = cls(elapsed, dt)
        cell = items.bins
        assert cell is not None  # not grouped yet
        if n_classes == 1:
            return items.grouped(cell, np.zeros(1, np.int64), np.array([res.size]))
        cell += res * items.width
        return items.grouped(cell, np.arange(n_classes), np.bincount(res, minlength=n_classes))

    def weight(self) -> np.ndarray:
        """The fraction of a step past the grid point, as the look-up weighs the long window (ChainTable.lookup):
        min(frac + 0.5, 1), 0 exactly on a grid point."""
        if self._weight is None:
            x, floor = self._x, self._floor
            assert x is not None and floor is not None  # released only together with setting the weight
            w = np.subtract(x, floor, out=x)
            w -= 1e-9
            # items exactly on a grid point are rare (elapsed times are differences of float timestamps): a min pass
            # finds whether there are any; only then a mask (a multiply by it, not a masked store: when many items
            # are on the grid the mask is irregular and the store branches on it)
            on_grid = w.size and w.min() <= 1e-9
            off_grid = w > 1e-9 if on_grid else None
            w += 0.5
            np.minimum(w, 1.0, out=w)
            if off_grid is not None:
                w *= off_grid
            self._weight, self._x, self._floor = w, None, None
        return self._weight


class Fitted:
    """A store's curves for one refresh: per used class, fitted with the live items' censoring. A curve is built
    when first asked for (``curve``, or ``probabilities`` for the classes its items use), then kept."""

    def __init__(self, store: DurationStore, res: np.ndarray | None, used: list[Key], live: dict[int, np.ndarray],
                 dt: float, now: float | None, *, code: np.ndarray | None = None, lut: np.ndarray | None = None):
        self.store, self.used, self.dt = store, used, dt
        self._res, self._code, self._lut = res, code, lut  # res None: lut[code], gathered when first read
        self._live, self._now = live, now
        self._built: dict[int, GridCurve] = {}
        self._index = {key: j for j, key in enumerate(used)}
        self.own: GridItems | None = None  # the fit's items by finest class and grid point (the censoring's cells)

    @property
    def res(self) -> np.ndarray:
        """Each item's index into ``used``."""
        if self._res is None:
            assert self._lut is not None and self._code is not None  # res None comes with lut and code
            self._res = self._lut[self._code]
        return self._res

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

    def probabilities(self, res: np.ndarray | None, elapsed: np.ndarray, horizons: Sequence[float],
                      then: Callable[[Key], np.ndarray | None] | None) -> list[np.ndarray]:
        """q_i for each horizon, per item (``res``: the items' class indices, None: the fit's own items, then
        ``elapsed`` is the array the fit was given; ``elapsed``: their elapsed times)."""
        if not elapsed.size:
            return [np.zeros(0) for _ in horizons]
        items = self._items(res, elapsed)
        w, cell = items.weight(), items.cell
        out = []
        for table in self._tables(items, horizons, then):
            if table is None:
                out.append(np.zeros(elapsed.size))
            else:
                lo = table[0][cell]
                out.append(lo + w * table[1][cell])
        return out

    def expected(self, res: np.ndarray | None, elapsed: np.ndarray, horizons: Sequence[float],
                 then: Callable[[Key], np.ndarray | None] | None, weights: Sequence[np.ndarray | None],
                 scale: np.ndarray | None = None) -> list[list[float]]:
        """sum_i q_i(h) * s_i * weight_i for each weight (None: 1) and each horizon h: ``out[weight][horizon]``
        (``res`` and ``elapsed`` as for ``probabilities``; s: ``scale``, per item, None: 1).

        The same numbers as summing ``probabilities`` times the weights, in one of two ways (equal up to the order
        of the additions): with q_i = qs[c_i] + w_i (ql[c_i] - qs[c_i]) for item i in cell c_i,

        * per cell: the sum is qs . A + (ql - qs) . B where A and B are the weights (and the weights times w) summed
          per cell (two bincounts per weight, shared by all horizons);
        * per item, when one horizon has a window and some weight is an array: q_i gathered from the small table
          once (two gathers), then one product and one sum per weight. A bincount scatters, several times the cost
          of an elementwise pass; the per-cell way needs two per array weight, the per-item way none."""
        if not elapsed.size:
            return [[0.0 for _ in horizons] for _ in weights]
        items = self._items(res, elapsed)
        tables = self._tables(items, horizons, then)
        w, cell, size = items.weight(), items.cell, items.size
        windowed = [table for table in tables if table is not None]
        if len(windowed) == 1 and (scale is not None or any(weight is not None for weight in weights)):
            q_short, q_diff = windowed[0]
            q = q_diff.take(cell)
            q *= w
            q += q_short.take(cell)  # q_i, as ``probabilities`` computes it
            if scale is not None:
                q *= scale  # s_i q_i, once for all weights
            sums = [float(_sum(q if weight is None else q * weight)) for weight in weights]
            return [[0.0 if table is None else total for table in tables] for total in sums]
        if scale is not None:  # per cell: the scaled weights summed (as the callers passed them before ``scale``)
            weights = [scale if weight is None else scale * weight for weight in weights]
        out = []
        for weight in weights:
            if weight is None and items.cell_counts is not None:  # the censoring histogram counted them
                a = items.cell_counts
            else:
                a = np.bincount(cell, weight, minlength=size)
            bw = np.bincount(cell, w if weight is None else w * weight, minlength=size)
            out.append([0.0 if table is None else float(_sum(table[0] * a) + _sum(table[1] * bw))
                        for table in tables])
        return out

    def _items(self, res: np.ndarray | None, elapsed: np.ndarray) -> GridItems:
        own = self.own
        if res is None:
            if own is not None and own.elapsed is elapsed:
                return own
            res = self.res
        return GridItems.by_class(res, elapsed, self.dt, len(self.used))

    def _tables(self, items: GridItems, horizons: Sequence[float], then: Callable[[Key], np.ndarray | None] | None,
                ) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Per horizon, (q_short, q_long - q_short) per cell of ``items``: each group's class's chain table (grid.py)
        at grid points 0..width-1, or None for an empty window (q = 0: nothing arrives). Tables only for the classes
        that items use; a group without items reads zeros."""
        windowed = [h for h in horizons if window_points(h, self.dt) > 0]
        if not windowed:
            return [None for _ in horizons]
        has = np.zeros(len(self.used), bool)
        has[items.classes[items.counts > 0]] = True
        present = np.flatnonzero(has)
        windows = [chain_windows(self._curve(j), windowed, then(self.used[j]) if then is not None else None,
                                 items.width) for j in present.tolist()]
        row = np.full(len(self.used), present.size)  # classes without items: a zero row after the others
        row[present] = np.arange(present.size)
        rows = row[items.classes]
        out: list[tuple[np.ndarray, np.ndarray] | None] = []
        t = 0
        for h in horizons:
            if window_points(h, self.dt) <= 0:
                out.append(None)
                continue
            q = np.zeros((2, present.size + 1, items.width))
            for r, window in enumerate(windows):
                q[0, r], q[1, r] = window[t]
            q_short = q[0][rows].ravel()
            out.append((q_short, q[1][rows].ravel() - q_short))
            t += 1
        return out
