"""bench_sim_scale.py: the simulator's CPU per simulated hour as the cluster grows, and whether it grows linearly."""

import json

import pytest
from unit_support import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_sim_scale")


def _run(gpus, mode, cpu_s, sim_s=3600.0, events=100_000, ingest=0.0, refresh=0.0, controller=0.0,
         lifecycle_events=0, refreshes=0):
    return {"gpus": gpus, "mode": mode, "cpu_s": cpu_s, "wall_s": cpu_s, "sim_s": sim_s, "events": events,
            "switches": 0, "steps": 3, "ingest": ingest, "refresh": refresh, "controller": controller,
            "lifecycle_events": lifecycle_events, "refreshes": refreshes}


def test_the_load_grows_with_the_cluster(bench):
    assert bench.scaled_load(128) == (8, 4)  # bench_sim_speed.py: 8 groups, 4 of 8 instances prefill
    assert bench.scaled_load(256) == (16, 8)
    assert bench.scaled_load(1024) == (64, 32)
    with pytest.raises(ValueError):
        bench.scaled_load(100)


def test_pure_costs(bench):
    assert bench.per_sim_hour(5.0, 1800.0) == 10.0  # 5 CPU s in half a simulated hour
    assert bench.per_item(0.5, 100_000, 1e6) == pytest.approx(5.0)  # 5 us per event
    assert bench.per_item(0.006, 3, 1e3) == pytest.approx(2.0)  # 2 ms per refresh
    assert bench.per_item(1.0, 0, 1e6) == 0.0
    assert bench.linearity(10.0, 80.0, 128, 1024) == 1.0  # 8x the GPUs, 8x the cost
    assert bench.linearity(10.0, 40.0, 128, 1024) == 0.5
    assert bench.linearity(10.0, 100.0, 128, 1024) == 1.25
    assert bench.half_range([9.0, 10.0, 12.0]) == pytest.approx(0.15)  # (12 - 9) / 2 / 10
    assert bench.half_range([7.0]) == 0.0
    assert bench.verdict(1.1, 0.15) == "at most linear"
    assert bench.verdict(1.0, 0.0) == "at most linear"
    assert bench.verdict(1.2, 0.15) == "super-linear"


def test_every_other_repeat_runs_backwards(bench):
    order = bench.job_order([128, 256], 2)
    forward = [(128, "colocated"), (128, "static"), (128, "adaptive"),
               (256, "colocated"), (256, "static"), (256, "adaptive")]
    assert order == [(0, g, m) for g, m in forward] + [(1, g, m) for g, m in reversed(forward)]


def test_summary_linearity_verdicts_and_control_plane_costs(bench):
    rows = [
        # colocated: median 2.0 (half-range 0.1) -> 17.0 (half-range 1/17): 17 / 2 / 8 = 1.0625 <= 1.1588
        _run(128, "colocated", 2.0), _run(128, "colocated", 2.2), _run(128, "colocated", 1.8),
        _run(1024, "colocated", 17.0), _run(1024, "colocated", 16.0), _run(1024, "colocated", 18.0),
        # static, half an hour each: 1 -> 12 CPU s per simulated hour: 1.5, no spread
        _run(128, "static", 0.5, sim_s=1800.0), _run(1024, "static", 6.0, sim_s=1800.0),
        # adaptive: 4 s of which 2 control plane -> 24 s of which 8: simulator (2 -> 16) 1.0, control plane (2 -> 8)
        # 0.5, all 0.75
        _run(128, "adaptive", 4.0, events=200_000, ingest=1.0, refresh=0.6, controller=0.4, lifecycle_events=200_000,
             refreshes=400),
        _run(1024, "adaptive", 24.0, events=1_600_000, ingest=4.0, refresh=3.2, controller=0.8,
             lifecycle_events=1_600_000, refreshes=400),
    ]
    summary = bench.summarise(rows)
    cells, verdicts = summary["cells"], summary["verdicts"]
    assert cells["128/colocated"]["cpu_s_per_sim_h"] == 2.0 and cells["128/colocated"]["cpu_min"] == 1.8
    assert cells["128/colocated"]["us_per_event"] == pytest.approx(20.0)  # 2 s over 100,000 events
    assert cells["1024/colocated"]["linearity"] == pytest.approx(1.0625)
    assert verdicts["colocated"]["spread"] == pytest.approx(0.1 + 1 / 17)
    assert verdicts["colocated"]["verdict"] == "at most linear"
    assert cells["1024/static"]["cpu_s_per_sim_h"] == 12.0 and cells["1024/static"]["events_per_sim_h"] == 200_000
    assert verdicts["static"] == {"gpus": 1024, "base_gpus": 128, "linearity": 1.5, "spread": 0.0,
                                  "verdict": "super-linear", "last_step_gpus": 128, "last_step_linearity": 1.5,
                                  "last_step_spread": 0.0, "last_step_verdict": "super-linear"}
    small, big = cells["128/adaptive"], cells["1024/adaptive"]
    assert small["control_plane_share"] == 0.5 and big["control_plane_share"] == pytest.approx(1 / 3)
    assert small["ingest_us_per_event"] == pytest.approx(5.0) and big["ingest_us_per_event"] == pytest.approx(2.5)
    assert small["refresh_ms_per_refresh"] == pytest.approx(1.5) and big["refresh_ms_per_refresh"] == pytest.approx(8)
    assert small["controller_ms_per_refresh"] == pytest.approx(1.0)
    assert big["linearity"] == pytest.approx(0.75)
    assert big["simulator_linearity"] == pytest.approx(1.0) and big["control_plane_linearity"] == pytest.approx(0.5)
    assert verdicts["adaptive"]["verdict"] == "at most linear"
    lines = bench.table(summary)
    assert lines[-1] == ("adaptive: linearity at 1024 GPUs 0.750 (limit 1 + spread 0.000): at most linear; "
                         "the simulator alone 1.00, the control plane alone 0.50")
    assert "static: linearity at 1024 GPUs 1.500 (limit 1 + spread 0.000): super-linear" in lines


