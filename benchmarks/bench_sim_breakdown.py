"""Where a simulated hour's wall time goes: the real control plane vs the simulator around it.

The speed target of issue 11 is >= 100 simulated GPU-hours per wall-clock second at 128 GPUs. This measures, for the
grid's speed workload (128 GPUs, coding_agent at staleness 2, 8 groups of 32 per step; bench_sim_speed.py), how the
adaptive mode's time splits between

* the control plane, run unmodified as a deployment runs it: lifecycle ingest (``LifecycleControlPlane.ingest``:
  the tracker, the forecast's event statistics), the forecast refresh (``tick`` / ``forecast``) and the role-switch
  controller (``RoleSwitchController.tick`` / ``observe``), timed by wrapping those calls;
* the simulator: everything else (instances, cluster, trainer and plan generation, the driver that feeds the control
  plane);

and what each side alone would run at: the simulator's rate if the control plane were free, and the control plane's
cost per lifecycle event and per refresh. Static and colocated runs (no control plane) are measured beside it.
Each measurement is a fresh process; ``--repeats`` alternate the modes so that load on a shared machine hits each.

    python benchmarks/bench_sim_breakdown.py --repeats 3 [--hours 1] [--json out.json] [--png out.png]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from sglang_prorsa.sim.profiling import PARTS  # the control plane's parts, as the child processes time them

ROOT = Path(__file__).resolve().parents[1]
MODES = (("adaptive", 0), ("static", 4), ("colocated", 0))
ONE_RUN = """
import json, sys, time
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import simulate
from sglang_prorsa.sim.profiling import ControlPlaneTimer

timer = ControlPlaneTimer("events").install()
mode, p, hours = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rollout = RolloutConfig(preset="coding_agent", staleness=2, group_size=32, groups_per_step=8, steps=10_000)
cluster = ClusterConfig(gpus=128, mode=mode, prefill_instances=p, max_sim_s=3600.0 * hours)
cpu0, wall0 = time.process_time(), time.perf_counter()
r = simulate(load_model("mimo_v25_pro"), cluster, rollout)
print(json.dumps({"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0, "sim_s": r.makespan_s,
                  "sim_events": r.events, "switches": r.switches} | timer.report()))
"""


def measure(mode: str, p: int, hours: float) -> dict:
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", ONE_RUN, mode, str(p), str(hours)], env=env,
                         cwd=tempfile.gettempdir(), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rate(run: dict, seconds: float) -> float:
    """Simulated GPU-hours (128 GPUs) per second of ``seconds``."""
    return 128 * run["sim_s"] / 3600 / seconds if seconds > 0 else float("inf")


def summarise(rows: list[dict]) -> list[str]:
    lines = [f"{'mode':<10} {'CPU s':>6} {'GPU-h/CPU-s':>12} {'control plane':>14} {'simulator':>10} "
             f"{'sim alone GPU-h/s':>18}"]
    for mode, _ in MODES:
        runs = [r for r in rows if r["mode"] == mode]
        cp = [sum(r[k] for k in PARTS) for r in runs]
        sim = [r["cpu_s"] - c for r, c in zip(runs, cp)]
        lines.append(f"{mode:<10} {statistics.median(r['cpu_s'] for r in runs):6.2f} "
                     f"{statistics.median(rate(r, r['cpu_s']) for r in runs):12.1f} "
                     f"{statistics.median(cp):13.2f}s {statistics.median(sim):9.2f}s "
                     f"{statistics.median(rate(r, s) for r, s in zip(runs, sim)):18.1f}")
    adaptive = [r for r in rows if r["mode"] == "adaptive"]
    if adaptive:
        med = {k: statistics.median(r[k] for r in adaptive) for k in (*PARTS, "cpu_s", "events", "refreshes")}
        hours = adaptive[0]["sim_s"] / 3600
        share = {k: med[k] / med["cpu_s"] for k in PARTS}
        lines.append(f"adaptive: control plane {100 * sum(share.values()):.0f} % of CPU (ingest "
                     f"{100 * share['ingest']:.0f} %,"
                     f" refresh {100 * share['refresh']:.0f} %, controller {100 * share['controller']:.0f} %); "
                     f"{med['events'] / hours:.0f} lifecycle events and {med['refreshes'] / hours:.0f} refreshes per "
                     f"simulated hour: "
                     f"{1e6 * med['ingest'] / max(med['events'], 1):.1f} us per event, "
                     f"{1e3 * med['refresh'] / max(med['refreshes'], 1):.1f} ms per refresh")
        lines.append(f"the control plane alone caps adaptive at "
                     f"{statistics.median(rate(r, sum(r[k] for k in PARTS)) for r in adaptive):.0f} GPU-h per CPU-s "
                     f"(target 100)")
    return lines


def draw(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (mode, _) in enumerate(MODES):
        runs = [r for r in rows if r["mode"] == mode]
        bottom = 0.0
        for part in PARTS:
            value = statistics.median(r[part] for r in runs)
            ax.bar(i, value, 0.6, bottom=bottom, color={"ingest": "C1", "refresh": "C2", "controller": "C3"}[part],
                   label=f"control plane: {part}" if i == 0 else None)
            bottom += value
        sim = statistics.median(r["cpu_s"] - sum(r[k] for k in PARTS) for r in runs)
        ax.bar(i, sim, 0.6, bottom=bottom, color="C0", label="simulator" if i == 0 else None)
    hours = rows[0]["sim_s"] / 3600
    ax.axhline(128 * hours / 100, color="k", ls="--", lw=1, label="CPU s allowed by the target (100 GPU-h/s)")
    ax.set_xticks(range(len(MODES)), [m for m, _ in MODES])
    ax.set_ylabel(f"CPU s per {hours:g} simulated h (128 GPUs)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours per measurement")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None, help="stacked bars: control plane parts and simulator, per mode")
    args = ap.parse_args()
    if args.repeats < 1 or not args.hours > 0:
        ap.error(f"--repeats must be >= 1 and --hours > 0, got {args.repeats} and {args.hours}")
    rows = []
    jobs = [(i, mode, p) for i in range(args.repeats) for mode, p in MODES]
    for i, mode, p in tqdm(jobs, desc="simulated hours", unit="run"):
        rows.append({"repeat": i, "mode": mode} | measure(mode, p, args.hours))
    print("\n" + "\n".join(summarise(rows)))
    if args.json:
        args.json.write_text(json.dumps({"hours": args.hours, "runs": rows}, indent=1))
    if args.png:
        draw(rows, args.png)


if __name__ == "__main__":
    main()
