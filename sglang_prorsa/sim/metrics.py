"""What one simulation run reports (§5.2-5.5): rollout time per step, GPU idle ratios, trajectory completion times,
role switches, forecast WAPE, and a coarse timeline for the plots.

GPU idle ratios:
* ``sync_idle_ratio``: GPU time lost inside busy iterations waiting for the slowest attention-DP rank, over GPU time
  of busy iterations. Under colocation this is the prefill-decode interference of Figure 6 (plus cross-rank
  imbalance, which the paper excludes; we cannot separate the two cleanly either).
* ``gpu_idle_ratio``: 1 - GPU time doing work / (G x makespan): everything else too (no work, switches, tails).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TimelinePoint:
    t: float
    n_prefill: int  # instances serving (or switching to) prefill; 0 when colocated
    n_decode: int
    prefill_backlog_tokens: int
    decode_kv_tokens: int
    live_trajectories: int


@dataclass(frozen=True)
class SimResult:
    model: str
    preset: str
    staleness: int
    mode: str
    gpus: int
    instances: int
    prefill_instances: int  # static ratio (initial split for adaptive; 0 colocated)
    seed: int
    steps_done: int
    step_times_s: list[float]
    makespan_s: float
    trajectories_finished: int
    trajectories_dropped: int
    completion_mean_s: float | None
    completion_p50_s: float | None
    completion_p90_s: float | None
    sync_idle_ratio: float
    gpu_idle_ratio: float
    switches: int
    wape_prefill: float | None
    wape_decode: float | None
    wall_s: float
    events: int
    timeline: list[TimelinePoint] = field(default_factory=list)
    windows: list[dict] = field(default_factory=list)  # adaptive: forecast vs realised per horizon window

    @property
    def mean_step_s(self) -> float:
        return statistics.fmean(self.step_times_s) if self.step_times_s else float("nan")

    @property
    def label(self) -> str:
        if self.mode == "static":
            return f"static {self.prefill_instances}:{self.instances - self.prefill_instances}"
        return self.mode

    @property
    def sim_gpu_hours_per_wall_s(self) -> float:
        return self.gpus * self.makespan_s / 3600.0 / max(self.wall_s, 1e-9)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mean_step_s"] = self.mean_step_s
        out["label"] = self.label
        out["sim_gpu_hours_per_wall_s"] = self.sim_gpu_hours_per_wall_s
        return out


def completion_stats(durations: list[float]) -> tuple[float | None, float | None, float | None]:
    """Mean, median and 90th percentile of trajectory completion times (launch -> reward end)."""
    if not durations:
        return None, None, None
    ordered = sorted(durations)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return statistics.fmean(ordered), statistics.median(ordered), p90


def idle_ratios(instances, gpus: int, makespan_s: float) -> tuple[float, float]:
    """(sync_idle_ratio, gpu_idle_ratio) from the instances' accumulated GPU-seconds."""
    idle = sum(i.idle_gpu_s for i in instances)
    work = sum(i.work_gpu_s for i in instances)
    sync_idle = idle / (idle + work) if idle + work > 0 else 0.0
    total = gpus * makespan_s
    return sync_idle, (1.0 - work / total) if total > 0 else 0.0


def window_dicts(windows) -> list[dict]:
    """Accuracy windows of the predictor as plain dicts (Figure 9: predicted vs measured prefill)."""
    return [{"start": w.start, "end": w.end, "forecast_arrivals": w.forecast_arrivals,
             "realised_arrivals": w.realised_arrivals, "backlog": w.backlog,
             "forecast_decode": w.forecast_decode, "realised_decode": w.realised_decode} for w in windows]
