"""Smaller simulator pieces: prefix cache, g(x) for the predictor, workloads, switch pay-off accounting, the CLI."""

import json

import pytest

from sglang_prorsa.sim.__main__ import main as cli
from sglang_prorsa.sim.adaptive import expected_hit_ratios, predictor_profile
from sglang_prorsa.sim.config import ClusterConfig, load_model
from sglang_prorsa.sim.metrics import realised_gains, switches_per_step
from sglang_prorsa.sim.perf_model import PROFILE_POINTS, PerfModel
from sglang_prorsa.sim.prefix_cache import PrefixCache
from sglang_prorsa.sim.workloads import default_group_size, workload_tasks
from sglang_prorsa.workload.presets import LogNormal, TaskProfile, ToolSpec


def test_prefix_cache_is_lru_inside_the_room_it_gets():
    cache = PrefixCache()
    cache.put("a", 100, room=1000)
    cache.put("b", 300, room=1000)
    cache.put("a", 150, room=1000)  # a's longer prefix replaces its old one and becomes most recent
    assert (cache.tokens, list(cache.entries)) == (450, ["b", "a"])
    assert cache.get("b", room=1000) == 300  # a hit refreshes b
    assert cache.get("a", room=350) == 0  # only 350 left: the LRU entry (a) goes
    assert cache.evicted_tokens == 150 and cache.get("b", room=350) == 300


def flat_task(turns: int, prompt: int, output: int, tool_result: int) -> TaskProfile:
    fixed = lambda v: LogNormal(v, 0.0)  # noqa: E731
    return TaskProfile("flat", fixed(turns), fixed(prompt), fixed(output),
                       (ToolSpec("t", 1.0, fixed(1.0), fixed(tool_result)),), fixed(0.1), False, 1.0, fixed(0.0),
                       fixed(0.0), fixed(0.1), fixed(0.0), fixed(1.0), 1.0)


def test_expected_hits_follow_the_routing():
    # prompts 1000, 2000, 3000, 4000: turns 1-3 can hit the previous prompt (1000, 2000, 3000 tokens)
    task = flat_task(4, 1000, 500, 500)
    sure = expected_hit_ratios([task], hit_probability=1.0)
    half = expected_hit_ratios([task], hit_probability=0.5)
    i1024, i4096 = PROFILE_POINTS.index(1024), PROFILE_POINTS.index(4096)
    # bins are log-centred on the profile points: [512, 2048) holds the 1000 and 2000 prompts: 1000 / 3000 cached;
    # [2048, 5793) holds 3000 and 4000: (2000 + 3000) / (3000 + 4000)
    assert sure[i1024] == pytest.approx(1 / 3)
    assert sure[i4096] == pytest.approx(5 / 7) and half[i4096] == pytest.approx(5 / 14)


def test_g_counts_hits_and_parallel_ranks():
    perf = PerfModel(load_model("mimo_v25_pro"))
    hits = [0.5] * len(PROFILE_POINTS)
    g = predictor_profile(perf, hits)
    assert g(8192) == pytest.approx(perf.prefill_request_s(8192, 4096) / 2)
    assert g(8192) < perf.prefill_request_s(8192) / 2  # cheaper than cold


def test_workloads():
    assert [t.name for t in workload_tasks("math+coding_agent")] == ["math", "coding_agent"]
    assert default_group_size("math") == 8 and default_group_size("math+general_agent") == 32
    with pytest.raises(ValueError, match="nope"):
        workload_tasks("math+nope")


def test_switches_per_step():
    assert switches_per_step([5.0, 12.0, 31.0, 31.5], [(0.0, 10.0), (10.0, 30.0), (30.0, 40.0)]) == [1, 1, 2]


