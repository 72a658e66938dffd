"""The simulator's cost as the cluster grows: CPU per simulated hour at 128 to 1,024 GPUs, per mode.

Each measurement is one simulated stretch (``--sim-hours``, default one hour) of bench_sim_speed.py's workload
(coding_agent at staleness 2, groups of 32) with the load scaled with the cluster: 8 groups per step at 128 GPUs, 64
at 1,024. Static runs at half the instances prefilling (bench_sim_speed's 4 of 8, scaled); adaptive starts there.
Every run is a fresh process, one at a time; ``--repeats`` run the whole list again, every other time in reverse
order, so that load on a shared machine hits each cluster size alike. All runs import one copy of the working tree's
``sglang_prorsa`` taken at the start (edits made meanwhile do not reach them); the JSON names its commit and the files
that differed from it.

For adaptive the real control plane's CPU is split out as bench_sim_breakdown.py does (lifecycle ingest, forecast
refresh, role-switch controller), giving its cost per lifecycle event and per refresh: what a deployment pays too.

The linearity ratio of a cluster size is (CPU per simulated hour / that of the smallest size) / (GPUs / smallest
GPUs): 1 is linear growth, below 1 better. A mode's verdict reads it at the largest size: "at most linear" when it is
<= 1 + the spread of the two points (the half-ranges of their repeats over their medians, added), else "super-linear".
The same ratio from the next smaller size alone (``step_linearity``; the verdict's ``last_step_*``) tells a one-time
rise, such as the working set outgrowing the CPU's caches, from growth that goes on.

The work apart from the machine (``--count-calls``, or ``--calls-only`` for that alone): one more run per cell under
cProfile counts the Python function calls of a simulated hour. The count does not depend on the machine or its load
(the same simulation gives the same count to about 0.01 %: only the order of sets of instances, hashed by address,
moves a few calls), so where CPU time per event grows with the cluster while calls per
event do not, the growth is the cost of each operation (the working set outgrowing the CPU's caches, the C-level
log factors of heaps and dicts, which the count leaves out), not more operations. Its verdict at the largest size:
"at most linear" when the calls per simulated hour grew at most ``WORK_TOLERANCE`` faster than the GPUs (their
linearity, as the CPU's above); calls per event and events per GPU show which of the two moved. CPU per call
(``us_per_call``) divides a cell's median CPU per event by its calls per event.

    python benchmarks/bench_sim_scale.py [--gpus 128 256 512 1024] [--modes colocated static adaptive] [--sim-hours 1]
                                         [--repeats 3] [--count-calls | --calls-only [--cpu-from JSON]] [--json ...]
    python benchmarks/bench_sim_scale.py --quick   # 128 and 256 GPUs, 0.05 simulated hour, 1 repeat; writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from sglang_prorsa.sim.profiling import PARTS  # the control plane's parts, as the child processes time them

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODES = ("colocated", "static", "adaptive")
BASE_GPUS, BASE_GROUPS, BASE_PREFILL = 128, 8, 4  # bench_sim_speed.py's cluster, load and static split
QUICK = {"gpus": [128, 256], "sim_hours": 0.05, "repeats": 1}
# Python work per event growing with log2 of the cluster would be 43 % higher at 1,024 GPUs than at 128, with the
# pool 700 %; 5 % leaves room for the scaled workloads being different draws (their events per GPU-hour differ by a
# few per cent).
WORK_TOLERANCE = 0.05
ONE_RUN = """
import json, sys, time
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import simulate
from sglang_prorsa.sim.profiling import ControlPlaneTimer

mode, gpus, p, groups, hours = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
count = sys.argv[6] == "calls"
rollout = RolloutConfig(preset="coding_agent", staleness=2, group_size=32, groups_per_step=groups, steps=10_000)
cluster = ClusterConfig(gpus=gpus, mode=mode, prefill_instances=p, max_sim_s=3600.0 * hours)
model = load_model("mimo_v25_pro")
if count:  # the calls, not the time: no timer wrappers, and cProfile's overhead makes the CPU time meaningless
    import cProfile, pstats
    profile = cProfile.Profile()
    r = profile.runcall(simulate, model, cluster, rollout)
    print(json.dumps({"calls": pstats.Stats(profile).total_calls, "sim_s": r.makespan_s, "events": r.events,
                      "switches": r.switches, "steps": r.steps_done}))
