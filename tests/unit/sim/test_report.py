"""The grid report: per-seed intervals, and what they allow us to say about the 1.02 target."""

import json
import math

import pytest
from unit_support import load_benchmark

from sglang_prorsa.sim.metrics import interval95
from sglang_prorsa.sim.report import markdown


def test_interval95_is_the_student_t_interval_of_the_mean():
    lo, hi = interval95([1.0, 1.1, 0.9, 1.0])
    sd = math.sqrt(((0.0) ** 2 + 0.1 ** 2 + 0.1 ** 2 + 0.0) / 3)
    assert (lo, hi) == pytest.approx((1.0 - 3.182 * sd / 2, 1.0 + 3.182 * sd / 2))
    assert interval95([1.0]) is None and interval95([1.0, float("inf")]) is None and interval95([]) is None
    assert interval95([1.0, float("nan"), 1.2]) == pytest.approx([1.1 - 12.706 * math.sqrt(0.02) / math.sqrt(2),
                                                                 1.1 + 12.706 * math.sqrt(0.02) / math.sqrt(2)])


def _row(preset, ratio, seeds, bound=True):
    return {"preset": preset, "staleness": 2, "groups": 16, "gpu_bound": bound, "colocated_s": 100.0,
            "best_static": "2:6", "best_static_s": 100.0, "adaptive_s": 100.0 * ratio, "adaptive_over_best": ratio,
            "adaptive_over_best_seeds": seeds, "adaptive_over_best_ci95": interval95(seeds),
            "adaptive_over_colocated": ratio, "switches_per_step": 1.0, "switches_paid_share": 1.0,
            "wape_prefill": None, "wape_decode": None, "interference": dict.fromkeys(MODES, 0.0),
            "imbalance": dict.fromkeys(MODES, 0.0), "prefix_hit": dict.fromkeys(MODES, 0.0)}


MODES = ("colocated", "best static", "adaptive")


def test_report_reads_each_gpu_bound_row_against_its_interval():
    rows = [_row("tight", 1.00, [0.99, 1.00, 1.01, 1.00]),        # interval inside 1.02
            _row("unsure", 1.05, [0.95, 1.15, 1.00, 1.10]),       # above 1.02, interval reaches below it
            _row("slower", 1.10, [1.09, 1.10, 1.11, 1.10]),       # whole interval above 1.02
            _row("light", 1.30, [1.30, 1.30], bound=False)]       # not GPU-bound: not judged
    text = markdown({"rows": rows, "args": {"model": "m", "seeds": "4"}}, "m", {}, {})
    assert "the <= 1.02 target is NOT met in every GPU-bound row" in text
    assert "at most **1.100** (slower, staleness 2, 16 groups)" in text
    assert "whole interval at or below 1.02 in 1 of 3 GPU-bound rows (tight/2/16)" in text
    assert "point estimate above 1.02 but 1.02 inside the interval: unsure/2/16" in text
    assert "reliably above 1.02 (whole interval): slower/2/16." in text
    assert "**1.000** (0.990, 1.000, 1.010, 1.000; 0.99-1.01)" in text


def test_a_sweep_without_a_gpu_bound_load_and_an_unfinished_colocated_mode():
    light = _row("general_agent", 1.02, [1.0, 1.04], bound=False)
    unfinished = {**_row("coding_agent", 1.03, [1.02, 1.04], bound=False), "colocated_s": float("inf"),
                  "adaptive_over_colocated": float("nan"), "interference": {**dict.fromkeys(MODES, 0.0),
                                                                           "colocated": 0.4}}
    text = markdown({"rows": [light, unfinished], "args": {"model": "d", "seeds": "2"}}, "deepseek_like", {}, {})
    assert "No load of this sweep makes the cluster GPU-bound" in text and "NOT met" not in text
    assert "| coding_agent | 2 | 16 | no | unfinished | 2:6 |" in text
    assert "| 1.03 |" not in text.split("## Beside the paper")[0].split("| coding_agent |")[1].split("\n")[0]
    # the comparison skips the cell without a colocated step time instead of dividing by it
    assert "| agentic speedup of adaptive over colocation | 1.11-4.05x | 0.98-0.98x |" in text
    assert "interference costs colocated ranks 0-40 % of GPU time" in text  # not the MiMo-specific reading


