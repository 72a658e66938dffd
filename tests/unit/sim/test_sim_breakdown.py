"""bench_sim_breakdown.py: the split of a simulated hour's CPU between the control plane and the simulator."""

from unit_support import load_benchmark


def _run(mode, cpu_s, ingest=0.0, refresh=0.0, controller=0.0, events=0, refreshes=0):
    return {"mode": mode, "cpu_s": cpu_s, "wall_s": cpu_s, "sim_s": 3600.0, "ingest": ingest, "refresh": refresh,
            "controller": controller, "events": events, "refreshes": refreshes}


def test_summary_splits_the_control_plane_from_the_simulator():
    bench = load_benchmark("bench_sim_breakdown")
    rows = [_run("adaptive", 4.0, ingest=1.0, refresh=0.6, controller=0.4, events=200_000, refreshes=400),
            _run("static", 1.6), _run("colocated", 2.0)]
    lines = bench.summarise(rows)
    adaptive, static, colocated = lines[1:4]
    # 128 GPU-h per simulated hour: 32 per CPU-s overall; 64 for the simulator alone (2 s of the 4 s)
    assert adaptive.split()[1:3] == ["4.00", "32.0"] and adaptive.split()[-1] == "64.0"
    assert static.split()[-1] == "80.0" and colocated.split()[-1] == "64.0"
    assert "control plane 50 % of CPU (ingest 25 %, refresh 15 %, controller 10 %)" in lines[4]
    assert "200000 lifecycle events and 400 refreshes per simulated hour: 5.0 us per event, 1.5 ms per refresh" \
        in lines[4]
    assert lines[5] == "the control plane alone caps adaptive at 64 GPU-h per CPU-s (target 100)"
