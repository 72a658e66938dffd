"""Empirical duration distributions conditioned on elapsed time, with censoring (paper B.2 Eq. 2, B.3 Eq. 6).

The exact (event-time) Kaplan-Meier of the first cut. The predictor now uses the grid version (grid.py, stores.py),
which is O(n) per refresh and equal to this one on grid data; this module stays as the reference it is checked
against.

Both the reward and the sandbox-startup forecasts need ``q = P(T < e + S | T > e)`` for an operation that has been
running for ``e`` seconds. Estimating it from *completed* durations only is biased short: the long operations are
exactly the ones still running, so early in a rollout step the history holds only the fast ones. We therefore use the
Kaplan–Meier product-limit estimator over

* completed durations (events),
* durations of operations that ended without completing (an abort during reward: censored at its end), and
* every operation still running at ``t`` (censored at its elapsed time ``e``), supplied at query time,

which is the standard unbiased estimator of a survival function under right censoring. With event times ``u_k``,
``d_k`` completions at ``u_k`` and ``n_k`` operations at risk (observed duration >= ``u_k``; an operation censored at
exactly ``u_k`` counts as at risk), ``S(x) = prod_{u_k <= x} (1 - d_k / n_k)`` and

    q = 1 - S((e + S)^-) / S(e)          (strict ``T < e + S``: the drop at ``e + S`` itself is excluded)

Beyond the last completed duration the product-limit estimate carries no information, so an operation that has
outlived every completed one (or a class with no completions yet) uses a memoryless exponential tail whose mean is the
class's mean completed duration (or the configured prior): ``q = 1 - exp(-S / mean)``.

Classes fall back from fine to coarse (e.g. (mode, startup load) -> (mode,)): the finest class with at least
``min_samples`` completions is used; live operations are censored observations of every class they belong to.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Hashable, Literal, Mapping, Sequence

import numpy as np

Key = Hashable
Chain = tuple  # class keys of one operation, finest first


class SurvivalCurve:
    """Kaplan–Meier curve of one class; vectorised look-ups of the conditional completion probability."""

    def __init__(self, events: np.ndarray, censored: np.ndarray, tail_mean_s: float) -> None:
        self.tail_mean_s = max(float(tail_mean_s), 1e-9)
        events = np.sort(np.asarray(events, dtype=np.float64))
        censored = np.sort(np.asarray(censored, dtype=np.float64))
        if events.size == 0:
            self._u: np.ndarray = np.empty(0)
            self._surv: np.ndarray = np.empty(0)
            self._moment: np.ndarray = np.empty(0)
            return
        u, d = np.unique(events, return_counts=True)
        at_risk = (events.size - np.searchsorted(events, u, side="left")) + (
            censored.size - np.searchsorted(censored, u, side="left")
        )
        surv = np.cumprod(1.0 - d / at_risk)
        mass = np.concatenate(([1.0], surv[:-1])) - surv  # probability of completing exactly at u_k
        self._u, self._surv, self._moment = u, surv, np.cumsum(mass * u)

    @property
    def last_event(self) -> float:
        return float(self._u[-1]) if self._u.size else -math.inf

    def survival(self, x: np.ndarray) -> np.ndarray:
        """S(x) = P(T > x)."""
        k = np.searchsorted(self._u, x, side="right") - 1
        return np.where(k >= 0, self._surv[np.maximum(k, 0)] if self._u.size else 1.0, 1.0)

    def survival_before(self, x: np.ndarray) -> np.ndarray:
        """S(x^-) = P(T >= x)."""
        k = np.searchsorted(self._u, x, side="left") - 1
        return np.where(k >= 0, self._surv[np.maximum(k, 0)] if self._u.size else 1.0, 1.0)

    def _moment_upto(self, x: np.ndarray, side: Literal["left", "right"]) -> np.ndarray:
        k = np.searchsorted(self._u, x, side=side) - 1
        return np.where(k >= 0, self._moment[np.maximum(k, 0)] if self._u.size else 0.0, 0.0)

    def _in_tail(self, elapsed: np.ndarray) -> np.ndarray:
        return elapsed >= self.last_event

    def prob_within(self, elapsed: np.ndarray, horizon: float) -> np.ndarray:
        """q = P(T < e + S | T > e) per element of ``elapsed`` (Eq. 2 / Eq. 6)."""
        elapsed = np.asarray(elapsed, dtype=np.float64)
        if horizon <= 0:
            return np.zeros_like(elapsed)
        tail_q = 1.0 - math.exp(-horizon / self.tail_mean_s)
        if not self._u.size:
            return np.full_like(elapsed, tail_q)
        s_e = self.survival(elapsed)
        s_end = self.survival_before(elapsed + horizon)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(s_e > 0, 1.0 - s_end / s_e, tail_q)
        return np.clip(np.where(self._in_tail(elapsed), tail_q, q), 0.0, 1.0)

    def mean_residual_within(self, elapsed: np.ndarray, horizon: float) -> np.ndarray:
        """E[T - e | e < T < e + S]: when, inside the horizon, a completion is expected (for B.7's arrival u_j)."""
        elapsed = np.asarray(elapsed, dtype=np.float64)
        if horizon <= 0:
            return np.zeros_like(elapsed)
        lam = 1.0 / self.tail_mean_s
        # mean of an exponential truncated to [0, S)
        z = math.exp(-lam * horizon)
        tail_r = (1.0 / lam - horizon * z / (1.0 - z)) if z < 1.0 else horizon / 2.0
        if not self._u.size:
            return np.full_like(elapsed, tail_r)
        end = elapsed + horizon
        mass = self.survival(elapsed) - self.survival_before(end)
        first = self._moment_upto(end, "left") - self._moment_upto(elapsed, "right")
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(mass > 1e-12, first / mass - elapsed, horizon / 2.0)
        return np.clip(np.where(self._in_tail(elapsed), tail_r, r), 0.0, horizon)


class ConditionalDurations:
    """Bounded duration history per class, with fine-to-coarse fallback and censoring of running operations."""

    def __init__(
        self,
        default_prior_s: float,
        priors: Mapping[Key, float] | None = None,
        min_samples: int = 5,
        history: int = 2048,
    ) -> None:
        self.default_prior_s = float(default_prior_s)
        self.priors = dict(priors or {})
        self.min_samples = int(min_samples)
        self.history = int(history)
        self._events: dict[Key, deque[float]] = {}
        self._censored: dict[Key, deque[float]] = {}
        self._sorted: dict[Key, tuple[np.ndarray, np.ndarray]] = {}  # cache, dropped on every record

    def record(self, chain: Chain, duration: float, completed: bool = True) -> None:
        """One finished operation (O(len(chain))): ``completed=False`` records a censored one (e.g. aborted)."""
        store = self._events if completed else self._censored
        for key in chain:
            store.setdefault(key, deque(maxlen=self.history)).append(max(0.0, float(duration)))
            self._sorted.pop(key, None)

    def completed_count(self, key: Key) -> int:
        return len(self._events.get(key, ()))

    def resolve(self, chain: Chain) -> Key:
        """The finest class of ``chain`` with enough completions; the coarsest one otherwise."""
        for key in chain:
            if len(self._events.get(key, ())) >= self.min_samples:
                return key
        return chain[-1]

    def mean(self, key: Key) -> float:
        events = self._events.get(key)
        if events:
            return sum(events) / len(events)
        return self.priors.get(key, self.default_prior_s)

    def _history(self, key: Key) -> tuple[np.ndarray, np.ndarray]:
        cached = self._sorted.get(key)
        if cached is None:
            cached = (
                np.fromiter(self._events.get(key, ()), dtype=np.float64),
                np.fromiter(self._censored.get(key, ()), dtype=np.float64),
            )
            self._sorted[key] = cached
        return cached

    def snapshot(self, chains: Sequence[Chain], elapsed: Sequence[float]) -> "ConditionalSnapshot":
        """Curves for the running operations ``(chains[i], elapsed[i])``, each censored in all of its classes."""
        by_chain: dict[Chain, list[int]] = {}
        for i, chain in enumerate(chains):
            by_chain.setdefault(chain, []).append(i)
        elapsed_arr = np.asarray(elapsed, dtype=np.float64)
        resolved = {chain: self.resolve(chain) for chain in by_chain}
        curves: dict[Key, SurvivalCurve] = {}
        for key in set(resolved.values()):
            running = [idx for chain, idx in by_chain.items() if key in chain]
            live = elapsed_arr[np.concatenate(running)] if running else np.empty(0)
            events, censored = self._history(key)
            curves[key] = SurvivalCurve(events, np.concatenate((censored, live)), self.mean(key))
        groups = [(curves[resolved[chain]], np.asarray(idx)) for chain, idx in by_chain.items()]
        return ConditionalSnapshot(groups, elapsed_arr)


class ConditionalSnapshot:
    """Per-operation look-ups over one snapshot (one KM build shared by several horizons)."""

    def __init__(self, groups: list[tuple[SurvivalCurve, np.ndarray]], elapsed: np.ndarray) -> None:
        self._groups = groups
        self._elapsed = elapsed

    def prob_within(self, horizon: float) -> np.ndarray:
        out = np.zeros_like(self._elapsed)
        for curve, idx in self._groups:
            out[idx] = curve.prob_within(self._elapsed[idx], horizon)
        return out

    def mean_residual_within(self, horizon: float) -> np.ndarray:
        out = np.zeros_like(self._elapsed)
        for curve, idx in self._groups:
            out[idx] = curve.mean_residual_within(self._elapsed[idx], horizon)
        return out
