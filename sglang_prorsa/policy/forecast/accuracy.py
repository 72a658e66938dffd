"""Forecast accuracy per window: realised vs forecast-at-window-start, WAPE since start and recently (paper §5.5),
beside the persistence baseline.

    WAPE = sum_windows |forecast - realised| / sum_windows realised

Windows are [t_k, t_k + S) between predictor refreshes. Realised quantities (SPEC.md "Accuracy"):

* prefill: prompt tokens *arriving* (joining the ready queue) in the window, against the forecast's predicted
  arrivals (all predicted sources, bias-corrected). The ready-queue and in-flight parts of W_P are backlog already
  observed at t_k, so they are excluded from this, the stricter, measure.
* prefill_demand: the same plus that backlog on both sides (W_P as the allocator sees it), reported for reference.
* decode: prompt tokens admitted to decode (prefill completions) in the window, against A_D.

The forecast scored is the served one (combiner.py: the lifecycle forecast, persistence or a series model, or a
blend), so ``wape`` and the baseline ratio describe what the allocation used; the lifecycle-only forecast is scored
beside it (``WapeSummary.lifecycle_*``, ``BaselineSummary.lifecycle_*``).

Persistence (issue 10): the forecast "the next window repeats this one" (the realised values of the previous window);
its WAPE is kept over the windows where it exists, with ours over the same windows beside it, so an operator sees
whether the forecast earns its keep.

Realised arrivals and admissions are also split by source: the state each trajectory was in when the window opened
(a copy of the tracker's state column; a trajectory created during the window counts for the sampler). The
per-source bias correction learns from these splits.

Windows that overlap a pause are not scored (generation was held: low realised demand says nothing about the
forecast); the predictor also keeps them, and windows with a step boundary, out of the bias correction.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from sglang_prorsa.policy.lifecycle.columns import FREE
from sglang_prorsa.policy.lifecycle.states import STATE_CODES, Trajectory, TrajState
from sglang_prorsa.policy.lifecycle.tracker import TrackerObserver

# Predicted-arrival sources, and the state at window start that each trajectory's arrivals are charged to.
ARRIVAL_SOURCES = ("sampler", "sandbox", "tool", "decode_return", "resend")
OBSERVED = "observed"  # decode admissions of requests already queued or in prefill at window start (not predicted)
_SOURCE_OF_STATE = {
    TrajState.SAMPLED: "sandbox", TrajState.SANDBOX_STARTING: "sandbox", TrajState.SANDBOX_READY: "sandbox",
    TrajState.TOOL: "tool", TrajState.TOOL_DONE: "tool", TrajState.READY: "decode_return",
    TrajState.PREFILL: "decode_return", TrajState.DECODE: "decode_return", TrajState.DECODED: "decode_return",
    TrajState.INTERRUPTED: "resend", TrajState.REWARD: "sampler",
}
_PREFILL_LABEL = {STATE_CODES[s]: src for s, src in _SOURCE_OF_STATE.items()}
_DECODE_LABEL = _PREFILL_LABEL | {STATE_CODES[TrajState.READY]: OBSERVED, STATE_CODES[TrajState.PREFILL]: OBSERVED}


@dataclass(frozen=True, slots=True)
class WindowRecord:
    start: float
    end: float
    forecast_arrivals: float  # served predicted arrivals (the combiner's)
    raw_arrivals: float
    backlog: float  # ready + in-flight prompt tokens at the window's start
    forecast_decode: float  # served A_D
    raw_decode: float
    realised_arrivals: float
    realised_decode: float
    persistence_arrivals: float | None = None  # the previous window's realised values (None: no previous window)
    persistence_decode: float | None = None
    lifecycle_arrivals: float | None = None  # the lifecycle forecast (bias-corrected), whatever was served
    lifecycle_decode: float | None = None
    paused: bool = False  # overlapped a pause: not scored
    boundary: bool = False  # contained a step boundary (sync launch, weight update): no bias update
    raw_sources: dict = field(default_factory=dict)  # raw predicted arrivals per source
    realised_sources: dict = field(default_factory=dict)  # realised arrivals per source
    raw_decode_sources: dict = field(default_factory=dict)
    realised_decode_sources: dict = field(default_factory=dict)


@dataclass(frozen=True)
class WapeSummary:
    prefill: float | None
    decode: float | None
    prefill_recent: float | None
    decode_recent: float | None
    prefill_demand: float | None
    windows: int
    excluded_windows: int = 0
    lifecycle_prefill: float | None = None  # the lifecycle-only forecast's WAPE on the same windows
    lifecycle_decode: float | None = None

    def to_dict(self) -> dict:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "prefill_recent": self.prefill_recent,
            "decode_recent": self.decode_recent,
            "prefill_demand": self.prefill_demand,
            "windows": self.windows,
            "excluded_windows": self.excluded_windows,
        }


@dataclass(frozen=True)
class BaselineSummary:
    """Persistence: its forecast for the open window and its WAPE, with ours on the same windows."""

    prefill_arrival_tokens: float | None
    decode_admission_tokens: float | None
    prefill: float | None
    decode: float | None
    prefill_recent: float | None
    decode_recent: float | None
    forecast_prefill: float | None  # our WAPE on the windows persistence was scored on
    forecast_decode: float | None
    windows: int
    lifecycle_prefill: float | None = None  # the lifecycle-only forecast's WAPE on persistence's windows
    lifecycle_decode: float | None = None

    def to_dict(self) -> dict:
        ratio = lambda ours, base: None if ours is None or not base else ours / base  # noqa: E731
        return {
            "method": "persistence",
            "prefill_arrival_tokens": self.prefill_arrival_tokens,
            "decode_admission_tokens": self.decode_admission_tokens,
            "wape": {"prefill": self.prefill, "decode": self.decode, "prefill_recent": self.prefill_recent,
                     "decode_recent": self.decode_recent, "windows": self.windows},
            "forecast_wape": {"prefill": self.forecast_prefill, "decode": self.forecast_decode},
            "ratio": {"prefill": ratio(self.forecast_prefill, self.prefill),
                      "decode": ratio(self.forecast_decode, self.decode)},
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
        self._states: list[int] | None = None  # the tracker's state column at the window's start (read per event)
        self._arrived = 0.0
        self._admitted = 0.0
        self._arrived_by: dict[str, float] = {}
        self._admitted_by: dict[str, float] = {}
        self._paused = False
        self._prefill, self._decode, self._demand = _ErrorSum(), _ErrorSum(), _ErrorSum()
        self._persist_prefill, self._persist_decode = _ErrorSum(), _ErrorSum()
        self._same_prefill, self._same_decode = _ErrorSum(), _ErrorSum()
        self._life_prefill, self._life_decode = _ErrorSum(), _ErrorSum()
        self._same_life_prefill, self._same_life_decode = _ErrorSum(), _ErrorSum()
        self._last: WindowRecord | None = None  # the last closed, scored window: persistence's forecast
        self.recent: deque[WindowRecord] = deque(maxlen=recent_windows)
        self.windows = 0
        self.excluded = 0
        self.persistence_windows = 0

    # ----- realised side (tracker callbacks) -----
    def on_prefill_arrival(self, traj: Trajectory, ts: float, prompt_tokens: int, previous_tokens: int | None) -> None:
        self._arrived += prompt_tokens
        src = self._label(traj, _PREFILL_LABEL)
        self._arrived_by[src] = self._arrived_by.get(src, 0.0) + prompt_tokens

    def on_decode_admission(self, traj: Trajectory, ts: float, prompt_tokens: int) -> None:
        self._admitted += prompt_tokens
        src = self._label(traj, _DECODE_LABEL)
        self._admitted_by[src] = self._admitted_by.get(src, 0.0) + prompt_tokens

    def on_paused(self, ts, mode) -> None:
        self._paused = True

    def _label(self, traj: Trajectory | None, labels: dict[int, str]) -> str:
        if traj is None or self._states is None or self._open is None:
            return "unknown"
        slot = traj.slot
        if slot < 0 or slot >= len(self._states) or traj.created_at > self._open["start"]:
            return "sampler"  # created during the window (a new sample), or a slot reused since the start
        code = self._states[slot]
        return "sampler" if code == FREE else labels.get(code, "unknown")

    # ----- windows -----
    @property
    def window_open(self) -> bool:
        return self._open is not None

    @property
    def open_window(self) -> dict | None:
        return self._open

    def open(self, start: float, end: float, *, forecast_arrivals: float, raw_arrivals: float, backlog: float,
             forecast_decode: float, raw_decode: float, states: np.ndarray | None = None, paused: bool = False,
             raw_sources: dict | None = None, raw_decode_sources: dict | None = None,
             lifecycle_arrivals: float | None = None, lifecycle_decode: float | None = None) -> None:
        """``forecast_*``: the served forecast; ``lifecycle_*``: the lifecycle-only one (default: the same)."""
        self._open = dict(start=start, end=end, forecast_arrivals=forecast_arrivals, raw_arrivals=raw_arrivals,
                          backlog=backlog, forecast_decode=forecast_decode, raw_decode=raw_decode,
                          lifecycle_arrivals=forecast_arrivals if lifecycle_arrivals is None else lifecycle_arrivals,
                          lifecycle_decode=forecast_decode if lifecycle_decode is None else lifecycle_decode,
                          raw_sources=dict(raw_sources or {}), raw_decode_sources=dict(raw_decode_sources or {}))
        self._states = None if states is None else np.asarray(states).tolist()  # a copy: the column moves on
        self._arrived = self._admitted = 0.0
        self._arrived_by, self._admitted_by = {}, {}
        self._paused = paused

    def discard(self) -> None:
        """Drop the open window unscored (its forecast was made under settings that no longer hold)."""
        self._open = None
        self._states = None

    def close(self, *, boundary: bool = False) -> WindowRecord | None:
        if self._open is None:
            return None
        last = self._last
        record = WindowRecord(
            **self._open, realised_arrivals=self._arrived, realised_decode=self._admitted,
            persistence_arrivals=None if last is None else last.realised_arrivals,
            persistence_decode=None if last is None else last.realised_decode,
            paused=self._paused, boundary=boundary or self._paused,
            realised_sources=dict(self._arrived_by), realised_decode_sources=dict(self._admitted_by),
        )
        self._open = None
        self._states = None
        self.recent.append(record)
        if record.paused:
            self.excluded += 1
            self._last = None  # persistence would repeat a held window
            return record
        self._prefill.add(record.forecast_arrivals, record.realised_arrivals)
        self._decode.add(record.forecast_decode, record.realised_decode)
        self._demand.add(record.forecast_arrivals + record.backlog, record.realised_arrivals + record.backlog)
        life_p, life_d = _lifecycle(record)
        self._life_prefill.add(life_p, record.realised_arrivals)
        self._life_decode.add(life_d, record.realised_decode)
        if last is not None:
            self.persistence_windows += 1
            self._persist_prefill.add(last.realised_arrivals, record.realised_arrivals)
            self._persist_decode.add(last.realised_decode, record.realised_decode)
            self._same_prefill.add(record.forecast_arrivals, record.realised_arrivals)
            self._same_decode.add(record.forecast_decode, record.realised_decode)
            self._same_life_prefill.add(life_p, record.realised_arrivals)
            self._same_life_decode.add(life_d, record.realised_decode)
        self._last = record
        self.windows += 1
        return record

    def summary(self) -> WapeSummary:
        scored = [r for r in self.recent if not r.paused]
        return WapeSummary(
            prefill=self._prefill.wape(),
            decode=self._decode.wape(),
            prefill_recent=wape_of((r.forecast_arrivals, r.realised_arrivals) for r in scored),
            decode_recent=wape_of((r.forecast_decode, r.realised_decode) for r in scored),
            prefill_demand=self._demand.wape(),
            windows=self.windows,
            excluded_windows=self.excluded,
            lifecycle_prefill=self._life_prefill.wape(),
            lifecycle_decode=self._life_decode.wape(),
        )

    def baseline(self) -> BaselineSummary:
        scored = [r for r in self.recent if not r.paused and r.persistence_arrivals is not None]
        last = self._last
        return BaselineSummary(
            prefill_arrival_tokens=None if last is None else last.realised_arrivals,
            decode_admission_tokens=None if last is None else last.realised_decode,
            prefill=self._persist_prefill.wape(),
            decode=self._persist_decode.wape(),
            prefill_recent=wape_of((r.persistence_arrivals, r.realised_arrivals) for r in scored),
            decode_recent=wape_of((r.persistence_decode, r.realised_decode) for r in scored),
            forecast_prefill=self._same_prefill.wape(),
            forecast_decode=self._same_decode.wape(),
            windows=self.persistence_windows,
            lifecycle_prefill=self._same_life_prefill.wape(),
            lifecycle_decode=self._same_life_decode.wape(),
        )

    @property
    def persistence(self) -> tuple[float | None, float | None]:
        """Persistence's forecast for the open window: the last closed, scored window's realised (arrivals,
        admissions), None after a pause or before any window."""
        last = self._last
        return (None, None) if last is None else (last.realised_arrivals, last.realised_decode)


def _lifecycle(record: WindowRecord) -> tuple[float, float]:
    arrivals, decode = record.lifecycle_arrivals, record.lifecycle_decode
    return (record.forecast_arrivals if arrivals is None else arrivals,
            record.forecast_decode if decode is None else decode)
