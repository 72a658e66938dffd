"""The simulator runs bench_rollout.py's workload (RolloutConfig.scale): the same plans, and the step time an
engine with (almost) free compute must give: the slowest trajectory's waits, exactly as planned."""

import dataclasses

import pytest
from unit_support import load_benchmark

from sglang_prorsa.sim.config import ClusterConfig, DecodeParams, PrefillParams, RolloutConfig, load_model
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.sim.runner import simulate
from sglang_prorsa.sim.trainer import HINT_DELAY_S, Trainer
from sglang_prorsa.sim.workloads import workload_tasks


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_rollout")


@pytest.fixture(scope="module")
def args(bench):
    return bench.parse_args(["--steps", "2", "--groups", "2", "--group-size", "3", "--max-turns", "4",
                             "--time-scale", "0.2", "--seed", "5"])


def rollout_of(bench, args) -> RolloutConfig:
    return RolloutConfig(preset=args.preset, staleness=args.staleness, group_size=args.group_size,
                         groups_per_step=args.groups, steps=args.steps, seed=args.seed, scale=bench.plan_scale(args))


def test_sim_trainer_plays_the_benchmarks_episodes(bench, args):
    rollout = rollout_of(bench, args)
    trainer = Trainer(rollout, workload_tasks(args.preset), EventQueue(), None)
    for _ in range(args.steps * args.groups):
        trainer._launch_group(0.0)
    episodes = [ep for step in bench.build_workload(args) for group in step for ep in group]
    assert len(trainer.runs) == len(episodes) == 12
    for run, ep in zip(trainer.runs, episodes):
        plan = run.plan
        assert plan.first_prompt_tokens == len(ep.prompt_ids)
        assert [t.output_tokens for t in plan.turns] == [t.output_tokens for t in ep.turns]
        assert [t.tool_result_tokens for t in plan.turns] == [len(t.tool_ids) for t in ep.turns]
        assert [(t.tool, t.tool_s, t.agent_overhead_s) for t in plan.turns] == \
            [(t.tool, t.tool_s, t.overhead_s) for t in ep.turns]
        assert (plan.dispatch_s, plan.startup_s, plan.first_request_s, plan.reward_s) == \
            (ep.dispatch_s, ep.startup_s, ep.first_request_s, ep.reward_s)
    # a group shares its first member's prompt
    assert len({len(ep.prompt_ids) for ep in episodes[:3]}) == 1


def test_free_compute_gives_the_planned_waits(bench, args):
    model = dataclasses.replace(load_model("tiny_cpu"), prefill=PrefillParams(1e-6, 0.0, 0.0),
                                decode=DecodeParams(1e-6, 0.0, 0.0), transfer_latency_s=0.0)
    rollout = rollout_of(bench, args)
    result = simulate(model, ClusterConfig(gpus=3, mode="colocated", time_quantum_s=0.0), rollout)
    episodes = bench.build_workload(args)
    for s, step in enumerate(episodes):
        waits = [ep.dispatch_s + (ep.startup_s + ep.first_request_s if ep.sandbox else 0.0)
                 + sum(HINT_DELAY_S + t.tool_s + t.overhead_s for t in ep.turns) + ep.reward_s
                 for group in step for ep in group]
        assert result.step_times_s[s] == pytest.approx(max(waits), abs=0.01)


@pytest.mark.parametrize("mode,prefill", [("colocated", 0), ("static", 1), ("adaptive", 1)])
def test_every_mode_predicts_three_instances(bench, args, mode, prefill):
    rollout = rollout_of(bench, args)
    cluster = ClusterConfig(gpus=3, mode=mode, prefill_instances=prefill, horizon_s=5.0)
    result = simulate(load_model("tiny_cpu"), cluster, rollout)
    assert result.steps_done == 2 and result.instances == 3
    assert result.trajectories_finished == 12


def test_sim_predict_fills_every_row_that_ran(bench, args, tmp_path):
    """bench_rollout.py --sim-predict: the fit from the run's samples, a prediction per mode beside the waits alone."""
    samples = {"prefill": [[64, 0, 0.02], [256, 0, 0.03], [1024, 0, 0.08], [2048, 0, 0.2]],
               "decode": [[1, 272, 0.006], [4, 1088, 0.008], [8, 2176, 0.01], [16, 4352, 0.015]],
               "pd_prefill": [[64, 0, 0.05], [256, 0, 0.06], [1024, 0, 0.11], [2048, 0, 0.23]]}
    rows = [{"mode": "adaptive", "step_time_mean_s": 20.0}, {"mode": "static", "step_time_mean_s": 20.0},
            {"mode": "colocated", "step_time_mean_s": 20.0}, {"mode": "static", "error": "did not start"}]
    bench.sim_predict(rows, samples, args, tmp_path)
    for row in rows[:3]:
        assert len(row["sim_step_times_s"]) == args.steps
        assert row["sim_error"] == pytest.approx(row["sim_step_time_mean_s"] / 20.0 - 1, abs=1e-3)
        assert row["sim_waits_only_step_time_mean_s"] < row["sim_step_time_mean_s"]
    assert "sim_error" not in rows[3]
    model = (tmp_path / f"{args.tag}_sim_model.json").read_text()
    assert "transfer_latency_s" in model and "median PD overhead" in model