def test_speed_section_reads_each_mode_against_the_target():
    speed = [{"mode": m, "sim_s": 3600.0, "wall_s": 128 / r, "cpu_s": 128 / r, "gpu_hours_per_wall_s": r,
              "gpu_hours_per_cpu_s": r} for m, r in (("static", 120.0), ("static", 110.0), ("adaptive", 90.0),
                                                      ("adaptive", 115.0), ("colocated", 80.0), ("colocated", 95.0))]
    text = markdown({"rows": [], "speed": speed, "speed_args": {}, "args": {}}, "m", {}, {})
    assert "(re-measured alone, `--speed-only`, after the grid)" in text
    assert ("Target >= 100 simulated GPU-hours per wall-clock second: static 110-120 (met), "
            "adaptive 90-115 (met on average), colocated 80-95 (NOT met).") in text


def test_a_merged_report_names_every_run_that_made_it():
    full = {"model": "m", "seeds": "4", "presets": "['math', 'coding_agent', 'general_agent']", "staleness": "[0, 2, 8]",
            "loads": "{}"}
    part = {"model": "m", "seeds": "4", "presets": "['math']", "staleness": "[0, 2, 8]",
            "loads": "{'math/0': (512, 1024), 'math/2': (128, 256)}"}
    text = markdown({"rows": [_row("math", 1.0, [1.0, 1.0])], "merged_from": [full, part], "wall_s": 30.0},
                    "m", {}, {})
    assert ("Produced by `python benchmarks/bench_sim_grid.py --model m --seeds 4`; `python benchmarks/bench_sim_grid.py "
            "--model m --seeds 4 --presets math --loads math/0=512,1024 math/2=128,256` (30 s wall") in text


def test_merging_a_merged_grid_keeps_every_command(tmp_path):
    bench = load_benchmark("bench_sim_grid")
    grids = {"merged": {"model": "m", "args": {"out": "x"}, "merged_from": [{"out": "a"}, {"out": "b"}], "wall_s": 2.0},
             "plain": {"model": "m", "args": {"out": "c"}, "wall_s": 1.0}}
    for name, grid in grids.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "grid.json").write_text(json.dumps(grid))
    merged = bench.merge_grids([tmp_path / "merged", tmp_path / "plain"])
    assert merged["merged_from"] == [{"out": "a"}, {"out": "b"}, {"out": "c"}] and merged["wall_s"] == 3.0
    grids["plain"]["model"] = "other"
    (tmp_path / "plain" / "grid.json").write_text(json.dumps(grids["plain"]))
    with pytest.raises(SystemExit, match="different models"):
        bench.merge_grids([tmp_path / "merged", tmp_path / "plain"])


