"""The lifecycle control plane: tracker + predictor behind one lock, driven by an injectable clock.

The HTTP routes, the SGLang server's engine front, the trace replayer and the cluster simulator all talk to this one
object, so they run the same code; only the clock differs (``WallClock`` in servers, ``ManualClock`` elsewhere).

Batches are atomic: ``ingest_payload`` validates every event before applying any, so a bad event rejects the whole
batch (nothing applied); a valid batch is applied under the lock, so no forecast observes half of it. Protocol errors
(invalid transitions, unknown trajectories) are *not* validation errors: they are counted and reported per event.

Servers call ``start()``: a daemon thread then closes due windows and computes the current forecast every
``interval_s``, so ``forecast()`` (no ``at``) returns a fresh precomputed forecast at once and no request ever waits
for a refresh; ingest stays O(events) under a short lock. Simulations and tests with a ``ManualClock`` call
``tick()`` / ``forecast(at)`` synchronously instead. With a ``TraceClock`` (a replayed trace, over HTTP) time is
the trace's: each event moves the clock to its ``ts`` and ``forecast(at)`` to ``at``, closing every window passed on
the way at its scheduled end; ``reset()`` then starts a new replay.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence, overload

from sglang_prorsa.policy.clock import Clock, TraceClock, WallClock
from sglang_prorsa.policy.forecast.config import FixedSettingError, PredictorConfig, apply_config_update
from sglang_prorsa.policy.forecast.predictor import Forecast, WorkloadPredictor
from sglang_prorsa.policy.lifecycle.engine_api import EngineLifecycleReporter
from sglang_prorsa.policy.lifecycle.events import MAX_BATCH_EVENTS, LifecycleEvent, parse_payload
from sglang_prorsa.policy.lifecycle.tracker import Outcome, TrajectoryTracker

# A trace that jumps further than this many windows (an idle hour is 360 at S = 10 s) closes the rest as one.
MAX_WINDOWS_CLOSED_AT_ONCE = 10_000
logger = logging.getLogger(__name__)
_APPLIED, _DUPLICATE = Outcome.APPLIED, Outcome.DUPLICATE  # module constants: enum attribute look-ups are slow
REFRESH_INTERVAL_S = 0.25  # refresh lag bound: windows close within this of their scheduled end


@dataclass(frozen=True)
class IngestResult:
    received: int
    applied: int
    duplicates: int
    rejected: int
    rejections: list[dict[str, Any]] = field(default_factory=list)  # {index, trajectory_id, event, state, reason}

    def to_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "applied": self.applied,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "rejections": self.rejections,
        }


class LifecycleControlPlane:
    def __init__(self, clock: Clock | None = None, config: PredictorConfig | None = None,
                 max_batch_events: int = MAX_BATCH_EVENTS, horizon_fixed_by: str = "") -> None:
        self.clock = clock or WallClock()
        self.max_batch_events = max_batch_events
        # The flag that set S when S has consumers beyond this forecast (a server: the allocation, the control
        # interval, /prorsa/decision and /prorsa/info read it too): ``configure`` then refuses to move it.
        self.horizon_fixed_by = horizon_fixed_by
        self.tracker = TrajectoryTracker()
        self.predictor = WorkloadPredictor(self.tracker, config or PredictorConfig())
        self.engine = EngineLifecycleReporter(self.ingest)  # the engine front's API
        self._lock = threading.Lock()
        self._current: Forecast | None = None  # computed by the refresher
        self._current_at = 0.0  # the clock's time of _current
        # Bumped by every applied event: a cached forecast is served only if no event arrived since it was computed,
        # so a caller reads its own writes (the fresh one is then computed off the event loop by the route).
        self._applied_version = 0
        self._current_version = -1
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._interval_s = REFRESH_INTERVAL_S
        self.refresh_ms = 0.0  # wall time of the last forecast computation (diagnostics)

    @property
    def config(self) -> PredictorConfig:
        return self.predictor.config

    def ingest_payload(self, payload: Any) -> IngestResult:
        """Validate a ``POST /lifecycle`` body (raises ``EventValidationError``), then apply it atomically."""
        return self.ingest(parse_payload(payload, self.max_batch_events))

    @overload
    def ingest(self, events: Sequence[LifecycleEvent], *, wait: Literal[True] = ...) -> IngestResult: ...

    @overload
    def ingest(self, events: Sequence[LifecycleEvent], *, wait: bool) -> IngestResult | None: ...

    def ingest(self, events: Sequence[LifecycleEvent], *, wait: bool = True) -> IngestResult | None:
        """Apply already-typed events in order; events without ``ts`` are stamped with the clock on receipt.

        ``wait=False``: None at once, nothing applied, if the state is busy (the refresher computes a forecast under
        the lock for milliseconds, more on a loaded machine): an event loop that serves requests must not block on
        it, so it hands the batch to a thread instead (``lifecycle_routes``)."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            return self._ingest(events)
        finally:
            self._lock.release()

    def _ingest(self, events: Sequence[LifecycleEvent]) -> IngestResult:
        clock = self.clock
        trace = isinstance(clock, TraceClock)
        if isinstance(clock, TraceClock) and not clock.started:  # a replay starts where its trace does
            first = next((e.ts for e in events if e.ts is not None), None)
            if first is not None:
                clock.advance_to(first)
        now = self.clock.now()
        # Close a due window first, so the events below count in the window they fall in. With the refresher
        # running this is a cheap check (it closes windows on time); without one, this is where they close.
        if self._thread is None:
            self.predictor.maybe_refresh(now)
        applied = duplicates = 0
        rejections: list[dict[str, Any]] = []
        apply = self.tracker.apply
        for index, event in enumerate(events):
            if trace and event.ts is not None:
                now = self._follow_trace(event.ts)
            outcome = apply(event, now)  # events without ts take the clock's time on receipt
            if outcome is _APPLIED:
                applied += 1
            elif outcome is _DUPLICATE:
                duplicates += 1
            elif len(rejections) < 100:
                state = self.tracker.recent_rejections[-1].state
                rejections.append({"index": index, "trajectory_id": event.trajectory_id,
                                   "event": event.kind.value, "state": state, "reason": outcome.value})
        rejected = len(events) - applied - duplicates
        if applied:
            self._applied_version += 1
        return IngestResult(len(events), applied, duplicates, rejected, rejections)

    def configure(self, payload: Any) -> PredictorConfig:
        """Merge a ``POST /lifecycle/config`` body (raises ``ConfigError``) and apply it.

        With ``horizon_fixed_by`` set, a ``horizon_s`` other than the one in force is refused whole (nothing applied)
        with ``FixedSettingError`` (409, naming the field and the flag); the same value is accepted, so a trainer that
        posts back what ``GET /lifecycle/config`` returned still succeeds. Refused rather than passed on because on a
        server S is read by the forecast, Eq. 1 and the planner, the control loop's sleep and what /prorsa/decision and
        /prorsa/info report, on other threads and mid-tick: a live change would have a tick allocate a forecast made
        over one S with another (wrong by S_new/S_old), reset the forecast's residual history, and could not shorten
        a control interval already being slept. A horizon is a deployment choice made once, with the flag."""
        with self._lock:
            config = apply_config_update(self.predictor.config, payload)
            current = self.predictor.config.horizon_s
            if self.horizon_fixed_by and config.horizon_s != current:
                raise FixedSettingError("horizon_s", (
                    f"this server's horizon S is {current:g} s, set by {self.horizon_fixed_by} for the forecast, the "
                    f"allocation and the control interval alike; restart it with {self.horizon_fixed_by} "
                    f"{config.horizon_s:g} to change it"))
            self.predictor.reconfigure(config)
            self._current = None
            return config

    def tick(self) -> bool:
        """Refresh the forecast if one horizon has passed since the last refresh (call often; cheap otherwise)."""
        with self._lock:
            return self.predictor.maybe_refresh(self.clock.now())

    def forecast(self, at: float | None = None) -> Forecast:
        """The forecast now (the refresher's latest when it is fresh), or a fresh one at ``at``; due windows are
        closed first. With ``at`` (or no refresher) this computes: call it off the event loop."""
        if at is None:
            current = self.cached_forecast()
            if current is not None:
                return current
        with self._lock:
            if at is not None and isinstance(self.clock, TraceClock):
                self._follow_trace(float(at))
            now = self.clock.now()
            self.predictor.maybe_refresh(now)
            return self._compute(now if at is None else float(at))

    def _follow_trace(self, t: float) -> float:
        """A trace clock moved to ``t``: every window that ends on the way closes at its end (under the lock)."""
        clock = self.clock
        assert isinstance(clock, TraceClock)
        if t > clock.now() or not clock.started:
            predictor = self.predictor
            closed = 0
            while (clock.started and predictor.next_refresh_at is not None and predictor.next_refresh_at <= t
                   and closed < MAX_WINDOWS_CLOSED_AT_ONCE):
                at = predictor.next_refresh_at
                clock.advance_to(at)
                predictor.refresh(at)
                closed += 1
            clock.advance_to(t)
        return clock.now()

    def reset(self) -> None:
        """A new replay (trace clock only): nothing tracked or learned is kept, the configuration is."""
        if not isinstance(self.clock, TraceClock):
            raise RuntimeError("reset is for trace replay (a control plane on a TraceClock)")
        with self._lock:
            self.clock.reset()
            self.tracker = TrajectoryTracker()
            self.predictor = WorkloadPredictor(self.tracker, self.predictor.config)
            self.engine = EngineLifecycleReporter(self.ingest)
            self._current, self._current_at = None, 0.0
            self._applied_version += 1

    def seconds_to_next_window(self) -> float | None:
        """Clock seconds until the open forecast window closes (None before the first refresh). Cheap, no lock: a
        read of one float the refresher writes."""
        due = self.predictor.next_refresh_at
        return None if due is None else due - self.clock.now()

    def cached_forecast(self) -> Forecast | None:
        """The refresher's latest forecast if it is at most two refresh intervals old and no event was applied since,
        else None (cheap)."""
        current = self._current
        if current is None or self._thread is None or self._current_version != self._applied_version:
            return None
        if self.clock.now() - self._current_at > 2 * self._interval_s + 5 * self.refresh_ms / 1e3:
            return None
        return current

    def _compute(self, at: float) -> Forecast:
        start = time.perf_counter()
        forecast = self.predictor.forecast(at)
        self.refresh_ms = 1e3 * (time.perf_counter() - start)
        return forecast

    # ----- the background refresher -----
    def start(self, interval_s: float = REFRESH_INTERVAL_S) -> None:
        """Close windows and compute the current forecast every ``interval_s`` on a daemon thread (servers)."""
        if self._thread is not None:
            return
        self._interval_s = float(interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="prorsa-forecast", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        thread, stop = self._thread, self._stop
        if thread is None or stop is None:
            return
        stop.set()
        thread.join(timeout_s)
        self._thread = self._stop = None
        self._current = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def refresh_now(self) -> Forecast:
        """One refresher step: close a due window, compute the current forecast and cache it."""
        with self._lock:
            now = self.clock.now()
            self.predictor.maybe_refresh(now)
            forecast = self._compute(now)
            self._current, self._current_at, self._current_version = forecast, now, self._applied_version
            return forecast

    def _run(self, stop: threading.Event) -> None:
        while True:
            try:
                self.refresh_now()
            except Exception:  # noqa: BLE001 - the refresher must outlive one bad refresh; the error is logged
                logger.exception("forecast refresh failed")
            # A large live set makes a refresh slower: never spend more than ~20% of a core on refreshing.
            if stop.wait(max(self._interval_s, 4 * self.refresh_ms / 1e3)):
                return

    def status(self) -> dict[str, Any]:
        with self._lock:
            tr = self.tracker
            return {
                "live_trajectories": tr.live_count,
                "finished_trajectories": tr.finished_total,
                "events": {o.value: n for o, n in tr.counts.items()},
                "rejected_events": tr.rejected_count,
                "recent_rejections": [_rejection(r) for r in tr.recent_rejections],
                "states": tr.state_counts(),
                "paused": tr.paused,
                "weight_version": tr.weight_version,
                "refresher": {"running": self.running, "interval_s": self._interval_s, "last_ms": self.refresh_ms},
                "memory": tr.memory_footprint(),
                "config": self.predictor.config.to_dict(),
            }


def _rejection(r) -> dict[str, Any]:
    return {"trajectory_id": r.trajectory_id, "event": r.event, "state": r.state, "reason": r.reason}
