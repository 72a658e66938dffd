"""Online multiplicative bias correction of the forecasts (paper B.8: "forecast residuals update a multiplicative
bias correction").

After each window closes, the raw (uncorrected) forecast F made at the window's start and the realised value R update
exponentially weighted sums, and the correction factor is their ratio:

    F_bar <- (1 - beta) * F_bar + beta * F        R_bar <- (1 - beta) * R_bar + beta * R
    bias   = clip(R_bar / F_bar, lo, hi)          (1 until the first window with F > 0)

A ratio of smoothed sums rather than a smoothed ratio: windows with tiny forecasts would otherwise dominate with huge
per-window ratios. The first update initialises both sums, so one window of data already moves the factor. The clip
keeps one pathological window (a step boundary the predictor cannot see) from flipping the forecast.

``GatedBias`` / ``SourceBiases`` go beyond the paper (issue 10): one correction per forecast source, applied only to
predicted parts, only while it has beaten no correction on the recent windows; the predictor feeds them no window
that contains a step boundary or a pause.
"""

from __future__ import annotations

from collections import deque


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


class GatedBias:
    """One source's correction, applied only while it has lowered that source's recent error (issue 10 item 2).

    For each of the last ``gate_windows`` scored windows we keep the raw forecast F, the factor b the correction
    would have applied at the window's start and the realised value R. The factor is used when
    sum |b*F - R| < (1 - margin) * sum |F - R| over those windows (at least ``min_windows`` of them); otherwise the
    raw forecast stands. So the correction cannot make the recent error worse than no correction at all, and a
    factor that only follows noise (an unbiased forecast) stays off.
    """

    def __init__(self, beta: float = 0.2, lo: float = 0.5, hi: float = 2.0, gate_windows: int = 12,
                 min_windows: int = 4, margin: float = 0.0) -> None:
        self.bias = MultiplicativeBias(beta, lo, hi)
        self.min_windows = min_windows
        self.margin = margin
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=gate_windows)
        self._enabled: bool | None = None  # ``enabled``, kept until the recent windows change (read every refresh)

    @property
    def candidate(self) -> float:
        """The factor the correction would apply now (whether or not the gate lets it)."""
        return self.bias.factor

    @property
    def enabled(self) -> bool:
        if self._enabled is None:
            self._enabled = self._gate_open()
        return self._enabled

    def _gate_open(self) -> bool:
        if len(self._recent) < self.min_windows:
            return False
        corrected = sum(abs(b * f - r) for f, b, r in self._recent)
        raw = sum(abs(f - r) for f, _, r in self._recent)
        return corrected < (1.0 - self.margin) * raw

    @property
    def factor(self) -> float:
        return self.candidate if self.enabled else 1.0

    def observe(self, raw_forecast: float, factor_at_open: float, realised: float) -> None:
        """A scored window closed: ``factor_at_open`` is the candidate factor when its forecast was made."""
        if raw_forecast <= 0.0 and realised <= 0.0:
            return
        self._recent.append((raw_forecast, factor_at_open, realised))
        self._enabled = None
        self.bias.update(raw_forecast, realised)

    def reset(self) -> None:
        self.bias = MultiplicativeBias(self.bias.beta, self.bias.lo, self.bias.hi)
        self._recent.clear()
        self._enabled = None


class SourceBiases:
    """Gated corrections for a set of sources plus a gate on their sum: the combination is used only while the
    corrected total has beaten the raw total over the recent windows (per-source errors can cancel in the total)."""

    def __init__(self, sources: tuple[str, ...], beta: float, lo: float, hi: float, gate_windows: int,
                 min_windows: int, margin: float = 0.0) -> None:
        self.sources = sources
        self.by_source = {s: GatedBias(beta, lo, hi, gate_windows, min_windows, margin) for s in sources}
        self.min_windows = min_windows
        self.margin = margin
        self._totals: deque[tuple[float, float, float]] = deque(maxlen=gate_windows)  # (raw, corrected, realised)

    def candidates(self) -> dict[str, float]:
        """Per-source factors the corrections would apply, before any gate."""
        return {s: b.candidate for s, b in self.by_source.items()}

    def gated(self) -> dict[str, float]:
        """Per-source factors after each source's own gate, before the gate on the total."""
        return {s: b.factor for s, b in self.by_source.items()}

    def factors(self) -> dict[str, float]:
        """Per-source factors to apply now: each source's gated factor, all 1 when the total gate is closed."""
        if not self.total_enabled:
            return {s: 1.0 for s in self.sources}
        return self.gated()

    @property
    def total_enabled(self) -> bool:
        if len(self._totals) < self.min_windows:
            return False
        corrected = sum(abs(c - r) for _, c, r in self._totals)
        return corrected < (1.0 - self.margin) * sum(abs(f - r) for f, _, r in self._totals)

    def observe(self, raw: dict[str, float], realised: dict[str, float], candidates_at_open: dict[str, float],
                gated_at_open: dict[str, float]) -> None:
        """A scored window closed: its raw forecast and realised value per source, and the factors (before any
        gate, and after the per-source gates) that stood when its forecast was made."""
        total_raw = sum(raw.get(s, 0.0) for s in self.sources)
        total_real = sum(realised.get(s, 0.0) for s in self.sources)
        corrected = sum(gated_at_open.get(s, 1.0) * raw.get(s, 0.0) for s in self.sources)
        if total_raw > 0 or total_real > 0:
            self._totals.append((total_raw, corrected, total_real))
        for s, b in self.by_source.items():
            b.observe(raw.get(s, 0.0), candidates_at_open.get(s, 1.0), realised.get(s, 0.0))
