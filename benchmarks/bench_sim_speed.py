"""Simulator speed against an earlier revision, measured in the same run.

Each measurement is one simulated hour of the grid's speed workload (128 GPUs, coding_agent at staleness 2, 8 groups
of 32 per step; the same as ``bench_sim_grid.py --speed-only``) in a fresh process, for each mode, alternating the two
trees so that load on a shared machine hits both alike. The baseline tree is ``git archive`` of ``--baseline``. Both
trees must give the same result (simulated steps and switches are compared); only the time may differ.

    python benchmarks/bench_sim_speed.py --baseline 944362f [--current 0a3e0f3] --repeats 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
MODES = (("colocated", 0), ("static", 4), ("adaptive", 0))
ONE_RUN = """
import json, sys, time
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import simulate
mode, p, hours = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rollout = RolloutConfig(preset="coding_agent", staleness=2, group_size=32, groups_per_step=8, steps=10_000)
cluster = ClusterConfig(gpus=128, mode=mode, prefill_instances=p, max_sim_s=3600.0 * hours)
cpu0, wall0 = time.process_time(), time.perf_counter()
r = simulate(load_model("mimo_v25_pro"), cluster, rollout)
print(json.dumps({"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0, "sim_s": r.makespan_s,
                  "events": r.events, "switches": r.switches, "steps": r.steps_done}))
"""


def export(rev: str, into: Path) -> Path:
    """The package of revision ``rev`` (git archive), unpacked under ``into``."""
    archive = subprocess.run(["git", "archive", rev, "sglang_prorsa"], cwd=ROOT, check=True, capture_output=True)
    into.mkdir(parents=True, exist_ok=True)
    path = into / "tar"
    path.write_bytes(archive.stdout)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(tree: Path, mode: str, p: int, hours: float) -> dict:
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", ONE_RUN, mode, str(p), str(hours)], env=env, cwd=tempfile.gettempdir(),
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision to compare with, e.g. 944362f")
    ap.add_argument("--current", default=None,
                    help="git revision to measure instead of the working tree (e.g. the last one whose results "
                         "should equal the baseline's, before a change of behaviour)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours per measurement")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None, help="bars: GPU-hours per wall-second, both trees, per mode")
    args = ap.parse_args()
    if args.repeats < 1 or not args.hours > 0:
        ap.error(f"--repeats must be >= 1 and --hours > 0, got {args.repeats} and {args.hours}")
    for flag, rev in (("--baseline", args.baseline), ("--current", args.current)):
        if rev is not None and subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                                              cwd=ROOT, capture_output=True).returncode != 0:
            ap.error(f"{flag} {rev!r}: not a commit of this repository")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": export(args.baseline, Path(tmp) / "baseline"),
                 "current": export(args.current, Path(tmp) / "current") if args.current else ROOT}
        jobs = [(i, mode, p, name) for i in range(args.repeats) for mode, p in MODES for name in trees]
        for i, mode, p, name in tqdm(jobs, desc="simulated hours", unit="run"):
            rows.append({"repeat": i, "mode": mode, "tree": name} | measure(trees[name], mode, p, args.hours))
    print(f"\n{'mode':<10} {'tree':<9} {'CPU s (each repeat)':<24} {'GPU-h per wall-s':>17} {'per CPU-s':>10}")
    summary = {}
    for mode, _ in MODES:
        for name in ("baseline", "current"):
            runs = [r for r in rows if r["mode"] == mode and r["tree"] == name]
            gpu_h = 128 * runs[0]["sim_s"] / 3600
            wall = [gpu_h / r["wall_s"] for r in runs]
            cpu = [gpu_h / r["cpu_s"] for r in runs]
            summary[(mode, name)] = statistics.median(r["cpu_s"] for r in runs)
            each = " ".join(f"{r['cpu_s']:.2f}" for r in runs)
            print(f"{mode:<10} {name:<9} {each:<24} "
                  f"{min(wall):7.1f}-{max(wall):<7.1f}  {statistics.median(cpu):9.1f}")
        same = {(r["events"], r["switches"], r["steps"]) for r in rows if r["mode"] == mode}
        print(f"{mode:<10} speed-up (median CPU s) {summary[(mode, 'baseline')] / summary[(mode, 'current')]:.2f}x; "
              f"same result in both trees: {'yes' if len(same) == 1 else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps({"baseline": args.baseline, "current": args.current or "working tree",
                                         "hours": args.hours, "runs": rows}, indent=1))
    if args.png:
        draw(rows, {"baseline": args.baseline, "current": args.current or "current"}, args.png)


def draw(rows: list[dict], labels: dict[str, str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for j, name in enumerate(("baseline", "current")):
        rates = [[128 * r["sim_s"] / 3600 / r["wall_s"] for r in rows if r["mode"] == m and r["tree"] == name]
                 for m, _ in MODES]
        mid = [statistics.median(x) for x in rates]
        err = [[m - min(x) for m, x in zip(mid, rates)], [max(x) - m for m, x in zip(mid, rates)]]
        ax.bar([i + 0.4 * j for i in range(len(MODES))], mid, 0.4, yerr=err, capsize=3,
               label=labels[name])
    ax.axhline(100, color="k", ls="--", lw=1, label="target 100")
    ax.set_xticks([i + 0.2 for i in range(len(MODES))], [m for m, _ in MODES])
    ax.set_ylabel("simulated GPU-h per wall-s (128 GPUs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
