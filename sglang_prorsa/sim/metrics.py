"""What one simulation run reports (§5.2-5.5): rollout time per step, GPU idle ratios, trajectory completion times,
role switches and whether they paid, forecast WAPE, and a coarse timeline for the plots.

GPU idle ratios (all over the GPU time of busy iterations, i.e. idle + work inside iterations some rank ran):
* ``interference_idle_ratio``: ranks waiting at the MoE collective for a rank of the *other* stage (a decode step held
  by a prefill chunk): the prefill-decode interference of Figure 6;
* ``imbalance_idle_ratio``: ranks waiting for a rank of the same stage, or with nothing to do while others work
  (cross-DP imbalance, which the paper's Figure 6 excludes);
* ``sync_idle_ratio``: their sum (the earlier single number);
* ``gpu_idle_ratio``: 1 - GPU time doing work / (G x makespan): everything else too (no work, switches, tails).

Switches: ``switches_per_step`` counts them per training step; each executed switch carries the gain the planner
expected and its cost, and ``realised_gain_gpu_s``: the same gain formula (cost.py) evaluated with the *measured*
demand of each following horizon (observed backlog + the arrivals that really came, from the predictor's accuracy
windows; decode KV now + the admissions that really came) over the planner's lookahead, with the planner's own rule
that decode capacity taken to feed a short prefill is no loss, and its rule for a move into decode when both stages
are short (prefill short of its measured demand, decode short of what it held): the gain is the rise of the
bottleneck δ = min(n^P/a, n^D/held) times the cluster's GPU-seconds (planner.py, "Both roles short"). A switch "paid"
when that realised gain exceeded its cost.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import asdict, dataclass, field

from sglang_prorsa.policy.role_switch.cost import bottleneck_delta, served


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
    interference_idle_ratio: float = 0.0
    imbalance_idle_ratio: float = 0.0
    groups_per_step: int = 0
    decode_instances: int = 0  # at t = 0
    decode_shape: str = "same"
    routing: str = "sglang"
    prefix_hit_ratio: float = 0.0  # prompt tokens served from prefix caches / prompt tokens prefilled
    retractions: int = 0
    switches_per_step: list[int] = field(default_factory=list)
    switch_log: list[dict] = field(default_factory=list)  # adaptive: each switch with its expected/realised gain
    switches_paid: int = 0
    theta_samples: int = 0  # adaptive: busy intervals the θ model learned from
    batch: int = 0  # trajectories per training step
    finish_times: list[float] = field(default_factory=list)  # reward end of every finished trajectory, sorted
    hold_reasons: dict[str, int] = field(default_factory=dict)  # adaptive: ticks per planner verdict
    # Of completion_mean_s: the mean time finished trajectories spent outside the engines (tools, sandbox, reward:
    # the workload's inputs, trainer.TrajectoryRun.environment_s); the rest is engine time.
    completion_environment_mean_s: float | None = None

    @property
    def completion_engine_mean_s(self) -> float | None:
        """Mean engine part of a finished trajectory's time: queues, prefill, KV transfer, decode."""
        if self.completion_mean_s is None or self.completion_environment_mean_s is None:
            return None
        return self.completion_mean_s - self.completion_environment_mean_s

    @property
    def mean_step_s(self) -> float:
        return statistics.fmean(self.step_times_s) if self.step_times_s else float("nan")

    def steady_step_s(self, warmup: int) -> float:
        """Steady step time after ``warmup`` steps: the batch over the rate trajectories finished between the end of
        the warm-up and the end of the last step. Uses every completion, not only the step boundaries, so it varies
        less than the mean step time (asynchronous steps end whenever a group completes). Without warm-up: the mean
        step time."""
        if warmup <= 0 or len(self.step_times_s) <= warmup:
            return self.mean_step_s
        ends = [0.0]
        for d in self.step_times_s:
            ends.append(ends[-1] + d)
        start, end = ends[warmup], ends[-1]
        finished = bisect.bisect_right(self.finish_times, end) - bisect.bisect_right(self.finish_times, start)
        return self.batch * (end - start) / finished if finished and end > start else float("nan")

    @property
    def label(self) -> str:
        if self.mode == "static":
            return f"static {self.prefill_instances}:{self.decode_instances}"
        return self.mode

    @property
    def sim_gpu_hours_per_wall_s(self) -> float:
        return self.gpus * self.makespan_s / 3600.0 / max(self.wall_s, 1e-9)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mean_step_s"] = self.mean_step_s
        out["label"] = self.label
        out["sim_gpu_hours_per_wall_s"] = self.sim_gpu_hours_per_wall_s
        out["completion_engine_mean_s"] = self.completion_engine_mean_s
        return out