def test_realised_gain_uses_measured_demand():
    # A switch to decode at t = 0 with cost 50 GPU-s; the next two horizons measured decode demand 3 (1.1 x 3 = 3.3
    # needed) with 3 decode instances after the switch: the switched instance served 1 x 16 GPUs x 10 s each;
    # prefill needed 1 of its 4 (+1 lost would be 5 -> nothing lost).
    executed = [{"t": 0.0, "instance": "i0", "from": "prefill", "to": "decode", "gain_gpu_s": 100.0,
                 "cost_gpu_s": 50.0}]
    decisions = [{"t": t, "scheduled": True, "W_P": 10_000.0, "untracked": 0.0, "theta_P": 1000.0, "K_now": 0.0,
                  "C_KV": 1000.0, "slot_demand": 3.0, "current": [4, 3]} for t in (10.0, 20.0, 30.0, 40.0)]
    windows = [{"start": t, "forecast_arrivals": 0.0, "realised_arrivals": 0.0, "realised_decode": 0.0}
               for t in (10.0, 20.0, 30.0, 40.0)]
    [switch] = realised_gains(executed, decisions, windows, 10.0, 3, {"prefill": 16, "decode": 16}, 0.1)
    assert switch["realised_gain_gpu_s"] == pytest.approx(3 * 10 * 16)  # three windows inside the lookahead
    assert switch["paid"]


def test_realised_gain_of_a_move_into_decode_when_both_stages_are_short():
    # Both short in every window (planner's series rule): prefill measured a = 8 instances (6 + 1 < 8.8), decode held
    # 4 (3 - 1 < 4.4). With the switch 6:3 delivers δ = min(6/8, 3/4) = 0.75; without it 7:2 delivers min(7/8, 2/4)
    # = 0.5: a rise of 0.25 of the cluster's 9 x 16 GPUs over each of three 10 s windows. The old per-role rule would
    # have charged prefill's loss and paid nothing.
    executed = [{"t": 0.0, "instance": "i0", "from": "prefill", "to": "decode", "gain_gpu_s": 100.0,
                 "cost_gpu_s": 500.0}]
    decisions = [{"t": t, "scheduled": True, "W_P": 80_000.0, "untracked": 0.0, "theta_P": 1000.0, "K_now": 4000.0,
                  "C_KV": 1000.0, "slot_demand": 1.0, "held": 4.0, "current": [6, 3]} for t in (10.0, 20.0, 30.0)]
    windows = [{"start": t, "forecast_arrivals": 0.0, "realised_arrivals": 0.0, "realised_decode": 0.0}
               for t in (10.0, 20.0, 30.0)]
    [switch] = realised_gains(executed, decisions, windows, 10.0, 3, {"prefill": 16, "decode": 16}, 0.1)
    assert switch["realised_gain_gpu_s"] == pytest.approx(3 * 10 * 0.25 * 9 * 16)
    assert switch["paid"]
    # Decode not short of what it held (1 instance's worth): the per-role rule applies, decode gains nothing it
    # needs and prefill's lost service counts.
    for d in decisions:
        d["held"], d["K_now"] = 1.0, 1000.0
    [switch] = realised_gains(executed, decisions, windows, 10.0, 3, {"prefill": 16, "decode": 16}, 0.1)
    assert switch["realised_gain_gpu_s"] < 0 and not switch["paid"]


