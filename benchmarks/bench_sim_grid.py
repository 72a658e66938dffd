"""The paper's evaluation grid on the cluster simulator (§5.2-5.5, Figures 5-9), and the simulator's speed.

Grid: three presets (math, coding_agent, general_agent) x three staleness settings (on-policy, 2, 8), each run
colocated, as the best static PD ratio and adaptive (our control plane). As in the paper's Figure 7, the static
baseline uses one ratio per task: the best of a sweep over every ratio in the synchronous setting (``--sweep cell``
sweeps every cell instead). Asynchronous runs drop their first ``--warmup`` steps from the mean step time (the first
step of an async run fills the pipeline and is several times longer than the steady state).

Prints the table; writes benchmarks/results/sim_grid/{grid.json, fig5_step_time.png, fig6_idle.png,
fig7_switching.png, fig8_wape.png, fig9_forecast.png, roles.png}. Defaults fit ~10 minutes on 2 shared cores;
the paper-sized run is e.g. ``--agentic-groups 8 --math-groups 32 --sync-steps 3 --async-steps 8 --jobs 2``.

Speed: simulated GPU-hours per wall-clock second for 128 GPUs over one rollout hour (coding agent, staleness 2,
8 groups of 32 per step), per mode.

    python benchmarks/bench_sim_grid.py [--model mimo_v25_pro] [--jobs 2] [--no-speed] [--speed-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from sglang_prorsa.sim import plots
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import simulate, static_ratios

RESULTS = Path(__file__).resolve().parent / "results" / "sim_grid"
PRESETS = ("math", "coding_agent", "general_agent")
STALENESS = (0, 2, 8)
PAPER = {  # the paper's reported ranges, for the printed comparison (§5.2, §5.4, §5.5)
    "agentic speedup over colocation": "1.11x-4.05x (MiMo-V2.5-Pro part of it; DeepSeek-V3.2 2.35x-4.05x)",
    "math normalised step time": "0.86-1.28",
    "switching over best static": "1.0x-1.44x (MiMo-V2.5-Pro)",
    "WAPE": "prefill 5.40-14.37 %, decode 5.19-13.69 %",
    "best static ratios (8 instances)": "math 4:4, coding 5:3, general 3:5",
}


@dataclasses.dataclass(frozen=True)
class Job:
    preset: str
    staleness: int
    mode: str
    prefill_instances: int = 0


def _rollout(args, preset: str, staleness: int) -> RolloutConfig:
    math_task = preset == "math"
    return RolloutConfig(
        preset=preset, staleness=staleness, group_size=8 if math_task else 32,  # §5.1
        groups_per_step=args.math_groups if math_task else args.agentic_groups,
        steps=args.sync_steps if staleness == 0 else args.async_steps, seed=args.seed)


def _run(job_args: tuple[Job, argparse.Namespace]) -> tuple[Job, dict]:
    job, args = job_args
    cluster = ClusterConfig(gpus=args.gpus, mode=job.mode, prefill_instances=job.prefill_instances)
    result = simulate(load_model(args.model), cluster, _rollout(args, job.preset, job.staleness))
    out = result.to_dict()
    steps = result.step_times_s[args.warmup:] if job.staleness and len(result.step_times_s) > args.warmup else result.step_times_s
    out["steady_step_s"] = statistics.fmean(steps) if steps else float("nan")
    return job, out


def _map(jobs: list[Job], args, desc: str) -> dict[Job, dict]:
    done: dict[Job, dict] = {}
    with tqdm(total=len(jobs), desc=desc, unit="run") as bar:
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                for job, out in pool.map(_run, [(j, args) for j in jobs]):
                    done[job] = out
                    bar.update()
        else:
            for j in jobs:
                job, out = _run((j, args))
                done[job] = out
                bar.update()
    return done


def run_grid(args) -> dict:
    model = load_model(args.model)
    ratios = static_ratios(model, ClusterConfig(gpus=args.gpus))
    sweep_cells = [(p, k) for p in PRESETS for k in (STALENESS if args.sweep == "cell" else (0,))]
    sweep = _map([Job(p, k, "static", r) for p, k in sweep_cells for r in ratios], args, "static sweep")
    best = {cell: min((j for j in sweep if (j.preset, j.staleness) == cell), key=lambda j: sweep[j]["steady_step_s"])
            for cell in sweep_cells}
    jobs = []
    for p in PRESETS:
        for k in STALENESS:
            jobs += [Job(p, k, "colocated"), Job(p, k, "adaptive")]
            ratio = best[(p, k) if args.sweep == "cell" else (p, 0)].prefill_instances
            if Job(p, k, "static", ratio) not in sweep:
                jobs.append(Job(p, k, "static", ratio))
    runs = sweep | _map(jobs, args, "grid")
    rows = []
    for p in PRESETS:
        for k in STALENESS:
            ratio = best[(p, k) if args.sweep == "cell" else (p, 0)].prefill_instances
            base = runs[Job(p, k, "colocated")]["steady_step_s"]
            for mode, job in (("colocated", Job(p, k, "colocated")), ("best static", Job(p, k, "static", ratio)),
                              ("adaptive", Job(p, k, "adaptive"))):
                r = runs[job]
                rows.append({
                    "preset": p, "staleness": k, "mode": mode, "label": r["label"], "mean_step_s": r["steady_step_s"],
                    "normalised": r["steady_step_s"] / base, "sync_idle_ratio": r["sync_idle_ratio"],
                    "gpu_idle_ratio": r["gpu_idle_ratio"], "switches": r["switches"],
                    "completion_mean_s": r["completion_mean_s"], "completion_p90_s": r["completion_p90_s"],
                    "wape_prefill": r["wape_prefill"], "wape_decode": r["wape_decode"],
                    "steps": r["steps_done"], "dropped": r["trajectories_dropped"], "wall_s": r["wall_s"]})
    adaptive = {f"{p}/stale{k}": runs[Job(p, k, "adaptive")] for p in ("coding_agent", "general_agent") for k in STALENESS}
    sweep_rows = [{"preset": j.preset, "staleness": j.staleness, "prefill_instances": j.prefill_instances,
                   "mean_step_s": r["steady_step_s"]} for j, r in sweep.items()]
    return {"rows": rows, "sweep": sweep_rows,
            "figure9": {name: r["windows"] for name, r in adaptive.items() if name.endswith("stale8")},
            "roles": {name: r["timeline"] for name, r in adaptive.items()}}


def print_table(rows: list[dict]) -> None:
    pct = lambda v: "   -  " if v is None else f"{100 * v:5.1f}%"  # noqa: E731
    print(f"\n{'preset':<14}{'stale':>6}  {'mode':<12}{'ratio':<7}{'step s':>9}{'norm':>7}{'speedup':>8}"
          f"{'idle sync':>10}{'idle all':>9}{'traj s':>8}{'switch':>7}{'WAPE P':>8}{'WAPE D':>8}")
    for r in rows:
        ratio = r["label"].split(" ")[-1] if r["mode"] == "best static" else ""
        print(f"{r['preset']:<14}{r['staleness']:>6}  {r['mode']:<12}{ratio:<7}{r['mean_step_s']:9.1f}"
              f"{r['normalised']:7.2f}{1 / r['normalised']:7.2f}x{pct(r['sync_idle_ratio']):>10}"
              f"{pct(r['gpu_idle_ratio']):>9}{(r['completion_mean_s'] or 0):8.1f}{r['switches']:7d}"
              f"{pct(r['wape_prefill']):>8}{pct(r['wape_decode']):>8}")
    print("\npaper, for comparison:")
    for k, v in PAPER.items():
        print(f"  {k}: {v}")


def measure_speed(args) -> list[dict]:
    """Simulated GPU-hours per wall-clock second: 128 GPUs, one rollout hour, per mode."""
    model, out = load_model(args.model), []
    rollout = RolloutConfig(preset="coding_agent", staleness=2, group_size=32, groups_per_step=8, steps=10_000)
    for mode, p in (("colocated", 0), ("static", 4), ("adaptive", 0)):
        cluster = ClusterConfig(gpus=128, mode=mode, prefill_instances=p, max_sim_s=3600.0)
        cpu0 = time.process_time()
        r = simulate(model, cluster, rollout)
        cpu = time.process_time() - cpu0
        out.append({"mode": mode, "sim_s": r.makespan_s, "wall_s": r.wall_s, "cpu_s": cpu, "events": r.events,
                    "gpu_hours_per_wall_s": r.sim_gpu_hours_per_wall_s,
                    "gpu_hours_per_cpu_s": 128 * r.makespan_s / 3600 / max(cpu, 1e-9)})
        print(f"speed {mode:<10} 128 GPUs x {r.makespan_s / 3600:.2f} h simulated in {r.wall_s:6.1f} s wall "
              f"({cpu:6.1f} s CPU): {out[-1]['gpu_hours_per_wall_s']:6.1f} GPU-h per wall-s, "
              f"{out[-1]['gpu_hours_per_cpu_s']:6.1f} per CPU-s, {r.events} events")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mimo_v25_pro")
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--agentic-groups", type=int, default=4, help="GRPO groups of 32 per training step")
    ap.add_argument("--math-groups", type=int, default=16, help="GRPO groups of 8 per training step")
    ap.add_argument("--sync-steps", type=int, default=2)
    ap.add_argument("--async-steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1, help="async steps left out of the mean")
    ap.add_argument("--sweep", choices=("preset", "cell"), default="preset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    if not args.speed_only:
        result |= run_grid(args)
        print_table(result["rows"])
        plots.normalised_step_times(result["rows"], args.out / "fig5_step_time.png")
        plots.idle_ratios(result["rows"], args.out / "fig6_idle.png")
        plots.switching_gain(result["rows"], args.out / "fig7_switching.png")
        plots.forecast_wape(result["rows"], args.out / "fig8_wape.png")
        plots.forecast_vs_measured(result["figure9"], args.out / "fig9_forecast.png")
        plots.roles_over_time(result["roles"], args.out / "roles.png")
    if not args.no_speed:
        result["speed"] = measure_speed(args)
    result["wall_s"] = time.perf_counter() - started
    (args.out / "grid.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}/grid.json and PNGs in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
