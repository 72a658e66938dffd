"""Synthetic multi-turn agentic-RL workloads: typed presets, deterministic trajectory plans, a rollout simulator
that turns plans into lifecycle events, and a replayer that scores the predictor on them (WAPE)."""

from sglang_prorsa.workload.generator import TrajectoryPlan, TurnPlan, WorkloadGenerator
from sglang_prorsa.workload.presets import TASKS, EngineModel, RolloutSetting, TaskProfile, WorkloadSpec, preset
from sglang_prorsa.workload.replay import ReplayReport, config_for, replay_events, replay_workload
from sglang_prorsa.workload.simulator import RolloutSimulator

__all__ = [
    "TASKS", "EngineModel", "ReplayReport", "RolloutSetting", "RolloutSimulator", "TaskProfile", "TrajectoryPlan",
    "TurnPlan", "WorkloadGenerator", "WorkloadSpec", "config_for", "preset", "replay_events", "replay_workload",
]
