"""Censored survival curves on a time grid, and "arrives within the horizon" tables for chains of phases.

Every arrival probability the predictor uses has the form

    q(e) = P(A - e + B < h | A > e)                                                     (B.2 Eq. 2, B.3 Eq. 6 when B = 0)

where A is the duration of the phase a trajectory is in (elapsed e), B the duration of the phases that follow before
its next request joins the ready queue (0 for a single phase; decode -> tool -> request for a decoding trajectory;
reward -> launch of the replacement for the sampler), and h the horizon. The paper conditions single phases on
elapsed time (Eq. 2, 6); chains (B != 0) go beyond it: they are what makes a decoding trajectory that will return
through a short tool visible to the forecast (issue 10).

Durations live on a grid of step ``dt`` (a power of two seconds, ~S/64): a completed duration d counts at grid point
round(d/dt), an operation censored at c (still running, or aborted) is at risk up to floor(c/dt). A is estimated with
the Kaplan-Meier product limit over completed and censored durations, which is unbiased under right censoring (the
long operations are the ones still running); beyond the last completed duration the curve continues as an
exponential with the class's mean completed duration (the product limit carries no information there). For each
elapsed grid point b the table holds q for windows ending strictly before grid points b + H and b + H + 1 (H = h/dt);
an elapsed time between grid points interpolates between the two, so that the window is h long to within dt/2.
Building a table costs O(L * H) for a curve of L grid points (a refresh builds it only as far as its items' elapsed
times reach, ``chain_windows``); looking up n trajectories is an O(n) gather. With durations and elapsed times on
the grid (integer seconds, h = 10 s) the values equal the exact product-limit ones.
"""

from __future__ import annotations

import math

import numpy as np

_sum = np.add.reduce  # ndarray.sum without its Python wrapper (the same pairwise sum)
MAX_GRID_POINTS = 1 << 14  # durations beyond 16384 * dt (~34 min at S = 10 s) are treated as that long


def grid_step(horizon_s: float) -> float:
    """The grid step for horizon S: the power of two seconds at or below S / 64 (S = 10 s -> 0.125 s)."""
    return 2.0 ** max(-10, min(4, math.floor(math.log2(horizon_s / 64.0))))


def window_points(horizon_s: float, dt: float) -> int:
    """H: the grid steps a window of ``horizon_s`` spans (0 or less: an empty window, nothing arrives within it)."""
    return int(round(horizon_s / dt))


def event_bins(durations: np.ndarray, dt: float) -> np.ndarray:
    return np.minimum(np.floor(np.asarray(durations, np.float64) / dt + 0.5), MAX_GRID_POINTS - 1).astype(np.int64)


def censor_bins(durations: np.ndarray, dt: float) -> np.ndarray:
    return np.minimum(np.floor(np.asarray(durations, np.float64) / dt + 1e-9), MAX_GRID_POINTS - 1).astype(np.int64)


def product_limit_hazard(events: np.ndarray, censored: np.ndarray, n: int) -> np.ndarray:
    """Product-limit hazard d_k / n_k at grid points 0..n-1 (censored beyond n-1: at risk everywhere up to it).

    n_k counts every duration at or beyond point k: a suffix sum over both histograms, those beyond n-1 included.
    The histograms hold counts (whole numbers), so the order of the additions changes no value."""
    total = np.zeros(max(events.size, censored.size, n))
    total[:events.size] = events
    total[:censored.size] += censored
    at_risk = np.cumsum(total[::-1])[::-1][:n]
    if events.size < n:
        events = np.concatenate((events, np.zeros(n - events.size)))
    return events[:n] / np.maximum(at_risk, 1.0)  # at_risk is a count: 0 only where there is no event either


