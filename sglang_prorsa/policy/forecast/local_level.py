"""The combiner's ``timeseries`` member: a local level Kalman filter of one realised window series.

Beyond the paper (it has no series model). The local level model (random walk plus noise; Durbin and Koopman 2012,
"Time Series Analysis by State Space Methods", 2nd ed., ch. 2):

    y_t = mu_t + eps_t,   eps_t ~ (0, s_eps)        mu_{t+1} = mu_t + eta_t,   eta_t ~ (0, s_eta)

filtered one window at a time (a = the level's estimate, P = its variance):

    P_pred = P + s_eta     F = P_pred + s_eps     K = P_pred / F     a <- a + K (y - a)     P <- (1 - K) P_pred

The forecast of the next window is a. With fixed variances this is exponential smoothing with the optimal gain
(Muth 1960, "Optimal properties of exponentially weighted forecasts", JASA 55); here the variances are estimated
online, without a fitting loop, from the innovations of the random-walk (persistence) forecast, d_t = y_t - y_{t-1}.
Under the model d_t = eta_{t-1} + eps_t - eps_{t-1} (the ARIMA(0,1,1) reduced form), so

    E[d_t^2] = s_eta + 2 s_eps          E[d_t d_{t-1}] = -s_eps

and discounted means of d_t^2 and d_t d_{t-1} (half-life ``noise_half_life_windows``) give both variances:
s_eps = clip(-m1, 0, m0 / 2), s_eta = m0 - 2 s_eps. A series that drifts or jumps makes m1 >= 0, so s_eps -> 0 and
K -> 1 (the filter turns into persistence); a stationary noisy series gives m1 -> -m0 / 2, K -> 0 (a long mean).
Until two increments exist, s_eta = s_eps = m0 / 3 (signal-to-noise ratio 1). The first observation initialises
a = y exactly (the diffuse start: P after it is s_eps, filled in when s_eps is first known); so does an update made
while s_eps is still 0 (K = 1: the level is the observation). The moments are
uncentred on purpose: a trend keeps m1 positive and the gain high, so the level follows the trend.

Why the filter's own innovations are not used (covariance matching, s_eps = mean(v^2) - P_pred, s_eta = K^2 mean(v^2)):
at steady state every (P, s_eps) pair is a fixed point of those equations, so the estimates drift; the increments'
two moments identify the model.

Why not a library: statsmodels' ``UnobservedComponents`` / ``ExponentialSmoothing`` fit by numerical likelihood
optimisation, tens of ms per refresh, while the whole refresh budget is 10 ms at 100k live trajectories; this filter
costs about a microsecond per window. The venv has no state-space library besides (numpy and scipy only). The state
is five scalars, so it is plain Python floats: numpy arrays would cost more than the arithmetic they hold.
"""

from __future__ import annotations

import math


class LocalLevelKalman:
    __slots__ = ("decay", "level", "variance", "last", "last_step", "sq_sum", "sq_weight", "lag_sum", "lag_weight",
                 "gain")

    def __init__(self, noise_half_life_windows: float = 12.0) -> None:
        if not (math.isfinite(noise_half_life_windows) and noise_half_life_windows > 0):
            raise ValueError(f"noise_half_life_windows must be > 0, got {noise_half_life_windows}")
        self.decay = 0.5 ** (1.0 / noise_half_life_windows)
        self.level: float | None = None  # a: the filtered level, the next window's forecast
        self.variance: float | None = None  # P of the filtered level (None: diffuse start, s_eps once known)
        self.last: float | None = None  # y_{t-1}
        self.last_step: float | None = None  # d_{t-1}
        self.sq_sum = self.sq_weight = 0.0  # discounted sum of d^2 and of its weights
        self.lag_sum = self.lag_weight = 0.0  # discounted sum of d_t d_{t-1} and of its weights
        self.gain: float | None = None  # the last K (diagnostics)

    @property
    def forecast(self) -> float | None:
        return self.level

    def noise(self) -> tuple[float, float]:
        """(s_eps, s_eta) from the discounted increment moments (both 0 before any increment)."""
        if self.sq_weight <= 0.0:
            return 0.0, 0.0
        m0 = self.sq_sum / self.sq_weight
        if self.lag_weight <= 0.0:
            return m0 / 3.0, m0 / 3.0
        eps = min(max(-self.lag_sum / self.lag_weight, 0.0), m0 / 2.0)
        return eps, m0 - 2.0 * eps

    def observe(self, y: float) -> bool:
        """One window's realised value; a non-finite value is ignored (False)."""
        if not math.isfinite(y):
            return False
        if self.level is None or self.last is None:
            self.level = self.last = float(y)
            return True
        step = y - self.last
        lam = self.decay
        self.sq_sum = lam * self.sq_sum + step * step
        self.sq_weight = lam * self.sq_weight + 1.0
        if self.last_step is not None:
            self.lag_sum = lam * self.lag_sum + step * self.last_step
            self.lag_weight = lam * self.lag_weight + 1.0
        eps, eta = self.noise()
        predicted = (eps if self.variance is None else self.variance) + eta
        total = predicted + eps
        gain = predicted / total if total > 0.0 else 1.0  # no noise at all: the series is its own forecast
        self.level += gain * (y - self.level)
        # With no observation noise estimated yet (s_eps = 0) the level is set to y itself: as uncertain as one
        # observation, whose noise is not known yet -- diffuse again, not exact (P = 0 would freeze the level at the
        # first spike once the spike's increments make the noise known: K = 0 with s_eta = 0).
        self.variance = None if eps == 0.0 else (1.0 - gain) * predicted
        self.last, self.last_step, self.gain = float(y), step, gain
        return True