def test_the_last_doubling_tells_a_one_time_rise_from_growth_that_goes_on(bench):
    """CPU s per simulated hour 1 -> 3 -> 6 at 128, 256, 512 GPUs: 1.5 from the smallest, 1.0 over the last
    doubling (6 / 3 / 2); the middle size's step is 3 / 1 / 2 = 1.5."""
    rows = [_run(128, "colocated", 1.0), _run(256, "colocated", 3.0), _run(512, "colocated", 6.0)]
    summary = bench.summarise(rows)
    cells, v = summary["cells"], summary["verdicts"]["colocated"]
    assert cells["128/colocated"]["step_linearity"] == 1.0
    assert cells["256/colocated"]["step_linearity"] == pytest.approx(1.5)
    assert cells["512/colocated"]["step_linearity"] == pytest.approx(1.0)
    assert (v["linearity"], v["verdict"]) == (pytest.approx(1.5), "super-linear")
    assert (v["last_step_gpus"], v["last_step_linearity"], v["last_step_verdict"]) == (
        256, pytest.approx(1.0), "at most linear")
    assert bench.table(summary)[-1] == ("colocated: linearity at 512 GPUs 1.500 (limit 1 + spread 0.000): "
                                        "super-linear; from 256 GPUs 1.000 (limit 1.000): at most linear")


def _counted(gpus, mode, calls, events, sim_s=3600.0):
    return {"gpus": gpus, "mode": mode, "calls": calls, "events": events, "sim_s": sim_s, "switches": 0, "steps": 3}


def test_counted_calls_tell_the_work_from_the_machine(bench):
    rows = [
        # colocated: 100 calls per event at 128 GPUs (1,000 events/h), 101 at 1,024 (8,080 events/h: 1 % more per
        # GPU): 816,080 / 100,000 / 8 = 1.0201 of linear, within 5 %
        _counted(128, "colocated", 100_000, 1_000), _counted(1024, "colocated", 816_080, 8_080),
        # static, half an hour each: 50 -> 60 calls per event, events linear: 1.2 of linear
        _counted(128, "static", 25_000, 500, 1800.0), _counted(1024, "static", 240_000, 4_000, 1800.0),
    ]
    timed = {"cells": {"128/colocated": {"us_per_event": 20.0}, "1024/colocated": {"us_per_event": 30.3}}}
    calls = bench.summarise_calls(rows, timed)
    cells, verdicts = calls["cells"], calls["verdicts"]
    assert cells["128/colocated"]["calls_per_event"] == 100.0
    assert cells["1024/colocated"]["calls_per_gpu_sim_h"] == pytest.approx(816_080 / 1024)
    assert cells["1024/colocated"]["work_linearity"] == pytest.approx(1.0201)
    # CPU per call: 20 us / 100 calls = 0.2 us; 30.3 us / 101 calls = 0.3 us: the operations got slower, not more
    assert cells["128/colocated"]["us_per_call"] == pytest.approx(0.2)
    assert cells["1024/colocated"]["us_per_call"] == pytest.approx(0.3)
    assert verdicts["colocated"] == {"gpus": 1024, "base_gpus": 128, "work_linearity": pytest.approx(1.0201),
                                     "calls_per_event_ratio": pytest.approx(1.01),
                                     "events_per_gpu_ratio": pytest.approx(1.01), "tolerance": 0.05,
                                     "verdict": "at most linear"}
    assert cells["1024/static"]["calls_per_sim_h"] == 480_000 and "us_per_call" not in cells["1024/static"]
    assert verdicts["static"]["work_linearity"] == pytest.approx(1.2)
    assert verdicts["static"]["verdict"] == "super-linear"
    lines = bench.calls_table(calls)
    assert lines[-1] == ("static: Python calls at 1024 GPUs: 1.200 of linear; per event 1.200x, events per GPU "
                         "1.000x the 128-GPU run's (tolerance 0.05): super-linear")
    assert bench.summarise_calls([_counted(128, "adaptive", 10, 5)])["verdicts"]["adaptive"]["verdict"] == \
        "at most linear"  # one size: linear by definition


