"""A trajectory's time split into the environment's part (the workload's inputs) and the engines' part."""

import pytest

from sglang_prorsa.policy.lifecycle.events import SandboxMode
from sglang_prorsa.sim import cluster as cluster_module
from sglang_prorsa.sim import trainer as trainer_module
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import simulate
from sglang_prorsa.sim.trainer import HINT_DELAY_S, TrajectoryRun
from sglang_prorsa.workload.generator import TrajectoryPlan, TurnPlan


def _plan(turns, sandbox=SandboxMode.PREWARM, reward_s=8.0) -> TrajectoryPlan:
    return TrajectoryPlan(index=0, trajectory_id="t0", group_id="g0", task="general_agent", first_prompt_tokens=100,
                          turns=tuple(turns), sandbox_mode=sandbox, dispatch_s=0.5, startup_s=2.0,
                          first_request_s=0.25, reward_s=reward_s, accepted=True)


def test_environment_time_of_a_plan_by_hand():
    turns = [TurnPlan(50, "bash", 6.0, 10, 0.3), TurnPlan(50, "edit", 2.0, 10, 0.2), TurnPlan(50, None, 0.0, 0, 0.0)]
    run = TrajectoryRun(_plan(turns), version=0, launched_at=0.0)
    # dispatch 0.5 + startup 2 + first request 0.25, two tools (hint delay + tool + overhead), hint delay + reward 8
    assert HINT_DELAY_S == 0.02
    assert run.environment_s == pytest.approx(0.5 + 2.0 + 0.25 + (0.02 + 6.0 + 0.3) + (0.02 + 2.0 + 0.2) + 0.02 + 8.0)


def test_environment_time_without_a_sandbox_counts_dispatch_only():
    run = TrajectoryRun(_plan([TurnPlan(50, None, 0.0, 0, 0.0)], sandbox=None, reward_s=1.0), 0, 0.0)
    assert run.environment_s == pytest.approx(0.5 + 0.02 + 1.0)  # math: no sandbox start, no first-request delay


def test_a_turn_without_a_tool_ends_the_run_whatever_follows():
    turns = [TurnPlan(50, None, 0.0, 0, 0.0), TurnPlan(50, "bash", 100.0, 10, 1.0)]
    assert TrajectoryRun(_plan(turns), 0, 0.0).environment_s == pytest.approx(2.75 + 0.02 + 8.0)


@pytest.mark.parametrize("mode", ["colocated", "static"])
def test_environment_plus_engine_time_is_each_finished_trajectory_time(mode, monkeypatch):
    """Measured on a run: the engine part (completion - environment_s) equals the time each finished trajectory's
    requests spent between joining the engines and their decode finishing, summed over its turns."""
    engine_s: dict[str, float] = {}
    submitted: dict[str, float] = {}
    submit, decoded = cluster_module.Cluster.submit, trainer_module.Trainer.on_decoded

    def on_submit(self, run, t):
        submitted[run.plan.trajectory_id] = t
        submit(self, run, t)

    def on_decoded(self, run, t):
        tid = run.plan.trajectory_id
        engine_s[tid] = engine_s.get(tid, 0.0) + t - submitted[tid]
        decoded(self, run, t)

    monkeypatch.setattr(cluster_module.Cluster, "submit", on_submit)
    monkeypatch.setattr(trainer_module.Trainer, "on_decoded", on_decoded)
    result = simulate(load_model("mimo_v25_pro"),
                      ClusterConfig(gpus=128, mode=mode, prefill_instances=3 if mode == "static" else 0),
                      RolloutConfig(preset="general_agent", staleness=0, group_size=8, groups_per_step=4, steps=1,
                                    seed=1))
    assert result.trajectories_finished == 32
    mean_engine = sum(engine_s.values()) / len(engine_s)
    assert len(engine_s) == 32
    assert result.completion_engine_mean_s == pytest.approx(mean_engine, rel=1e-9)
    assert result.completion_environment_mean_s == pytest.approx(result.completion_mean_s - mean_engine, rel=1e-9)
    assert 0 < result.completion_environment_mean_s < result.completion_mean_s
    assert result.to_dict()["completion_engine_mean_s"] == result.completion_engine_mean_s
