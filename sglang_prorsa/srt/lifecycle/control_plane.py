"""The lifecycle control plane: tracker + predictor behind one lock, driven by an injectable clock.

The HTTP routes, the SGLang server's engine front, the trace replayer and the cluster simulator all talk to this one
object, so they run the same code; only the clock differs (``WallClock`` in servers, ``ManualClock`` elsewhere).

Batches are atomic: ``ingest_payload`` validates every event before applying any, so a bad event rejects the whole
batch (nothing applied); a valid batch is applied under the lock, so no forecast observes half of it. Protocol errors
(invalid transitions, unknown trajectories) are *not* validation errors: they are counted and reported per event.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from sglang_prorsa.srt.forecast.config import PredictorConfig, apply_config_update
from sglang_prorsa.srt.forecast.predictor import Forecast, WorkloadPredictor
from sglang_prorsa.srt.lifecycle.engine_api import EngineLifecycleReporter
from sglang_prorsa.srt.lifecycle.events import MAX_BATCH_EVENTS, LifecycleEvent, parse_payload
from sglang_prorsa.srt.lifecycle.tracker import Outcome, TrajectoryTracker
from sglang_prorsa.srt.utils.clock import Clock, WallClock


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
                 max_batch_events: int = MAX_BATCH_EVENTS) -> None:
        self.clock = clock or WallClock()
        self.max_batch_events = max_batch_events
        self.tracker = TrajectoryTracker()
        self.predictor = WorkloadPredictor(self.tracker, config or PredictorConfig())
        self.engine = EngineLifecycleReporter(self.ingest)  # the engine front's API
        self._lock = threading.Lock()

    @property
    def config(self) -> PredictorConfig:
        return self.predictor.config

    def ingest_payload(self, payload: Any) -> IngestResult:
        """Validate a ``POST /lifecycle`` body (raises ``EventValidationError``), then apply it atomically."""
        return self.ingest(parse_payload(payload, self.max_batch_events))

    def ingest(self, events: Sequence[LifecycleEvent]) -> IngestResult:
        """Apply already-typed events in order; events without ``ts`` are stamped with the clock on receipt."""
        with self._lock:
            now = self.clock.now()
            # Close a due window first, so the events below count in the window they fall in.
            self.predictor.maybe_refresh(now)
            applied = duplicates = 0
            rejections: list[dict[str, Any]] = []
            for index, event in enumerate(events):
                outcome = self.tracker.apply(event.stamped(now))
                if outcome is Outcome.APPLIED:
                    applied += 1
                elif outcome is Outcome.DUPLICATE:
                    duplicates += 1
                else:
                    state = self.tracker.recent_rejections[-1].state
                    rejections.append({"index": index, "trajectory_id": event.trajectory_id,
                                       "event": event.kind.value, "state": state, "reason": outcome.value})
            return IngestResult(len(events), applied, duplicates, len(rejections), rejections[:100])

    def configure(self, payload: Any) -> PredictorConfig:
        """Merge a ``POST /lifecycle/config`` body (raises ``ConfigError``) and apply it."""
        with self._lock:
            config = apply_config_update(self.predictor.config, payload)
            self.predictor.reconfigure(config)
            return config

    def tick(self) -> bool:
        """Refresh the forecast if one horizon has passed since the last refresh (call often; cheap otherwise)."""
        with self._lock:
            return self.predictor.maybe_refresh(self.clock.now())

    def forecast(self, at: float | None = None) -> Forecast:
        """A fresh forecast at ``at`` (default: now) over the current state; due windows are closed first."""
        with self._lock:
            now = self.clock.now()
            self.predictor.maybe_refresh(now)
            return self.predictor.forecast(now if at is None else float(at))

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
                "config": self.predictor.config.to_dict(),
            }


def _rejection(r) -> dict[str, Any]:
    return {"trajectory_id": r.trajectory_id, "event": r.event, "state": r.state, "reason": r.reason}
