"""Online multiplicative bias correction of the forecasts (paper B.8: "forecast residuals update a multiplicative
bias correction").

After each window closes, the raw (uncorrected) forecast F made at the window's start and the realised value R update
exponentially weighted sums, and the correction factor is their ratio:

    F_bar <- (1 - beta) * F_bar + beta * F        R_bar <- (1 - beta) * R_bar + beta * R
    bias   = clip(R_bar / F_bar, lo, hi)          (1 until the first window with F > 0)

A ratio of smoothed sums rather than a smoothed ratio: windows with tiny forecasts would otherwise dominate with huge
per-window ratios. The first update initialises both sums, so one window of data already moves the factor. The clip
keeps one pathological window (a step boundary the predictor cannot see) from flipping the forecast.
"""

from __future__ import annotations


class MultiplicativeBias:
    def __init__(self, beta: float = 0.2, lo: float = 0.5, hi: float = 2.0) -> None:
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"beta must be in (0, 1], got {beta}")
        if not 0.0 < lo <= 1.0 <= hi:
            raise ValueError(f"need 0 < lo <= 1 <= hi, got {lo}, {hi}")
        self.beta, self.lo, self.hi = beta, lo, hi
        self._forecast = 0.0
        self._realised = 0.0
        self._initialised = False

    def update(self, raw_forecast: float, realised: float) -> None:
        if raw_forecast <= 0.0 and realised <= 0.0:
            return  # an empty window says nothing about the bias
        if not self._initialised:
            self._forecast, self._realised, self._initialised = raw_forecast, realised, True
            return
        b = self.beta
        self._forecast = (1.0 - b) * self._forecast + b * raw_forecast
        self._realised = (1.0 - b) * self._realised + b * realised

    @property
    def factor(self) -> float:
        if self._forecast <= 0.0:
            return 1.0
        return min(self.hi, max(self.lo, self._realised / self._forecast))

    def apply(self, raw: float) -> float:
        return raw * self.factor
