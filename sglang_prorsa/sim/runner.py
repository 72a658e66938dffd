"""One simulation run: wire trainer, cluster and (adaptive) control plane on one event queue, run, report.

``simulate`` is deterministic: the same configs (seed included) give the same ``SimResult`` apart from ``wall_s``.
``best_static`` simulates every static PD ratio of a cell and keeps the fastest (the baseline of the paper's Figure 7,
chosen per cell here); ``seeds`` repeats a configuration over seeds.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Callable

from sglang_prorsa.policy.role_switch.capacity import Role
from sglang_prorsa.sim.adaptive import ControlPlaneDriver
from sglang_prorsa.sim.cluster import Cluster
from sglang_prorsa.sim.config import ClusterConfig, ModelConfig, RolloutConfig
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.sim.lifecycle_sink import NullLifecycle
from sglang_prorsa.sim.metrics import (
    SimResult,
    TimelinePoint,
    completion_stats,
    idle_ratios,
    realised_gains,
    switches_per_step,
    window_dicts,
)
from sglang_prorsa.sim.stage_clock import StageClock
from sglang_prorsa.sim.trainer import Trainer
from sglang_prorsa.sim.workloads import workload_tasks


def simulate(model: ModelConfig, cluster_cfg: ClusterConfig, rollout: RolloutConfig,
             on_step: Callable[[int], None] | None = None, stage_clock: StageClock | None = None) -> SimResult:
    """One simulation. ``stage_clock``: records each turn's stage times into it (stage_clock.py)."""
    started = time.perf_counter()
    tasks = workload_tasks(rollout.preset)
    events = EventQueue()
    driver = ControlPlaneDriver(cluster_cfg, model, rollout, tasks) if cluster_cfg.mode == "adaptive" else None
    lifecycle = driver or NullLifecycle()
    trainer = Trainer(rollout, tasks, events, lifecycle.hint)
    cluster = Cluster(cluster_cfg, model, rollout, events, trainer, lifecycle)
    cluster.stage_clock = stage_clock
    timeline: list[TimelinePoint] = []
    steps_seen = [0]

    def every_horizon(t: float) -> None:
        if driver is not None:
            driver.tick(t, cluster)
        timeline.append(_snapshot(t, cluster, len(trainer.live)))
        if on_step is not None and len(trainer.step_times) > steps_seen[0]:
            on_step(len(trainer.step_times) - steps_seen[0])
            steps_seen[0] = len(trainer.step_times)
        if not trainer.finished:
            events.at(t + cluster_cfg.horizon_s, every_horizon)

    trainer.start(0.0)
    events.at(0.0, every_horizon)
    events.run(until=cluster_cfg.max_sim_s)
    if on_step is not None and len(trainer.step_times) > steps_seen[0]:
        on_step(len(trainer.step_times) - steps_seen[0])
    makespan = trainer.step_times[-1][1] if trainer.finished else events.now
    instances = cluster.all_instances()
    for inst in instances:
        inst.advance(makespan)
    idle = idle_ratios(instances, cluster_cfg.gpus, makespan)
    finished = [r for r in trainer.runs if r.finished_at is not None]
    durations = [r.finished_at - r.launched_at for r in finished]
    mean, p50, p90 = completion_stats(durations)
    wape = driver.cp.predictor.accuracy.summary() if driver else None
    windows = window_dicts(driver.windows) if driver else []
    switch_log = []
    if driver is not None:
        planner = driver.controller.config.planner
        gpus = {"prefill": cluster.perf[Role.PREFILL].gpus, "decode": cluster.perf[Role.DECODE].gpus}
        switch_log = realised_gains(driver.executed, driver.decisions, windows, cluster_cfg.horizon_s,
                                    planner.lookahead_horizons, gpus, planner.short_margin)
    p, d = cluster_cfg.split(model)
    return SimResult(
        model=model.name, preset=rollout.preset, staleness=rollout.staleness, mode=cluster_cfg.mode,
        gpus=cluster_cfg.gpus, instances=p + d, prefill_instances=p, seed=rollout.seed,
        steps_done=len(trainer.step_times), step_times_s=[end - start for start, end in trainer.step_times],
        makespan_s=makespan, trajectories_finished=len(durations), trajectories_dropped=trainer.dropped,
        completion_mean_s=mean, completion_p50_s=p50, completion_p90_s=p90,
        sync_idle_ratio=idle["sync"], gpu_idle_ratio=idle["gpu"], switches=len(cluster.switches),
        wape_prefill=wape.prefill if wape else None, wape_decode=wape.decode if wape else None,
        wall_s=time.perf_counter() - started, events=events.processed, timeline=timeline, windows=windows,
        interference_idle_ratio=idle["interference"], imbalance_idle_ratio=idle["imbalance"],
        groups_per_step=rollout.groups_per_step, decode_instances=d, decode_shape=cluster_cfg.decode_shape,
        routing=cluster_cfg.routing,
        prefix_hit_ratio=cluster.cached_tokens / cluster.prefill_tokens if cluster.prefill_tokens else 0.0,
        retractions=sum(i.retractions for i in instances),
        switches_per_step=switches_per_step([s[0] for s in cluster.switches], trainer.step_times),
        switch_log=switch_log, switches_paid=sum(s["paid"] for s in switch_log),
        theta_samples=driver.theta.samples if driver else 0,
        batch=rollout.batch, finish_times=sorted(r.finished_at for r in finished),
        hold_reasons=dict(Counter(str(d["hold"]) for d in driver.decisions)) if driver else {},
        completion_environment_mean_s=statistics.fmean(r.environment_s for r in finished) if finished else None,
    )


def _snapshot(t: float, cluster: Cluster, live: int) -> TimelinePoint:
    roles = [inst.role for inst in cluster.instances]
    return TimelinePoint(
        t=t, n_prefill=roles.count(Role.PREFILL), n_decode=roles.count(Role.DECODE),
        prefill_backlog_tokens=sum(i.prefill_load() for i in cluster.instances),
        decode_kv_tokens=sum(i.kv_used() for i in cluster.instances if i.role is not Role.PREFILL),
        live_trajectories=live)


def static_ratios(model: ModelConfig, cluster_cfg: ClusterConfig) -> list[int]:
    """Every prefill-instance count a static PD split can have (at least one decode instance left)."""
    prefill, decode = cluster_cfg.shapes(model)
    return [p for p in range(1, cluster_cfg.gpus // prefill.gpus_per_instance)
            if cluster_cfg.gpus - p * prefill.gpus_per_instance >= decode.gpus_per_instance]


def best_static(model: ModelConfig, cluster_cfg: ClusterConfig, rollout: RolloutConfig,
                ratios: list[int] | None = None, on_run: Callable[[SimResult], None] | None = None
                ) -> tuple[SimResult, list[SimResult]]:
    """The static PD split with the shortest mean step time, and every split tried."""
    runs = []
    for p in ratios or static_ratios(model, cluster_cfg):
        result = simulate(model, dataclasses.replace(cluster_cfg, mode="static", prefill_instances=p), rollout)
        runs.append(result)
        if on_run is not None:
            on_run(result)
    return min(runs, key=lambda r: (r.steps_done < rollout.steps, r.mean_step_s)), runs