def test_modes_narrow_the_runs(bench):
    assert bench.job_order([128, 256], 1, ("colocated",)) == [(0, 128, "colocated"), (0, 256, "colocated")]
    assert bench.parse_args(["--modes", "static", "colocated"]).modes == ["static", "colocated"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "oracle"])


def test_arguments(bench):
    quick = bench.parse_args(["--quick"])
    assert (quick.gpus, quick.sim_hours, quick.repeats, quick.json, quick.png) == ([128, 256], 0.05, 1, None, None)
    full = bench.parse_args([])
    assert full.gpus == [128, 256, 512, 1024] and full.repeats == 3 and full.sim_hours == 1.0
    assert full.json.name == "sim_scale.json" and full.png.name == "sim_scale.png"
    for bad in (["--gpus", "100"], ["--repeats", "0"], ["--sim-hours", "0"], ["--count-calls", "--calls-only"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    calls = bench.parse_args(["--calls-only"])
    assert calls.calls_only and calls.json.name == "sim_scale_calls.json" and calls.png.name == "sim_scale_calls.png"
    assert bench.parse_args(["--count-calls"]).json.name == "sim_scale.json"
    with pytest.raises(SystemExit):
        bench.parse_args(["--cpu-from", "results/sim_scale.json"])  # only with --calls-only
    with pytest.raises(SystemExit):
        bench.parse_args(["--calls-only", "--cpu-from", "/no/such/file.json"])


def test_quick_run_end_to_end(bench, tmp_path):
    """128 and 256 GPUs, each mode, 0.05 simulated hour in fresh processes: a few seconds."""
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    summary = bench.main(["--quick", "--json", str(out), "--png", str(png)])
    data = json.loads(out.read_text())
    assert png.stat().st_size > 0
    assert set(data["tree"]) == {"commit", "uncommitted"}  # the copy every run imported
    assert len(data["runs"]) == 6 and {(r["gpus"], r["mode"]) for r in data["runs"]} == {
        (g, m) for g in (128, 256) for m in ("colocated", "static", "adaptive")}
    for run in data["runs"]:
        assert run["sim_s"] == pytest.approx(180.0) and run["events"] > 0 and run["cpu_s"] > 0
        assert run["groups_per_step"] == run["gpus"] // 16
        assert run["prefill_instances"] == (run["gpus"] // 32 if run["mode"] == "static" else None)
    adaptive = summary["cells"]["256/adaptive"]
    assert adaptive["lifecycle_events_per_sim_h"] > 0 and adaptive["refreshes_per_sim_h"] > 0
    assert adaptive["refresh_ms_per_refresh"] > 0
    assert set(summary["verdicts"]) == {"colocated", "static", "adaptive"}


def test_quick_counted_run_end_to_end(bench, tmp_path):
    """The counted runs alone (no timed repeats). Two runs of one cell agree to far better than the tolerance: the
    simulation is the same; only the order of sets of instances (hashed by address) moves a few calls."""
    out, png = tmp_path / "calls.json", tmp_path / "calls.png"
    result = bench.main(["--quick", "--calls-only", "--modes", "static", "--json", str(out), "--png", str(png)])
    data = json.loads(out.read_text())
    assert png.stat().st_size > 0 and data["runs"] == [] and data["repeats"] == 0
    assert [(r["gpus"], r["mode"]) for r in data["counted_runs"]] == [(128, "static"), (256, "static")]
    assert all(r["calls"] > r["events"] > 0 for r in data["counted_runs"])
    assert set(result["calls"]["verdicts"]) == {"static"}
    both = bench.main(["--quick", "--count-calls", "--modes", "static", "--gpus", "128", "--png",
                       str(tmp_path / "both.png")])
    assert both["summary"]["cells"]["128/static"]["repeats"] == 1 and "128/static" in both["calls"]["cells"]
    assert (tmp_path / "both.png").stat().st_size > 0 and (tmp_path / "both_calls.png").stat().st_size > 0
    timed = tmp_path / "timed.json"  # CPU per call from a timed run's CPU per event
    timed.write_text(json.dumps({"summary": {"cells": {"128/static": {"us_per_event": 40.0}}}}))
    again = bench.main(["--quick", "--calls-only", "--modes", "static", "--gpus", "128", "--cpu-from", str(timed)])
    assert again["counted_runs"][0]["events"] == data["counted_runs"][0]["events"]
    cell = again["calls"]["cells"]["128/static"]
    assert cell["us_per_call"] == pytest.approx(40.0 / cell["calls_per_event"])
    assert again["counted_runs"][0]["calls"] == pytest.approx(data["counted_runs"][0]["calls"], rel=1e-3)