@pytest.mark.parametrize("argv, says", [
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),
    (["--loads", "math=16,x"], "--loads 'math=16,x': expected TASK=G1,G2"),
    (["--presets", "nope"], "--presets: unknown 'nope'"),
    (["--staleness", "4"], "no default load for math at staleness 4"),
    (["--model", "nope"], "--model: no model config 'nope'"),
    (["--reuse", "{tmp}"], "no runs_*.json there"),
    (["--merge", "{tmp}"], "no grid.json there"),
    (["--ratios", "2", "8"], "--ratios 8: not a static split of 128 GPUs for mimo_v25_pro (prefill instances 1-7)"),
])
def test_grid_rejects_bad_flags_before_running_anything(tmp_path, monkeypatch, capsys, argv, says):
    bench = load_benchmark("bench_sim_grid")
    out = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    monkeypatch.setattr("sys.argv", ["bench_sim_grid.py", *argv, "--no-speed", "--out", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2 and says in capsys.readouterr().err
    assert not out.exists()  # nothing run, nothing written


def test_baseline_columns_are_a_lookup_among_the_static_runs():
    bench = load_benchmark("bench_sim_grid")
    from sglang_prorsa.sim.baselines import Baseline

    flow = type("Flow", (), {"to_dict": lambda self: {"baseline": {}, "mu_p": 30.0, "mu_d": 2.0, "kv_d": 60.0,
                                                       "bound": 14.0}})()
    picks = {"paper optimum": Baseline("paper optimum", 3, 5, "paper 3:5"), "1:1": Baseline("1:1", 4, 4, "half"),
             "flow balance": Baseline("flow balance", 1, 7, "flow"), "flow": flow}
    statics = {1: 100.0, 3: 125.0, 4: float("inf")}  # 4:4 did not finish within --max-sim-s
    versus = bench._versus(picks, statics, 110.0)
    assert versus["paper optimum"]["adaptive_over"] == pytest.approx(110 / 125)
    assert versus["flow balance"]["adaptive_over"] == pytest.approx(1.1)
    assert versus["1:1"]["adaptive_over"] is None and versus["1:1"]["static_s"] == float("inf")
    assert versus["flow balance"]["flow"]["mu_d"] == 2.0

    new = {**_row("general_agent", 1.0, [1.0, 1.0]), "baselines": versus}
    none = {**_row("research_agent", 1.0, [1.0, 1.0]), "baselines": {
        **versus, "paper optimum": Baseline("paper optimum", None, None, "none").to_dict()}}
    text = markdown({"rows": [new, none], "args": {"model": "m", "seeds": "2"}}, "m", {}, {})
    header, rule, row, row2 = [line for line in text.splitlines() if line.startswith("|")][:4]
    assert header.endswith("| WAPE P / D | adaptive / paper optimum | adaptive / 1:1 | adaptive / flow balance |")
    assert rule.count("---") == 16
    # the existing columns are unchanged (a grid made before the baselines keeps its old table); the new ones give
    # the ratio and the split it was read at
    old = markdown({"rows": [_row("general_agent", 1.0, [1.0, 1.0])], "args": {}}, "m", {}, {})
    assert "adaptive / 1:1" not in old and "Baselines without an oracle" not in old
    old_row = next(line for line in old.splitlines() if line.startswith("| general_agent |"))
    assert row == old_row + " 0.880 (3:5) | unfinished (4:4) | 1.100 (1:7) |"
    assert row2.endswith("| - | - | unfinished (4:4) | 1.100 (1:7) |")  # WAPE "-", then no paper optimum
    assert "### Baselines without an oracle" in text
    assert "| general_agent | 3:5 | 4:4 | 1:7 | 30 | 2 | 60 | 14 |" in text


def test_ratios_restrict_the_static_runs_but_keep_every_baselines_pick():
    import argparse

    bench = load_benchmark("bench_sim_grid")
    args = argparse.Namespace(model="mimo_v25_pro", gpus=128, ratios=[])
    picks = {"general_agent": bench.cell_baselines(args, "general_agent")}
    assert bench.grid_ratios(args, picks) == [1, 2, 3, 4, 5, 6, 7]  # no --ratios: every split of 8 instances
    args.ratios = [2]
    wanted = {2} | {picks["general_agent"][name].prefill_instances for name in ("paper optimum", "1:1",
                                                                                "flow balance")}
    assert 3 in wanted and 4 in wanted  # the paper's 3:5 for the general agent, and 1:1
    assert bench.grid_ratios(args, picks) == sorted(wanted)


def test_a_one_load_grid_with_named_ratios_says_so():
    rows = [_row("coding_agent", 1.05, [1.0, 1.1], bound=False) | {"growth_over_half_load": None}]
    text = markdown({"rows": rows, "args": {"model": "m", "seeds": "2", "ratios": "[11, 12]"}}, "m", {}, {})
    assert "the static ratios run: 11, 12 prefill instances (`--ratios`) and each baseline's pick" in text
    assert "Each cell ran one load, so whether it is GPU-bound" in text and "No load of this sweep" not in text
    every = markdown({"rows": rows, "args": {"model": "m", "seeds": "2", "ratios": "[]"}}, "m", {}, {})
    assert "the fastest of *every* static ratio" in every