else:
    timer = ControlPlaneTimer("lifecycle_events").install()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    r = simulate(model, cluster, rollout)
    print(json.dumps({"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0,
                      "sim_s": r.makespan_s, "events": r.events, "switches": r.switches,
                      "steps": r.steps_done} | timer.report()))
"""


# ----- pure computations (unit-tested) -----
def scaled_load(gpus: int) -> tuple[int, int]:
    """(groups per step, static prefill instances) at ``gpus``: bench_sim_speed's 8 groups and 4 of 8 instances at
    128 GPUs, in proportion."""
    if gpus < 32 or gpus % 32:
        raise ValueError(f"GPU counts must be multiples of 32 (16-GPU instances, half of them prefill), got {gpus}")
    return BASE_GROUPS * gpus // BASE_GPUS, BASE_PREFILL * gpus // BASE_GPUS


def per_sim_hour(value: float, sim_s: float) -> float:
    """``value`` (CPU s, events) per simulated hour of a run that simulated ``sim_s`` seconds."""
    return value * 3600.0 / sim_s


def per_item(seconds: float, items: int, unit: float) -> float:
    """``seconds`` spread over ``items`` (events, refreshes), in ``unit`` (1e6: microseconds, 1e3: ms); 0 if none."""
    return unit * seconds / items if items > 0 else 0.0


def linearity(base_cost: float, cost: float, base_gpus: int, gpus: int) -> float:
    """How much faster than linear the cost grew from ``base_gpus`` to ``gpus``: 1 linear, < 1 sub-linear."""
    return (cost / base_cost) / (gpus / base_gpus)


def half_range(values: list[float]) -> float:
    """Half the range of repeats over their median (0 for one repeat)."""
    return (max(values) - min(values)) / (2 * statistics.median(values))


def verdict(ratio: float, spread: float) -> str:
    return "at most linear" if ratio <= 1.0 + spread else "super-linear"


def job_order(gpus: list[int], repeats: int, modes: tuple[str, ...] = MODES) -> list[tuple[int, int, str]]:
    """(repeat, GPUs, mode) in run order: every other repeat runs the list backwards."""
    once = [(g, mode) for g in gpus for mode in modes]
    return [(i, g, mode) for i in range(repeats) for g, mode in (once if i % 2 == 0 else once[::-1])]


def summarise(rows: list[dict]) -> dict:
    """Per (GPUs, mode): medians and ranges over repeats, per-event and per-refresh costs, linearity vs the smallest
    cluster; per mode: the verdict at the largest."""
    gpus = sorted({r["gpus"] for r in rows})
    cells: dict[str, dict] = {}
    for mode in MODES:
        for g in gpus:
            runs = [r for r in rows if r["mode"] == mode and r["gpus"] == g]
            if not runs:
                continue
            cpu = [per_sim_hour(r["cpu_s"], r["sim_s"]) for r in runs]
            cp = [per_sim_hour(sum(r[k] for k in PARTS), r["sim_s"]) for r in runs]
            cell = {
                "gpus": g, "mode": mode, "repeats": len(runs),
                "cpu_s_per_sim_h": statistics.median(cpu), "cpu_min": min(cpu), "cpu_max": max(cpu),
                "half_range": half_range(cpu),
                "wall_s_per_sim_h": statistics.median(per_sim_hour(r["wall_s"], r["sim_s"]) for r in runs),
                "events_per_sim_h": statistics.median(per_sim_hour(r["events"], r["sim_s"]) for r in runs),
                "us_per_event": statistics.median(per_item(r["cpu_s"], r["events"], 1e6) for r in runs),
                "switches": statistics.median(r["switches"] for r in runs),
                "steps": statistics.median(r["steps"] for r in runs),
                "same_result": len({(r["events"], r["switches"], r["steps"]) for r in runs}) == 1,
            }
            if mode == "adaptive":
                cell |= {
                    "control_plane_s_per_sim_h": statistics.median(cp),
                    "simulator_s_per_sim_h": statistics.median(c - p for c, p in zip(cpu, cp)),
                    "control_plane_share": statistics.median(p / c for c, p in zip(cpu, cp)),
                    "lifecycle_events_per_sim_h": statistics.median(
                        per_sim_hour(r["lifecycle_events"], r["sim_s"]) for r in runs),
                    "refreshes_per_sim_h": statistics.median(per_sim_hour(r["refreshes"], r["sim_s"]) for r in runs),
                    "ingest_us_per_event": statistics.median(
                        per_item(r["ingest"], r["lifecycle_events"], 1e6) for r in runs),
                    "refresh_ms_per_refresh": statistics.median(
                        per_item(r["refresh"], r["refreshes"], 1e3) for r in runs),
                    "controller_ms_per_refresh": statistics.median(
                        per_item(r["controller"], r["refreshes"], 1e3) for r in runs),
                }
            cells[f"{g}/{mode}"] = cell
    verdicts = {}
    for mode in MODES:
        mine = [cells[f"{g}/{mode}"] for g in gpus if f"{g}/{mode}" in cells]
        if not mine:
            continue
        base = mine[0]
        for previous, cell in zip([mine[0]] + mine, mine):
            cell["linearity"] = linearity(base["cpu_s_per_sim_h"], cell["cpu_s_per_sim_h"], base["gpus"], cell["gpus"])
            # The growth from the next smaller size alone: where a working set outgrows the caches, the ratio to the
            # smallest keeps that one-time rise while the last doubling shows whether the growth still goes on.
            cell["step_linearity"] = linearity(previous["cpu_s_per_sim_h"], cell["cpu_s_per_sim_h"], previous["gpus"],
                                               cell["gpus"])
            if mode == "adaptive":
                for part in ("control_plane", "simulator"):
                    cell[f"{part}_linearity"] = linearity(base[f"{part}_s_per_sim_h"], cell[f"{part}_s_per_sim_h"],
                                                          base["gpus"], cell["gpus"])
        top = mine[-1]
        spread = base["half_range"] + top["half_range"]
        below = mine[-2] if len(mine) > 1 else base
        last_spread = below["half_range"] + top["half_range"]
        verdicts[mode] = {"gpus": top["gpus"], "base_gpus": base["gpus"], "linearity": top["linearity"],
                          "spread": spread, "verdict": verdict(top["linearity"], spread),
                          "last_step_gpus": below["gpus"], "last_step_linearity": top["step_linearity"],
                          "last_step_spread": last_spread,
                          "last_step_verdict": verdict(top["step_linearity"], last_spread)}
    return {"cells": cells, "verdicts": verdicts}


def summarise_calls(rows: list[dict], timed: dict | None = None) -> dict:
    """Per (GPUs, mode) from one counted run each: Python calls per simulated hour, per event and per GPU; CPU per call
    where ``timed`` (``summarise``'s result) has the cell; per mode the work verdict at the largest size (module
    docstring)."""
    cells: dict[str, dict] = {}
    for mode in MODES:
        for r in sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["gpus"]):
            calls_per_event = r["calls"] / r["events"]
            cell = {"gpus": r["gpus"], "mode": mode, "calls_per_sim_h": per_sim_hour(r["calls"], r["sim_s"]),
                    "calls_per_event": calls_per_event,
                    "calls_per_gpu_sim_h": per_sim_hour(r["calls"], r["sim_s"]) / r["gpus"],
                    "events_per_gpu_sim_h": per_sim_hour(r["events"], r["sim_s"]) / r["gpus"]}
            time_cell = (timed or {}).get("cells", {}).get(f"{r['gpus']}/{mode}")
            if time_cell is not None:
                cell["us_per_call"] = time_cell["us_per_event"] / calls_per_event
            cells[f"{r['gpus']}/{mode}"] = cell
    verdicts = {}
    for mode in MODES:
        mine = [c for c in cells.values() if c["mode"] == mode]
        if not mine:
            continue
        base, top = mine[0], mine[-1]
        for cell in mine:
            cell["work_linearity"] = linearity(base["calls_per_sim_h"], cell["calls_per_sim_h"], base["gpus"],
                                               cell["gpus"])
        per_event = top["calls_per_event"] / base["calls_per_event"]
        events = top["events_per_gpu_sim_h"] / base["events_per_gpu_sim_h"]
        within = top["work_linearity"] <= 1 + WORK_TOLERANCE
        verdicts[mode] = {"gpus": top["gpus"], "base_gpus": base["gpus"], "work_linearity": top["work_linearity"],
                          "calls_per_event_ratio": per_event, "events_per_gpu_ratio": events,
                          "tolerance": WORK_TOLERANCE, "verdict": "at most linear" if within else "super-linear"}
    return {"cells": cells, "verdicts": verdicts}


def calls_table(calls: dict) -> list[str]:
    lines = [f"{'GPUs':>5} {'mode':<10} {'calls/sim-h':>14} {'calls/event':>11} {'calls/GPU/sim-h':>15} "
             f"{'work linearity':>14} {'us/call':>8}"]
    for c in calls["cells"].values():
        per_call = f"{c['us_per_call']:8.3f}" if "us_per_call" in c else f"{'-':>8}"
        lines.append(f"{c['gpus']:>5} {c['mode']:<10} {c['calls_per_sim_h']:14,.0f} {c['calls_per_event']:11.2f} "
                     f"{c['calls_per_gpu_sim_h']:15,.0f} {c['work_linearity']:14.3f} {per_call}")
    for mode, v in calls["verdicts"].items():
        lines.append(f"{mode}: Python calls at {v['gpus']} GPUs: {v['work_linearity']:.3f} of linear; per event "
                     f"{v['calls_per_event_ratio']:.3f}x, events per GPU {v['events_per_gpu_ratio']:.3f}x the "
                     f"{v['base_gpus']}-GPU run's (tolerance {v['tolerance']:.2f}): {v['verdict']}")
    return lines


def table(summary: dict) -> list[str]:
    lines = [f"{'GPUs':>5} {'mode':<10} {'CPU s/sim-h (min-max)':>24} {'events/sim-h':>13} {'us/event':>9} "
             f"{'linearity':>9} {'last step':>9}   control plane (adaptive)"]
    for cell in summary["cells"].values():
        cpu = f"{cell['cpu_s_per_sim_h']:.2f} ({cell['cpu_min']:.2f}-{cell['cpu_max']:.2f})"
        line = (f"{cell['gpus']:>5} {cell['mode']:<10} {cpu:>24} {cell['events_per_sim_h']:13,.0f} "
                f"{cell['us_per_event']:9.1f} {cell['linearity']:9.2f} {cell['step_linearity']:9.2f}")
        if cell["mode"] == "adaptive":
            line += (f"   {100 * cell['control_plane_share']:.0f} % of CPU; ingest {cell['ingest_us_per_event']:.1f} us"
                     f" per lifecycle event, refresh {cell['refresh_ms_per_refresh']:.2f} ms + controller "
                     f"{cell['controller_ms_per_refresh']:.2f} ms per refresh")
        if not cell["same_result"]:
            line += "   (repeats differ!)"
        lines.append(line)
    for mode, v in summary["verdicts"].items():
        line = (f"{mode}: linearity at {v['gpus']} GPUs {v['linearity']:.3f} (limit 1 + spread {v['spread']:.3f}): "
                f"{v['verdict']}")
        if v["last_step_gpus"] != v["base_gpus"]:  # three sizes or more: the last doubling on its own
            line += (f"; from {v['last_step_gpus']} GPUs {v['last_step_linearity']:.3f} "
                     f"(limit {1 + v['last_step_spread']:.3f}): {v['last_step_verdict']}")
        top = summary["cells"].get(f"{v['gpus']}/{mode}", {})
        if mode == "adaptive" and "simulator_linearity" in top:
            line += (f"; the simulator alone {top['simulator_linearity']:.2f}, the control plane alone "
                     f"{top['control_plane_linearity']:.2f}")
        lines.append(line)
    return lines


def draw(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, mode in enumerate(MODES):
        cells = [c for c in summary["cells"].values() if c["mode"] == mode]
        if not cells:
            continue
        x = [c["gpus"] for c in cells]
        y = [c["cpu_s_per_sim_h"] for c in cells]
        err = [[c["cpu_s_per_sim_h"] - c["cpu_min"] for c in cells], [c["cpu_max"] - c["cpu_s_per_sim_h"]
                                                                       for c in cells]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=f"C{i}", label=mode)
        ax.plot(x, [y[0] * g / x[0] for g in x], ls="--", lw=1, color=f"C{i}", alpha=0.6)
    ax.plot([], [], ls="--", lw=1, color="grey", label="linear from the smallest")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({c["gpus"] for c in summary["cells"].values()}),
                  [str(g) for g in sorted({c["gpus"] for c in summary["cells"].values()})])
    low = min(c["cpu_min"] for c in summary["cells"].values())
    high = max(c["cpu_max"] for c in summary["cells"].values())
    ticks = [m * 10.0 ** e for e in range(-2, 5) for m in (1, 2, 5) if low / 2 <= m * 10.0 ** e <= high * 2]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs (load in proportion)")
    ax.set_ylabel("CPU s per simulated hour")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_calls(calls: dict, path: Path) -> None:
    """Python calls per GPU per simulated hour against GPUs: a flat line is linear work."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, mode in enumerate(MODES):
        cells = [c for c in calls["cells"].values() if c["mode"] == mode]
        if cells:
            ax.plot([c["gpus"] for c in cells], [c["calls_per_gpu_sim_h"] for c in cells], marker="o", color=f"C{i}",
                    label=mode)
    gpus = sorted({c["gpus"] for c in calls["cells"].values()})
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GPUs (load in proportion)")
    ax.set_ylabel("Python calls per GPU per simulated hour")
    ax.set_title("flat: work linear in the cluster", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----- running -----
def snapshot(into: Path) -> tuple[Path, dict]:
    """A copy of the working tree's package under ``into`` (to import from), and where it came from."""
    shutil.copytree(ROOT / "sglang_prorsa", into / "sglang_prorsa", ignore=shutil.ignore_patterns("__pycache__"))

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.rstrip("\n") if out.returncode == 0 else ""  # porcelain lines start with a space

    changed = [line[3:] for line in git("status", "--porcelain", "--", "sglang_prorsa").splitlines()]
    return into, {"commit": git("rev-parse", "--short", "HEAD") or None, "uncommitted": changed}


def measure(tree: Path, mode: str, gpus: int, hours: float, count_calls: bool = False) -> dict:
    """One fresh process: its CPU time, or with ``count_calls`` its Python calls (module docstring)."""
    groups, prefill = scaled_load(gpus)
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(tree))
    args = [mode, str(gpus), str(prefill if mode == "static" else 0), str(groups), str(hours),
            "calls" if count_calls else "time"]
    out = subprocess.run([sys.executable, "-c", ONE_RUN, *args], env=env, cwd=tempfile.gettempdir(), check=True,
                         capture_output=True, text=True)
    return {"gpus": gpus, "mode": mode, "groups_per_step": groups,
            "prefill_instances": prefill if mode == "static" else None} | json.loads(out.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--sim-hours", type=float, default=1.0, help="simulated hours per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="modes to measure (default all)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['gpus']} GPUs, {QUICK['sim_hours']} simulated hour, {QUICK['repeats']} repeat; "
                         "writes JSON/PNG only where --json/--png are given")
    counting = ap.add_mutually_exclusive_group()
    counting.add_argument("--count-calls", action="store_true",
                          help="also count each cell's Python calls in one more run (work the machine's load does not move)")
    counting.add_argument("--calls-only", action="store_true",
                          help="only count the calls (no timed repeats); default outputs sim_scale_calls.json/.png")
    ap.add_argument("--cpu-from", type=Path, default=None, metavar="JSON",
                    help="with --calls-only: the timed run (a JSON this script wrote) whose CPU per event gives CPU "
                         "per call")
    ap.add_argument("--json", type=Path, default=None, help=f"default {RESULTS / 'sim_scale.json'}")
    ap.add_argument("--png", type=Path, default=None, help=f"default {RESULTS / 'sim_scale.png'}")
    args = ap.parse_args(argv)
    if args.quick:
        args.gpus, args.sim_hours, args.repeats = list(QUICK["gpus"]), QUICK["sim_hours"], QUICK["repeats"]
    else:
        name = "sim_scale_calls" if args.calls_only else "sim_scale"
        args.json = args.json or RESULTS / f"{name}.json"
        args.png = args.png or RESULTS / f"{name}.png"
    if args.cpu_from is not None and not (args.calls_only and args.cpu_from.is_file()):
        ap.error(f"--cpu-from needs --calls-only and an existing file, got {args.cpu_from}")
    if args.repeats < 1 or not args.sim_hours > 0:
        ap.error(f"--repeats must be >= 1 and --sim-hours > 0, got {args.repeats} and {args.sim_hours}")
    try:
        for g in args.gpus:
            scaled_load(g)
    except ValueError as e:
        ap.error(str(e))
    args.gpus = sorted(set(args.gpus))
    return args