def test_compare_writes_every_seed(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert cli(["compare", "--preset", "general_agent", "--gpus", "48", "--groups-per-step", "1", "--group-size", "4",
                "--steps", "1", "--seeds", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    # colocated + 2 static ratios (3 instances) + adaptive, each for seeds 0 and 1
    assert [(r["mode"], r["prefill_instances"], r["seed"]) for r in rows] == [
        (m, p, s) for m, p in (("colocated", 0), ("static", 1), ("static", 2), ("adaptive", 1)) for s in (0, 1)]
    assert all(r["step_times_s"] and "switches" in r for r in rows)
    out = capsys.readouterr().out
    assert "adaptive / best static" in out
    # then adaptive against the baselines, looked up among the static runs: on 3 instances the paper's general-agent
    # 3:5 (1.125 prefill) and 1:1 (1.5, halves to decode) are both 1:2
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("adaptive / best static"))
    assert lines[at + 1].startswith("adaptive / paper optimum (static 1:2): ")
    assert lines[at + 2].startswith("adaptive / 1:1 (static 1:2): ")
    assert lines[at + 3].startswith("adaptive / flow balance (static ") and "flow balance: lambda = " in lines[at + 4]
    adaptive = [r for r in rows if r["mode"] == "adaptive"]
    assert all("baselines" not in r for r in rows if r["mode"] != "adaptive")
    versus = adaptive[0]["baselines"]
    assert list(versus) == ["best static", "paper optimum", "1:1", "flow balance"]
    assert versus["paper optimum"]["label"] == "1:2" and versus["1:1"]["adaptive_over"] > 0
    assert f"adaptive / 1:1 (static 1:2): {versus['1:1']['adaptive_over']:.3f}" in out
    assert {"mu_p", "mu_d", "kv_d", "bound"} <= set(adaptive[0]["flow_balance"])


def test_compare_says_when_a_workload_has_no_paper_optimum(capsys):
    assert cli(["compare", "--preset", "math+general_agent", "--gpus", "48", "--groups-per-step", "2",
                "--group-size", "2", "--steps", "1"]) == 0
    assert "adaptive / paper optimum: - (no paper optimum for 'math+general_agent' (a mix of tasks" in (
        capsys.readouterr().out)


def test_cluster_split_counts_wide_decode():
    model = load_model("mimo_v25_pro")
    assert ClusterConfig(mode="static", prefill_instances=4, decode_shape="wide").split(model) == (4, 2)
    assert ClusterConfig(mode="static", prefill_instances=3, decode_shape="wide").split(model) == (3, 2)
    with pytest.raises(ValueError, match="decode"):
        ClusterConfig(mode="static", prefill_instances=7, decode_shape="wide").split(model)


def test_steady_step_time_counts_every_completion():
    from sglang_prorsa.sim.metrics import SimResult

    base = dict(model="m", preset="p", staleness=2, mode="static", gpus=8, instances=2, prefill_instances=1, seed=0,
                steps_done=4, makespan_s=40.0, trajectories_finished=0, trajectories_dropped=0,
                completion_mean_s=None, completion_p50_s=None, completion_p90_s=None, sync_idle_ratio=0.0,
                gpu_idle_ratio=0.0, switches=0, wape_prefill=None, wape_decode=None, wall_s=1.0, events=0)
    # steps end at 10, 15, 30, 40; after 2 warm-up steps (t = 15) 12 trajectories finish by t = 40: batch 8 / (12 per
    # 25 s) = 16.7 s per step, where the mean of the last two steps is (15 + 10) / 2 = 12.5 s.
    r = SimResult(**base, step_times_s=[10.0, 5.0, 15.0, 10.0], batch=8,
                  finish_times=[9.0, 14.0] + [15.5 + 2 * k for k in range(12)])
    assert r.steady_step_s(2) == pytest.approx(8 * 25 / 12)
    assert r.steady_step_s(0) == pytest.approx(10.0)  # no warm-up: the mean step time


@pytest.mark.parametrize("argv, says", [
    (["compare", "--seeds", "0"], "argument --seeds: must be >= 1, got 0"),
    (["run", "--staleness", "-1"], "argument --staleness: must be >= 0, got -1"),
    (["compare", "--horizon", "0"], "argument --horizon: must be > 0.0, got 0"),
    (["run", "--steps", "x"], "argument --steps: 'x' is not an integer"),
    (["compare", "--preset", "math+nope"], "unknown task 'nope' in workload 'math+nope'"),
    (["run", "--model", "nope"], "no model config 'nope'"),
    (["compare", "--gpus", "16"], "16 GPUs hold 1 instances of 16: too few for adaptive"),
    (["run", "--mode", "static", "--prefill-instances", "8"], "prefill_instances=8 leaves room for 0 decode"),
])
def test_cli_rejects_bad_input_naming_it_before_any_run(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(argv)
    assert exit_info.value.code == 2  # argparse's usage error, no traceback and nothing simulated
    captured = capsys.readouterr()
    assert says in captured.err and not captured.out


def test_compare_over_worker_processes_gives_the_same_rows(tmp_path):
    argv = ["compare", "--preset", "coding_agent", "--gpus", "48", "--groups-per-step", "1", "--group-size", "4",
            "--staleness", "2", "--steps", "2", "--seeds", "2"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert cli(argv + ["--json", str(one)]) == 0
    assert cli(argv + ["--jobs", "2", "--json", str(two)]) == 0

    def rows(path):
        return [{k: v for k, v in r.items() if k not in ("wall_s", "sim_gpu_hours_per_wall_s")}
                for r in json.loads(path.read_text())]

    assert rows(one) == rows(two) and len(rows(one)) == 8  # colocated, 2 static ratios, adaptive; 2 seeds each
