"""Rollout step boundaries: the synchronous-mode launch model and the marks that gate the bias correction.

Beyond the paper (issue 10 item 3). In synchronous rollout a step launches a batch of samples at once, the engine
drains them, training runs, the weights are updated and the next batch launches. Nothing inside a step predicts that
next launch, so the forecast adds it: when every live trajectory is in reward (or none is left), the next batch of
``N_step`` samples arrives after

    (the step's last reward ends) + G (training gap: last trajectory finished -> first sample of the next step)
                                  + L (launch delay: sample -> first request, the sampler's distribution)

G is learned from the gaps seen so far (a censored duration store, like every phase); once the trainer reports
``weights_updated`` inside the gap, the rest of the gap is the (shorter) update -> launch delay instead.
N_step is the configured ``step_size``, else the number of samples the last step launched.

Boundaries (a step launch after an idle engine, a weight update, a pause) are remembered for the accuracy windows:
a window that contains one does not update the bias correction (one boundary window would otherwise inflate the
factor for many windows after it).
"""

from __future__ import annotations

from collections import deque

from sglang_prorsa.policy.forecast.stores import DurationStore
from sglang_prorsa.policy.lifecycle.events import PauseMode
from sglang_prorsa.policy.lifecycle.states import Trajectory
from sglang_prorsa.policy.lifecycle.tracker import TrackerObserver

BOUNDARIES_KEPT = 256
_IDS: dict[str, int] = {}


class StepModel(TrackerObserver):
    def __init__(self, train_gap_prior_s: float, relaunch_prior_s: float = 1.0, history: int = 256) -> None:
        self.gap = DurationStore("train_gap", [()], train_gap_prior_s, history=history, min_samples=1)
        self.relaunch = DurationStore("relaunch", [()], relaunch_prior_s, history=history, min_samples=1)
        self.step_open = False
        self.step_started_at: float | None = None
        self.step_ended_at: float | None = None
        self.weights_updated_at: float | None = None
        self.launched_this_step = 0
        self.last_step_size = 0
        self.steps = 0
        self.boundaries: deque[float] = deque(maxlen=BOUNDARIES_KEPT)
        self.active = True  # steps are tracked under the sync policy only (the predictor sets this)

    # ----- tracker callbacks -----
    def on_created(self, traj: Trajectory, ts: float) -> None:
        if not self.active:
            return
        if not self.step_open:
            self.step_open, self.step_started_at, self.launched_this_step = True, ts, 0
            if self.step_ended_at is not None:
                self.gap.record(_IDS, ts - self.step_ended_at, end=ts)
                if self.weights_updated_at is not None and self.weights_updated_at >= self.step_ended_at:
                    self.relaunch.record(_IDS, ts - self.weights_updated_at, end=ts)
            self.boundaries.append(ts)
        self.launched_this_step += 1

    def on_finished(self, traj: Trajectory, ts: float, live_after: int) -> None:
        if live_after == 0 and self.step_open and self.active:
            self.step_open, self.step_ended_at = False, ts
            self.last_step_size = self.launched_this_step
            self.steps += 1

    def on_weights_updated(self, ts: float, version: str | None) -> None:
        self.weights_updated_at = ts
        self.boundaries.append(ts)

    def on_paused(self, ts: float, mode: PauseMode) -> None:
        self.boundaries.append(ts)

    def on_continued(self, ts: float, paused_s: float) -> None:
        self.boundaries.append(ts)

    # ----- queries -----
    def step_size(self, configured: int) -> int:
        """N_step: configured, else the last completed step's launches, else the current step's so far."""
        return configured or self.last_step_size or self.launched_this_step

    def gap_phase(self, now: float) -> tuple[DurationStore, float] | None:
        """While no step runs: the store the rest of the gap follows and the time already spent in it."""
        if self.step_open or self.step_ended_at is None:
            return None
        if self.weights_updated_at is not None and self.weights_updated_at >= self.step_ended_at:
            return self.relaunch, max(0.0, now - self.weights_updated_at)
        return self.gap, max(0.0, now - self.step_ended_at)

    def boundary_in(self, start: float, end: float) -> bool:
        return any(start < t <= end for t in self.boundaries)