class GridCurve:
    """Kaplan-Meier survival S[k] = P(A > k*dt) on the grid from histograms of completed and censored durations.

    ``late_events`` / ``late_censored`` / ``splice_at`` (optional): beyond grid point ``splice_at`` the hazard comes
    from these histograms instead (stores.py splices a start-time cohort, valid up to its age, with the complete
    sample of recent completions beyond it)."""

    def __init__(self, events: np.ndarray, censored: np.ndarray, dt: float, tail_mean_s: float, *,
                 late_events: np.ndarray | None = None, late_censored: np.ndarray | None = None,
                 splice_at: int | None = None) -> None:
        self.dt = float(dt)
        self.tail_mean_s = max(float(tail_mean_s), 1e-9)
        events = np.asarray(events, np.float64)
        censored = np.asarray(censored, np.float64)
        if late_events is not None and splice_at is not None:
            late_events = np.asarray(late_events, np.float64)
            early = np.zeros(min(splice_at + 1, events.size))
            early[:] = events[: early.size]
            late = np.zeros(late_events.size)
            late[splice_at + 1:] = late_events[splice_at + 1:]
            nz_e, nz_l = np.flatnonzero(early), np.flatnonzero(late)
            self.last = max(int(nz_e[-1]) if nz_e.size else -1, int(nz_l[-1]) if nz_l.size else -1)
        elif events.size and events[-1]:  # a histogram from bincount: its last point holds a completion
            self.last = events.size - 1
        else:
            nz = np.flatnonzero(events)
            self.last = int(nz[-1]) if nz.size else -1  # last grid point with a completion (-1: none: all tail)
        n = self.last + 1
        if n == 0:
            self.surv: np.ndarray = np.empty(0)
            return
        hazard = product_limit_hazard(events, censored, n)
        if late_events is not None and splice_at is not None and splice_at + 1 < n:
            late_c = np.asarray(late_censored if late_censored is not None else [], np.float64)
            late_h = product_limit_hazard(late_events, late_c, n)
            hazard[splice_at + 1:] = late_h[splice_at + 1:]
        self.surv = np.cumprod(1.0 - hazard)

    @classmethod
    def from_durations(cls, completed, censored, dt: float, tail_mean_s: float | None = None) -> "GridCurve":
        completed = np.asarray(completed, np.float64)
        ev = np.bincount(event_bins(completed, dt), minlength=1) if completed.size else np.zeros(1)
        ce = np.bincount(censor_bins(censored, dt), minlength=1) if np.size(censored) else np.zeros(1)
        mean = float(completed.mean()) if completed.size else (tail_mean_s or 1.0)
        return cls(ev, ce, dt, mean if tail_mean_s is None else tail_mean_s)

    @classmethod
    def from_survival(cls, surv: np.ndarray, last: int, dt: float, tail_mean_s: float) -> "GridCurve":
        """A curve whose survival S[0..last] is already computed (``CurveHistory.curve``)."""
        curve = cls.__new__(cls)
        curve.dt, curve.tail_mean_s, curve.last, curve.surv = float(dt), max(float(tail_mean_s), 1e-9), last, surv
        return curve

    def extended(self, length: int) -> np.ndarray:
        """S[0:length], continued past the last completion by the exponential tail (read it, don't write it).

        A refresh extends one curve several times (its chain tables, the CDF of a following phase); the longest
        extension is kept and shorter ones are views of it: each entry is computed on its own, so a prefix of a
        longer extension holds the same numbers."""
        ext = self.__dict__.get("_ext")
        if ext is not None and ext.size >= length:
            return ext[:length]
        out = self._extend(length)
        self._ext = out
        return out

    def _extend(self, length: int) -> np.ndarray:
        out = np.empty(length)
        n = min(length, self.surv.size)
        out[:n] = self.surv[:n]
        if length > n:
            base = self.surv[-1] if self.surv.size else 1.0
            k = np.arange(n, length) - (self.surv.size - 1)
            out[n:] = base * np.exp(-k * self.dt / self.tail_mean_s)
        return out

    def cdf_from_start(self, bins: int) -> np.ndarray:
        """F[m] = P(A at or before grid point m), m = 0..bins-1 (the unconditional CDF, for a following phase)."""
        return 1.0 - self.extended(bins)


