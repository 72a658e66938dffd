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
Building a table costs O(L * H) for a curve of L grid points; looking up n trajectories is an O(n) gather. With
durations and elapsed times on the grid (integer seconds, h = 10 s) the values equal the exact product-limit ones.
"""

from __future__ import annotations

import math

import numpy as np

MAX_GRID_POINTS = 1 << 14  # durations beyond 16384 * dt (~34 min at S = 10 s) are treated as that long


def grid_step(horizon_s: float) -> float:
    """The grid step for horizon S: the power of two seconds at or below S / 64 (S = 10 s -> 0.125 s)."""
    return 2.0 ** max(-10, min(4, math.floor(math.log2(horizon_s / 64.0))))


def event_bins(durations: np.ndarray, dt: float) -> np.ndarray:
    return np.minimum(np.floor(np.asarray(durations, np.float64) / dt + 0.5), MAX_GRID_POINTS - 1).astype(np.int64)


def censor_bins(durations: np.ndarray, dt: float) -> np.ndarray:
    return np.minimum(np.floor(np.asarray(durations, np.float64) / dt + 1e-9), MAX_GRID_POINTS - 1).astype(np.int64)


def _hazard(events: np.ndarray, censored: np.ndarray, n: int) -> np.ndarray:
    """Product-limit hazard d_k / n_k at grid points 0..n-1 (censored beyond n-1: at risk everywhere up to it)."""
    ev = np.zeros(n)
    m = min(n, events.size)
    ev[:m] = events[:m]
    cens = np.zeros(n)
    m = min(n, censored.size)
    cens[:m] = censored[:m]
    cens[n - 1] += censored[n:].sum() + events[n:].sum()
    at_risk = np.cumsum((ev + cens)[::-1])[::-1]
    return ev / np.maximum(at_risk, 1.0)  # at_risk is a count: 0 only where there is no event either


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
        else:
            nz = np.flatnonzero(events)
            self.last = int(nz[-1]) if nz.size else -1  # last grid point with a completion (-1: none: all tail)
        n = self.last + 1
        if n == 0:
            self.surv = np.empty(0)
            return
        hazard = _hazard(events, censored, n)
        if late_events is not None and splice_at is not None and splice_at + 1 < n:
            late_h = _hazard(late_events, np.asarray(late_censored if late_censored is not None else [], np.float64), n)
            hazard[splice_at + 1:] = late_h[splice_at + 1:]
        self.surv = np.cumprod(1.0 - hazard)

    @classmethod
    def from_durations(cls, completed, censored, dt: float, tail_mean_s: float | None = None) -> "GridCurve":
        completed = np.asarray(completed, np.float64)
        ev = np.bincount(event_bins(completed, dt), minlength=1) if completed.size else np.zeros(1)
        ce = np.bincount(censor_bins(censored, dt), minlength=1) if np.size(censored) else np.zeros(1)
        mean = float(completed.mean()) if completed.size else (tail_mean_s or 1.0)
        return cls(ev, ce, dt, mean if tail_mean_s is None else tail_mean_s)

    def extended(self, length: int) -> np.ndarray:
        """S[0:length], continued past the last completion by the exponential tail."""
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


def _window_weights(then_cdf: np.ndarray | None, h: int) -> tuple[np.ndarray, np.ndarray]:
    """w[d-1] = P(B at or before grid point H-1-d) (short window) / H-d (long window), d = 1..H."""
    if then_cdf is None:
        return np.ones(max(h - 1, 0)), np.ones(h)
    f = np.concatenate((then_cdf[: h + 1], np.full(max(0, h + 1 - then_cdf.size), then_cdf[-1] if then_cdf.size else 1.0)))
    short = f[h - 2::-1] if h >= 2 else np.empty(0)  # F[H-2], F[H-3], ..., F[0]
    long = f[h - 1::-1] if h >= 1 else np.empty(0)  # F[H-1], ..., F[0]
    return short, long


def chain_table(curve: GridCurve, horizon_s: float, then_cdf: np.ndarray | None = None) -> ChainTable:
    """The table of q over ``horizon_s`` for phase ``curve`` followed by a phase with CDF ``then_cdf`` on the grid
    (None: nothing follows). Exact product-limit values at grid points (see the module docstring)."""
    return chain_tables(curve, (horizon_s,), then_cdf)[0]


def chain_tables(curve: GridCurve, horizons, then_cdf: np.ndarray | None = None) -> list[ChainTable]:
    """``chain_table`` for several horizons, sharing the survival curve's extension."""
    dt, last = curve.dt, curve.last
    bins = [int(round(h / dt)) for h in horizons]
    surv = curve.extended(last + max(bins) + 2) if last > 0 else None
    return [_table(curve, surv, h_s, h, then_cdf) for h_s, h in zip(horizons, bins)]