def main(argv: list[str] | None = None) -> dict:
    """Runs, prints, writes; returns the timed summary, or with counted runs the whole result (``calls`` in it)."""
    args = parse_args(argv)
    rows, counted = [], []
    timed_jobs = [] if args.calls_only else job_order(args.gpus, args.repeats, tuple(args.modes))
    counted_jobs = [(g, m) for g in args.gpus for m in args.modes] if args.count_calls or args.calls_only else []
    with tempfile.TemporaryDirectory() as tmp:
        tree, source = snapshot(Path(tmp))
        for i, gpus, mode in tqdm(timed_jobs, desc="simulated stretches", unit="run", disable=not timed_jobs):
            rows.append({"repeat": i} | measure(tree, mode, gpus, args.sim_hours))
        for gpus, mode in tqdm(counted_jobs, desc="counted stretches", unit="run", disable=not counted_jobs):
            counted.append(measure(tree, mode, gpus, args.sim_hours, count_calls=True))
    summary = summarise(rows) if rows else {"cells": {}, "verdicts": {}}
    out = {"gpus": args.gpus, "modes": args.modes, "sim_hours": args.sim_hours,
           "repeats": 0 if args.calls_only else args.repeats, "tree": source, "summary": summary, "runs": rows}
    print(f"\n{args.sim_hours:g} simulated h per run, {out['repeats']} timed repeat(s); "
          f"tree {source['commit']} with {len(source['uncommitted'])} uncommitted file(s) in sglang_prorsa/")
    if rows:
        print("medians (CPU s: min-max over repeats)")
        print("\n".join(table(summary)))
    if counted:
        timed = json.loads(args.cpu_from.read_text())["summary"] if args.cpu_from else summary
        out["cpu_from"] = str(args.cpu_from) if args.cpu_from else None
        out["calls"] = summarise_calls(counted, timed)
        out["counted_runs"] = counted
        print("\n".join(calls_table(out["calls"])))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if args.png and rows:
        draw(summary, args.png)
    if args.png and counted:  # beside the timed plot, or in its place with --calls-only
        draw_calls(out["calls"], args.png if args.calls_only else args.png.with_name(f"{args.png.stem}_calls.png"))
    return out if counted else summary


if __name__ == "__main__":
    main()