class ChainTable:
    """q(e) = P(A - e + B < h | A > e) per elapsed grid point; the last entry is the tail (e beyond the data)."""

    def __init__(self, q_short: np.ndarray, q_long: np.ndarray, dt: float) -> None:
        self.q_short, self.q_long, self.dt = q_short, q_long, dt
        self.last = q_short.size - 1

    def lookup(self, elapsed: np.ndarray) -> np.ndarray:
        x = np.maximum(np.asarray(elapsed, np.float64), 0.0) / self.dt
        b = np.floor(x + 1e-9)
        frac = x - b
        # Completed durations sit at the nearest grid point, so grid point b + H stands for (b + H -/+ 0.5) * dt: a
        # window ending at e + h = (b + frac + H) * dt covers (frac + 0.5) of it. Exactly on a grid point (frac = 0)
        # the strict product-limit value is kept.
        w = np.where(frac > 1e-9, np.minimum(frac + 0.5, 1.0), 0.0)
        k = np.minimum(b, self.last).astype(np.int64)
        lo = self.q_short[k]
        return lo + w * (self.q_long[k] - lo)  # the tail entry holds one value in both arrays


def chain_table(curve: GridCurve, horizon_s: float, then_cdf: np.ndarray | None = None) -> ChainTable:
    """The table of q over ``horizon_s`` for phase ``curve`` followed by a phase with CDF ``then_cdf`` on the grid
    (None: nothing follows). Exact product-limit values at grid points (see the module docstring)."""
    return chain_tables(curve, (horizon_s,), then_cdf)[0]


def chain_tables(curve: GridCurve, horizons, then_cdf: np.ndarray | None = None) -> list[ChainTable]:
    """``chain_table`` for several horizons, sharing the survival curve's extension."""
    size = max(curve.last, 0) + 1  # one entry per grid point up to the tail entry
    return [ChainTable(q_short, q_long, curve.dt) for q_short, q_long in chain_windows(curve, horizons, then_cdf, size)]