def completion_stats(durations: list[float]) -> tuple[float | None, float | None, float | None]:
    """Mean, median and 90th percentile of trajectory completion times (launch -> reward end)."""
    if not durations:
        return None, None, None
    ordered = sorted(durations)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return statistics.fmean(ordered), statistics.median(ordered), p90


def idle_ratios(instances, gpus: int, makespan_s: float) -> dict[str, float]:
    """Idle ratios (module docstring) from the instances' accumulated GPU-seconds."""
    interference = sum(i.interference_gpu_s for i in instances)
    imbalance = sum(i.imbalance_gpu_s for i in instances)
    work = sum(i.work_gpu_s for i in instances)
    busy = interference + imbalance + work
    total = gpus * makespan_s
    return {"sync": (interference + imbalance) / busy if busy else 0.0,
            "interference": interference / busy if busy else 0.0,
            "imbalance": imbalance / busy if busy else 0.0,
            "gpu": 1.0 - work / total if total > 0 else 0.0}


def switches_per_step(switch_times: list[float], step_times: list[tuple[float, float]]) -> list[int]:
    """Switches made inside each training step's [start, end)."""
    times = sorted(switch_times)
    return [bisect.bisect_left(times, end) - bisect.bisect_left(times, start) for start, end in step_times]


def realised_gains(executed: list[dict], decisions: list[dict], windows: list[dict], horizon_s: float,
                   lookahead: int, gpus: dict[str, int], margin: float) -> list[dict]:
    """Each executed switch with ``realised_gain_gpu_s`` and ``paid`` (module docstring)."""
    by_start = {w["start"]: w for w in windows}
    measured = []  # (t, n_prefill, n_decode, a_real, b_real, held)
    for d in decisions:
        w = by_start.get(d["t"]) if d["scheduled"] else None
        if w is None:
            continue
        theta = d["theta_P"]
        a = max(0.0, d["W_P"] + d["untracked"] - w["forecast_arrivals"] + w["realised_arrivals"]) / (horizon_s * theta)
        b = max(d["slot_demand"], (d["K_now"] + w["realised_decode"]) / d["C_KV"])
        measured.append((d["t"], d["current"][0], d["current"][1], a, b, d.get("held", 0.0)))
    times = [m[0] for m in measured]
    out = []
    for s in executed:
        start = bisect.bisect_right(times, s["t"])
        end = bisect.bisect_right(times, s["t"] + lookahead * horizon_s)
        gain = 0.0
        for _, n_p, n_d, a, b, held in measured[start:end]:
            n = {"prefill": n_p, "decode": n_d}
            need = {"prefill": a * (1 + margin), "decode": b * (1 + margin)}
            dst, src = s["to"], s["from"]
            if dst == "decode" and n_p + 1 < a * (1 + margin) and n_d - 1 < held * (1 + margin):
                cluster_gpus = n_p * gpus["prefill"] + n_d * gpus["decode"]
                rise = bottleneck_delta(n_p, n_d, a, held) - bottleneck_delta(n_p + 1, n_d - 1, a, held)
                gain += horizon_s * rise * cluster_gpus
                continue  # both short without the switch: the planner's series rule
            gained = (served(n[dst], need[dst]) - served(n[dst] - 1, need[dst])) * gpus[dst]
            lost = (served(n[src] + 1, need[src]) - served(n[src], need[src])) * gpus[src]
            if dst == "prefill" and n[dst] - 1 < need[dst]:
                lost = 0.0  # the planner's rule: a short prefill starves decode anyway (planner.py, prefill_first)
            gain += horizon_s * (gained - lost)
        out.append(s | {"realised_gain_gpu_s": gain, "paid": gain > s["cost_gpu_s"]})
    return out


def window_dicts(windows) -> list[dict]:
    """Accuracy windows of the predictor as plain dicts (Figure 9: predicted vs measured prefill)."""
    return [{"start": w.start, "end": w.end, "forecast_arrivals": w.forecast_arrivals,
             "realised_arrivals": w.realised_arrivals, "backlog": w.backlog,
             "forecast_decode": w.forecast_decode, "realised_decode": w.realised_decode} for w in windows]


# Two-sided 95 % Student t quantiles by degrees of freedom (more than 10: the normal's 1.96 is close enough).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def interval95(values: list[float]) -> list[float] | None:
    """The 95 % t-interval of the mean of paired per-seed ratios (None below two finite values). The seeds draw
    different workloads, and at GPU-bound loads a step waits in queues, so the spread between seeds is the honest
    yardstick for a difference of a few percent."""
    xs = [x for x in values if x == x and abs(x) != float("inf")]
    if len(xs) < 2:
        return None
    half = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / len(xs) ** 0.5
    mean = statistics.fmean(xs)
    return [mean - half, mean + half]