def _table(curve: GridCurve, surv: np.ndarray | None, horizon_s: float, h: int, then_cdf) -> ChainTable:
    dt, last = curve.dt, curve.last
    if h <= 0:  # nothing arrives within an empty window (same table shape as any horizon: one entry per point)
        n = max(last, 0) + 1
        return ChainTable(np.zeros(n), np.zeros(n), dt)
    if then_cdf is None:  # a single memoryless phase: the closed form (continuous time, as B.2/B.3's exponential prior)
        t_short = t_long = 1.0 - math.exp(-horizon_s / curve.tail_mean_s)
    else:
        w_short, w_long = _window_weights(then_cdf, h)
        tail_s = np.exp(-(dt / curve.tail_mean_s) * np.arange(h + 1))  # an exponential from the current point
        tail_p = tail_s[:-1] - tail_s[1:]  # mass at points 1..H
        t_short = float((tail_p[: h - 1] * w_short).sum()) if h >= 2 else 0.0
        t_long = float((tail_p[:h] * w_long).sum())
    if last <= 0:  # no completion beyond grid point 0: everything is tail (memoryless)
        tail = 0.5 * (t_short + t_long)
        return ChainTable(np.array([tail]), np.array([tail]), dt)
    denom = surv[:last]
    if then_cdf is None:  # sum of the masses at points b+1..b+H-1 (b+H): a difference of survivals, no correlation
        short = denom - surv[h - 1:last + h - 1]
        long = denom - surv[h:last + h]
    else:
        mass = surv[:-1] - surv[1:]  # mass[j] = P(A at grid point j+1)
        short = np.correlate(mass[: last + h - 2], w_short, "valid")[:last] if h >= 2 else np.zeros(last)
        long = np.correlate(mass[: last + h - 1], w_long, "valid")[:last]
    alive = denom > 0
    safe = np.where(alive, denom, 1.0)
    # the tail entry (elapsed beyond the data) is memoryless: one value for any position within the step
    tail = 0.5 * (t_short + t_long)
    q_short = np.empty(last + 1)
    q_long = np.empty(last + 1)
    q_short[:last] = np.where(alive, short / safe, t_short)
    q_long[:last] = np.where(alive, long / safe, t_long)
    q_short[last] = q_long[last] = tail
    np.minimum(np.maximum(q_short, 0.0, out=q_short), 1.0, out=q_short)
    np.minimum(np.maximum(q_long, 0.0, out=q_long), 1.0, out=q_long)
    return ChainTable(q_short, q_long, dt)


def sum_cdf(curves: list[GridCurve], bins: int) -> np.ndarray:
    """CDF on the grid (points 0..bins-1) of the sum of independent phases, each taken from its start."""
    pmf = np.zeros(bins)
    pmf[0] = 1.0
    for curve in curves:
        f = curve.cdf_from_start(bins)
        p = np.diff(np.concatenate(([0.0], f)))
        pmf = np.convolve(pmf, p)[:bins]
    return np.cumsum(pmf)