def chain_windows(curve: GridCurve, horizons, then_cdf: np.ndarray | None, size: int,
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per horizon, the (q_short, q_long) of ``chain_tables`` at the elapsed grid points 0..size-1: point b holds the
    table's entry min(b, last), so the tail entry repeats beyond the data and a table is computed only as far as the
    items that read it reach (stores.py looks items up by grid point).

    All horizons in one (horizon, short / long, point) array: the division and the clip are one pass each."""
    dt, last = curve.dt, curve.last
    bins = [window_points(h, dt) for h in horizons]
    points = min(size, last) if last > 0 else 0  # grid points before the tail entry
    q = np.empty((len(bins), 2, size))
    tails = _tails(curve, horizons, bins, then_cdf)
    for t, tail in enumerate(tails):
        # nothing arrives within an empty window; the tail entry is memoryless: one value for any position
        q[t, :, points:] = 0.0 if tail is None else 0.5 * (tail[0] + tail[1])
    if not points:  # no completion beyond grid point 0: everything is tail
        return [(q[t, 0], q[t, 1]) for t in range(len(bins))]
    surv = curve.extended(points + max(bins) + 2)
    denom = surv[:points]
    mass = surv[:points + max(bins) - 1] - surv[1:points + max(bins)] if then_cdf is not None else None
    for t, (h, tail) in enumerate(zip(bins, tails)):
        if tail is None:
            q[t, :, :points] = 0.0
        elif mass is None:  # sum of the masses at points b+1..b+H-1 (b+H): a difference of survivals
            np.subtract(denom, surv[h - 1:points + h - 1], out=q[t, 0, :points])
            np.subtract(denom, surv[h:points + h], out=q[t, 1, :points])
        else:  # mass[j] = P(A at grid point j+1), weighted by the following phase's CDF
            w_short, w_long = tail[2]
            q[t, 0, :points] = np.correlate(mass[:points + h - 2], w_short, "valid") if h >= 2 else 0.0
            q[t, 1, :points] = np.correlate(mass[:points + h - 1], w_long, "valid")
    if denom[-1] > 0:  # a survival curve never increases: positive everywhere before its last positive point
        q[:, :, :points] /= denom
    else:
        alive = denom > 0
        safe = np.where(alive, denom, 1.0)
        for t, tail in enumerate(tails):
            for row in (0, 1):
                value = 0.0 if tail is None else tail[row]
                q[t, row, :points] = np.where(alive, q[t, row, :points] / safe, value)
    np.maximum(q, 0.0, out=q)
    np.minimum(q, 1.0, out=q)
    return [(q[t, 0], q[t, 1]) for t in range(len(bins))]


def _tails(curve: GridCurve, horizons, bins: list[int], then_cdf) -> list[tuple | None]:
    """Per horizon, (q_short, q_long, window weights of ``then_cdf``) beyond the data, where the phase is
    memoryless; None for an empty window."""
    out: list[tuple | None] = []
    if then_cdf is None:  # a single memoryless phase: the closed form (continuous time, as B.2/B.3's exponential prior)
        for h_s, h in zip(horizons, bins):
            t = 1.0 - math.exp(-h_s / curve.tail_mean_s)
            out.append((t, t, None) if h > 0 else None)
        return out
    tail_p = _tail_mass(curve.dt, curve.tail_mean_s, max(bins))
    for h in bins:
        if h <= 0:
            out.append(None)
            continue
        w_short, w_long = _window_weights(then_cdf, h)
        t_short = float(_sum(tail_p[: h - 1] * w_short)) if h >= 2 else 0.0
        t_long = float(_sum(tail_p[:h] * w_long))
        out.append((t_short, t_long, (w_short, w_long)))
    return out


_TAIL_MASS: dict[tuple[float, float, int], np.ndarray] = {}  # a few entries per class mean (bounded below)


def _tail_mass(dt: float, tail_mean_s: float, top: int) -> np.ndarray:
    """Mass at grid points 1..top of an exponential tail from the current point. It depends only on the class's mean
    (which changes only when the class records), so it is kept between refreshes (read it, don't write it)."""
    key = (dt, tail_mean_s, top)
    tail_p = _TAIL_MASS.get(key)
    if tail_p is None:
        if len(_TAIL_MASS) >= 1024:
            _TAIL_MASS.clear()
        tail_s = np.exp(-(dt / tail_mean_s) * np.arange(top + 1))
        tail_p = _TAIL_MASS[key] = tail_s[:-1] - tail_s[1:]
    return tail_p


def _window_weights(then_cdf: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    """w[d-1] = P(B at or before grid point H-1-d) (short window) / H-d (long window), d = 1..H."""
    if then_cdf.size > h:  # long enough: views, no copy
        f = then_cdf[: h + 1]
    else:  # held at its last value beyond its end
        f = np.concatenate((then_cdf, np.full(h + 1 - then_cdf.size, then_cdf[-1] if then_cdf.size else 1.0)))
    short = f[h - 2::-1] if h >= 2 else np.empty(0)  # F[H-2], F[H-3], ..., F[0]
    long = f[h - 1::-1] if h >= 1 else np.empty(0)  # F[H-1], ..., F[0]
    return short, long


def sum_cdf(curves: list[GridCurve], bins: int) -> np.ndarray:
    """CDF on the grid (points 0..bins-1) of the sum of independent phases, each taken from its start."""
    pmf: np.ndarray = np.zeros(bins)
    pmf[0] = 1.0
    for curve in curves:
        f = curve.cdf_from_start(bins)
        p = np.diff(np.concatenate(([0.0], f)))
        pmf = np.convolve(pmf, p)[:bins]
    return np.cumsum(pmf)
