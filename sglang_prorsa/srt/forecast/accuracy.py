"""Forecast accuracy per window: realised vs forecast-at-window-start, WAPE since start and recently (paper §5.5).

    WAPE = sum_windows |forecast - realised| / sum_windows realised

Windows are [t_k, t_k + S) between predictor refreshes. Realised quantities (SPEC.md "Accuracy"):

* prefill: prompt tokens *arriving* (joining the ready queue) in the window, against the forecast's predicted
  arrivals (sampler + sandbox + tool, bias-corrected). The ready-queue and in-flight parts of W_P are backlog already
  observed at t_k, so they are excluded from this, the stricter, measure.
* prefill_demand: the same plus that backlog on both sides (W_P as the allocator sees it), reported for reference.
* decode: prompt tokens admitted to decode (prefill completions) in the window, against A_D.

The control plane closes a due window before applying later events, so every event counts in the window it fell in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sglang_prorsa.srt.lifecycle.states import Trajectory
from sglang_prorsa.srt.lifecycle.tracker import TrackerObserver


@dataclass(frozen=True, slots=True)
class WindowRecord:
    start: float
    end: float
    forecast_arrivals: float  # bias-corrected sampler + sandbox + tool
    raw_arrivals: float
    backlog: float  # ready + in-flight prompt tokens at the window's start
    forecast_decode: float  # bias-corrected A_D
    raw_decode: float
    realised_arrivals: float
    realised_decode: float


@dataclass(frozen=True)
class WapeSummary:
    prefill: float | None
    decode: float | None
    prefill_recent: float | None
    decode_recent: float | None
    prefill_demand: float | None
    windows: int

    def to_dict(self) -> dict:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "prefill_recent": self.prefill_recent,
            "decode_recent": self.decode_recent,
            "prefill_demand": self.prefill_demand,
            "windows": self.windows,
        }


class _ErrorSum:
    __slots__ = ("abs_error", "realised")

    def __init__(self) -> None:
        self.abs_error = 0.0
        self.realised = 0.0

    def add(self, forecast: float, realised: float) -> None:
        self.abs_error += abs(forecast - realised)
        self.realised += realised

    def wape(self) -> float | None:
        return self.abs_error / self.realised if self.realised > 0 else None


def wape_of(pairs) -> float | None:
    total = _ErrorSum()
    for forecast, realised in pairs:
        total.add(forecast, realised)
    return total.wape()


class AccuracyTracker(TrackerObserver):
    def __init__(self, recent_windows: int = 30) -> None:
        self._open: dict | None = None
        self._arrived = 0.0
        self._admitted = 0.0
        self._prefill = _ErrorSum()
        self._decode = _ErrorSum()
        self._demand = _ErrorSum()
        self.recent: deque[WindowRecord] = deque(maxlen=recent_windows)
        self.windows = 0

    # ----- realised side (tracker callbacks) -----
    def on_prefill_arrival(self, traj: Trajectory, ts: float, prompt_tokens: int, previous_tokens: int | None) -> None:
        self._arrived += prompt_tokens

    def on_decode_admission(self, traj: Trajectory, ts: float, prompt_tokens: int) -> None:
        self._admitted += prompt_tokens

    # ----- windows -----
    @property
    def window_open(self) -> bool:
        return self._open is not None

    def open(self, start: float, end: float, *, forecast_arrivals: float, raw_arrivals: float, backlog: float,
             forecast_decode: float, raw_decode: float) -> None:
        self._open = dict(start=start, end=end, forecast_arrivals=forecast_arrivals, raw_arrivals=raw_arrivals,
                          backlog=backlog, forecast_decode=forecast_decode, raw_decode=raw_decode)
        self._arrived = 0.0
        self._admitted = 0.0

    def discard(self) -> None:
        """Drop the open window unscored (its forecast was made under settings that no longer hold)."""
        self._open = None

    def close(self) -> WindowRecord | None:
        if self._open is None:
            return None
        record = WindowRecord(**self._open, realised_arrivals=self._arrived, realised_decode=self._admitted)
        self._open = None
        self._prefill.add(record.forecast_arrivals, record.realised_arrivals)
        self._decode.add(record.forecast_decode, record.realised_decode)
        self._demand.add(record.forecast_arrivals + record.backlog, record.realised_arrivals + record.backlog)
        self.recent.append(record)
        self.windows += 1
        return record

    def summary(self) -> WapeSummary:
        return WapeSummary(
            prefill=self._prefill.wape(),
            decode=self._decode.wape(),
            prefill_recent=wape_of((r.forecast_arrivals, r.realised_arrivals) for r in self.recent),
            decode_recent=wape_of((r.forecast_decode, r.realised_decode) for r in self.recent),
            prefill_demand=self._demand.wape(),
            windows=self.windows,
        )
