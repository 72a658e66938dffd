"""The history's part of a duration class's survival curves, kept between refreshes (issue 10, refresh speed).

A class's curve at refresh (stores.py, ``DurationStore.curve``) is the product limit over its recorded durations and
the live items still running in it (censored at their elapsed times), spliced beyond the cohort's age with the
complete sample's hazard (grid.py, ``GridCurve``). Everything but the live items changes only when the class records
a duration, so that part is computed once per history: a refresh adds the live items' at-risk counts and takes the
product. The numbers are those of ``GridCurve`` built from the summed histograms (tests/unit/policy/forecast/
test_refresh_helpers.py checks them bit for bit).

The tail (beyond the last completion L, where the product limit carries no information) is an exponential whose mean
is the class's completed mean lengthened by the time the live and censored items have spent past L (``tail_mean``):
the posterior mean of an exponential's 1 / rate with one pseudo-completion at the completed mean, given that much
time at risk and no completion. Beyond the paper, which uses exponential priors only before any completion: with
the completed mean alone, a trajectory that will never come back -- its episode ended and the trainer sends no
reward hint -- kept a constant chance of returning in every window, and thousands of them made the lifecycle
forecast 100x the realised arrivals. A class whose items rarely outlive L keeps about its completed mean.

    tail_mean = mean + dt * sum_{k > L} (k - L) * (censored_k + live_k)
"""

from __future__ import annotations

import bisect

import numpy as np

from sglang_prorsa.policy.forecast.grid import GridCurve, product_limit_hazard


class CurveHistory:
    """What a class's curves (stores.py: the cohort spliced with the complete sample) take from its history, computed
    once per history (kept until the class records again) instead of once per refresh: the cohort's at-risk counts
    (suffix sums of its histograms), the grid points with a cohort completion, and the complete sample's hazard.

    ``curve`` adds the live items' at-risk counts and returns the same curve as ``GridCurve(events, censored + live,
    ..., late_events=, late_censored=, splice_at=)``: the histograms hold counts (whole numbers), so at-risk counts
    summed in another order are the same numbers, and the hazard and survival are computed from them as there."""

    def __init__(self, events: np.ndarray, censored: np.ndarray, late_events: np.ndarray,
                 late_censored: np.ndarray) -> None:
        self.events = events
        total = np.zeros(max(events.size, censored.size))
        total[:events.size] = events
        total[:censored.size] += censored
        self.risk = np.cumsum(total[::-1])[::-1]
        self.event_points = np.flatnonzero(events).tolist()
        nz = np.flatnonzero(late_events)
        self.late_last = int(nz[-1]) if nz.size else -1
        self.late_hazard = product_limit_hazard(late_events, late_censored, max(late_events.size, late_censored.size))
        self.censored = late_censored  # every censored duration kept: their time at risk past L lengthens the tail

    def tail_mean(self, live: np.ndarray | None, last: int, dt: float, completed_mean_s: float) -> float:
        """The tail exponential's mean in seconds past grid point ``last`` (module docstring)."""
        exposure = exposure_past(self.censored, last) + (exposure_past(live, last) if live is not None else 0.0)
        return completed_mean_s + dt * exposure

    def curve(self, live: np.ndarray | None, splice_at: int | None, dt: float, completed_mean_s: float) -> GridCurve:
        """The curve with ``live`` (a histogram of the live items' censoring points) censored too; beyond grid point
        ``splice_at`` (None: nowhere) the complete sample's hazard, and no live items. Its tail: ``tail_mean``
        with every live item's time at risk (those beyond the splice included)."""
        points = self.event_points
        if splice_at is None:
            last = points[-1] if points else -1
        elif self.late_last > splice_at:
            last = self.late_last
        else:  # the last cohort completion at or before the splice
            i = bisect.bisect_right(points, splice_at)
            last = points[i - 1] if i else -1
        n = last + 1
        tail_mean_s = self.tail_mean(live, max(last, 0), dt, completed_mean_s)
        if n == 0:
            return GridCurve.from_survival(np.empty(0), -1, dt, tail_mean_s)
        at_risk = np.zeros(n)
        m = min(n, self.risk.size)
        at_risk[:m] = self.risk[:m]
        if live is not None:
            if splice_at is not None:
                live = live[:splice_at + 1]
            if live.size:
                m = min(n, live.size)
                at_risk[:m] += np.cumsum(live[::-1])[::-1][:m]
        events = self.events
        if events.size < n:
            events = np.concatenate((events, np.zeros(n - events.size)))
        hazard = events[:n] / np.maximum(at_risk, 1.0)
        if splice_at is not None and splice_at + 1 < n:
            late = self.late_hazard
            m = max(min(n, late.size), splice_at + 1)
            hazard[splice_at + 1:m] = late[splice_at + 1:m]
            hazard[m:] = 0.0  # beyond the complete sample's histograms: no completion, nobody at risk
        return GridCurve.from_survival(np.cumprod(1.0 - hazard), last, dt, tail_mean_s)


def exposure_past(hist: np.ndarray, point: int) -> float:
    """Grid time at risk past ``point`` of the durations counted in ``hist``: sum_{k > point} (k - point) * hist[k]."""
    if hist.size <= point + 1:
        return 0.0
    past = hist[point + 1:]
    return float(np.dot(past, np.arange(1, past.size + 1, dtype=np.float64)))
