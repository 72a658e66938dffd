"""Replay an event stream into the control plane on a simulated clock and report forecast accuracy (WAPE).

The clock is a ``ManualClock``: before each event the replayer moves it to the event's timestamp, refreshing the
predictor at every horizon boundary it crosses (t = 0, S, 2S, ...), so each window's forecast is made at the window's
start with exactly the information available then, and the window's realised arrivals / admissions are the events
that fall inside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.accuracy import WapeSummary, WindowRecord
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.policy.lifecycle.events import LifecycleEvent
from sglang_prorsa.workload.presets import WorkloadSpec
from sglang_prorsa.workload.simulator import RolloutSimulator


@dataclass(frozen=True)
class ReplayReport:
    name: str
    seed: int
    duration_s: float
    events: int
    rejected_events: int
    wape: WapeSummary
    windows: tuple[WindowRecord, ...]
    wall_s: float
    floor: tuple[tuple[float, float, float], ...] = ()  # (window start, arrivals, admissions) of the oracle, if any

    def line(self) -> str:
        w = self.wape
        pct = lambda v: "n/a" if v is None else f"{100 * v:6.2f}%"  # noqa: E731
        return (f"{self.name:<24} prefill WAPE {pct(w.prefill)}  decode WAPE {pct(w.decode)}  "
                f"windows {w.windows:4d}  events {self.events:7d}  rejected {self.rejected_events}")


def config_for(spec: WorkloadSpec, horizon_s: float = DEFAULT_HORIZON_S) -> PredictorConfig:
    """What a trainer running ``spec`` would post to /lifecycle/config (synchronous steps: the ``sync`` policy)."""
    injection = spec.rollout.injection
    if spec.rollout.mode == "sync":
        injection = InjectionConfig(InjectionPolicy.SYNC)
    return PredictorConfig(
        horizon_s=horizon_s,
        injection=injection,
        default_prompt_tokens=round(spec.task.first_prompt_tokens.median),
        prefill_instances=tuple(str(m) for m in range(spec.engine.prefill_instances)),
        prefill_profile=spec.engine.profile(),
    )


def replay_events(
    events: Iterable[LifecycleEvent], control_plane: LifecycleControlPlane, clock: ManualClock, *, name: str = "replay",
    seed: int = 0, end_s: float | None = None, oracle=None,
) -> ReplayReport:
    """Replay ``events`` (time-ordered) into ``control_plane``; ``oracle`` (optional, e.g. ``FloorOracle``) sees the
    same events and forecasts each window from the same instant."""
    horizon = control_plane.config.horizon_s
    start_wall = time.perf_counter()
    next_tick = clock.now()
    windows: list[WindowRecord] = []
    floor: list[tuple[float, float, float]] = []
    count = 0

    def tick_until(t: float) -> None:
        nonlocal next_tick
        while t >= next_tick:
            clock.set(next_tick)
            if oracle is not None:
                floor.append((next_tick, *oracle.forecast(next_tick)))
            control_plane.tick()
            if control_plane.predictor.accuracy.recent:
                last = control_plane.predictor.accuracy.recent[-1]
                if not windows or windows[-1] is not last:
                    windows.append(last)
            next_tick += horizon

    for event in events:
        tick_until(event.ts)
        clock.set(max(clock.now(), event.ts))
        control_plane.ingest([event])
        if oracle is not None:
            oracle.observe(event)
        count += 1
    if end_s is not None:
        tick_until(end_s)  # close the windows that ended before the end of the run
    return ReplayReport(
        name=name,
        seed=seed,
        duration_s=clock.now(),
        events=count,
        rejected_events=control_plane.tracker.rejected_count,
        wape=control_plane.predictor.accuracy.summary(),
        windows=tuple(windows),
        wall_s=time.perf_counter() - start_wall,
        floor=tuple(floor),
    )


def replay_workload(spec: WorkloadSpec, seed: int = 0, duration_s: float = 1800.0,
                    horizon_s: float = DEFAULT_HORIZON_S) -> ReplayReport:
    """Generate ``spec`` for ``duration_s`` simulated seconds and replay it into a fresh control plane."""
    clock = ManualClock(0.0)
    control_plane = LifecycleControlPlane(clock, config_for(spec, horizon_s))
    simulator = RolloutSimulator(spec, seed, duration_s)
    return replay_events(simulator.events(), control_plane, clock, name=spec.name, seed=seed, end_s=duration_s)
