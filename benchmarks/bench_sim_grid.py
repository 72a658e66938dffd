"""The paper's evaluation grid on the cluster simulator (§5.2-5.5, Figures 5-9), as a function of load, with seeds.

Grid: three tasks (math, coding_agent, general_agent) x three staleness settings (on-policy, 2, 8), at several loads
(GRPO groups per training step) and seeds. In every (cell, load, seed) the simulator runs colocation, *every* static PD
ratio and adaptive (our control plane); the best static ratio is chosen per cell and load by its mean step time over the
seeds. A load is "GPU-bound" when doubling it multiplies the best static step time by >= 1.5 (the step is waiting for
GPUs, not for tools, rewards and the slowest trajectory); the acceptance check (adaptive <= 1.02 x best static) is read
at those loads. Each row also sets adaptive beside the ratios a user would pick without simulating every one
(sim/baselines.py: the paper's MiMo-V2.5-Pro optima scaled to the cluster, 1:1, and slime's flow balance from the
workload's means), read off the same static runs. Asynchronous runs with staleness k launch (k + 1) steps' worth of
groups at once and reach a steady pipeline only after about k + 1 steps: they run k + 1 + ``--async-measured`` steps,
and their steady step time is the batch over the rate trajectories finished after the warm-up
(SimResult.steady_step_s).

``--shift`` adds the shifting-mix experiment: a mixed batch of math (all requests at the step's start, minutes of
decode) and a long-document agent (context, hence prefill per prefix-cache miss, growing turn by turn), whose
prefill:decode mix moves from decode-bound to prefill-bound inside a step, so no single static ratio fits the step.

Prints the tables; writes <out>/{grid.json, README.md (markdown tables + ASSUMED parameters), fig5_step_time.png,
fig6_idle.png, fig7_switching.png, fig8_wape.png, fig9_forecast.png, roles.png, load_sweep.png}.

Speed: simulated GPU-hours per wall-clock second and per CPU second, 128 GPUs over one rollout hour (coding agent,
staleness 2, 8 groups of 32 per step), per mode, repeated ``--speed-repeats`` times.

    python benchmarks/bench_sim_grid.py --model mimo_v25_pro --seeds 2 --jobs 2 [--shift] [--no-speed]
    python benchmarks/bench_sim_grid.py --model deepseek_v32 --out benchmarks/results/sim_grid_deepseek --jobs 2
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

from sglang_prorsa.sim import baselines, plots
from sglang_prorsa.sim.config import PLANNERS, ClusterConfig, RolloutConfig, assumed_parameters, load_model
from sglang_prorsa.sim.metrics import interval95
from sglang_prorsa.sim.paper import paper_optima_text
from sglang_prorsa.sim.report import DEFAULT_GRID, row_key
from sglang_prorsa.sim.runner import simulate, static_ratios
from sglang_prorsa.sim.trainer import clear_plan_cache
from sglang_prorsa.sim.workloads import default_group_size

RESULTS = Path(__file__).resolve().parent / "results" / "sim_grid"
PRESETS, STALENESS = DEFAULT_GRID["presets"], DEFAULT_GRID["staleness"]
# Groups per step per (task, staleness): a load and its half, sized so the top one is GPU-bound (the batch in flight
# is about (staleness + 1) x groups per step) and each grid fits a few minutes of 2 cores.
LOADS = {("math", 0): (128, 256), ("math", 2): (32, 64), ("math", 8): (8, 16),
         ("general_agent", 0): (32, 64), ("general_agent", 2): (16, 32), ("general_agent", 8): (4, 8),
         ("coding_agent", 0): (32, 64), ("coding_agent", 2): (8, 16), ("coding_agent", 8): (2, 4)}
SHIFT = (("math+document_agent", 0, 16), ("math+document_agent", 0, 32), ("math+document_agent", 2, 12))
GPU_BOUND_GROWTH = 1.5  # step-time growth over a doubling of load that counts as GPU-bound
PAPER = {  # the paper's reported ranges, for the printed comparison (§5.2, §5.4, §5.5)
    "agentic speedup over colocation": "1.11x-4.05x (DeepSeek-V3.2 2.35x-4.05x)",
    "math normalised step time": "0.86-1.28",
    "switching over best static": "1.0x-1.44x (MiMo-V2.5-Pro)",
    "WAPE": "prefill 5.40-14.37 %, decode 5.19-13.69 %",
    "best static ratios (8 instances)": paper_optima_text(),
}


@dataclasses.dataclass(frozen=True)
class Job:
    preset: str
    staleness: int
    groups: int
    seed: int
    mode: str
    prefill_instances: int = 0
    decode_shape: str = "same"
    keep_series: bool = False  # adaptive runs of the plotted cells keep timeline and windows


def _run(job_args: tuple[Job, dict]) -> tuple[Job, dict]:
    job, opts = job_args
    model = load_model(opts["model"])
    cluster = ClusterConfig(gpus=opts["gpus"], mode=job.mode, prefill_instances=job.prefill_instances,
                            decode_shape=job.decode_shape, max_sim_s=opts["max_sim_s"],
                            planner=opts.get("planner", "guarded"), move_review=opts.get("move_review", False))
    warm = job.staleness + 1 if job.staleness else 0
    rollout = RolloutConfig(preset=job.preset, staleness=job.staleness, group_size=default_group_size(job.preset),
                            groups_per_step=job.groups, steps=opts["sync_steps"] if job.staleness == 0
                            else warm + opts["async_measured"], seed=job.seed)
    cpu0 = time.process_time()
    result = simulate(model, cluster, rollout)
    out = result.to_dict()
    out["cpu_s"] = time.process_time() - cpu0
    out["steady_step_s"] = result.steady_step_s(warm) if result.steps_done == rollout.steps else float("inf")
    out["finish_times"] = []
    if not job.keep_series:
        out["timeline"], out["windows"] = [], []
    return job, out


def reused_runs(folders: list[Path]) -> dict[Job, dict]:
    """Colocated and static runs of earlier grids (their runs_*.json): they do not depend on the controller, so
    a grid rerun for a controller change needs only its adaptive runs. Adaptive runs are never reused."""
    out: dict[Job, dict] = {}
    for path in (p for folder in folders for p in sorted(folder.glob("runs_*.json"))):
        for entry in json.loads(path.read_text()):
            job = Job(**{k: v for k, v in entry.items() if k != "result"})
            if job.mode != "adaptive":
                out[job] = entry["result"]
    return out


def _map(jobs: list[Job], opts: dict, desc: str) -> dict[Job, dict]:
    reused = opts.get("reused", {})
    done: dict[Job, dict] = {j: reused[j] for j in jobs if j in reused}
    jobs = [j for j in jobs if j not in done]
    if done:
        print(f"{desc}: {len(done)} colocated / static runs reused from --reuse, {len(jobs)} to run")
    opts = {k: v for k, v in opts.items() if k != "reused"}  # not shipped to every worker
    with tqdm(total=len(jobs), desc=desc, unit="run") as bar:
        if opts["jobs"] > 1:
            with ProcessPoolExecutor(opts["jobs"]) as pool:
                for job, out in pool.map(_run, [(j, opts) for j in jobs], chunksize=1):
                    done[job] = out
                    bar.update()
        else:
            for j in jobs:
                job, out = _run((j, opts))
                done[job] = out
                bar.update()
    return done


def cell_jobs(preset: str, staleness: int, groups: int, seeds: list[int], ratios: list[int], shape: str = "same",
              keep: bool = False) -> list[Job]:
    jobs = [Job(preset, staleness, groups, s, "colocated") for s in seeds]
    jobs += [Job(preset, staleness, groups, s, "static", p, shape) for s in seeds for p in ratios]
    jobs += [Job(preset, staleness, groups, s, "adaptive", 0, shape, keep and s == seeds[0]) for s in seeds]
    return jobs


def summarise(runs: dict[Job, dict], preset: str, staleness: int, groups: int, seeds: list[int], ratios: list[int],
              shape: str = "same", picks: dict | None = None) -> dict:
    """One row per (cell, load): each mode's mean step time over seeds, the best static ratio, adaptive vs it, and
    adaptive vs each baseline in ``picks`` (``cell_baselines``: ratios a user would pick without simulating them all;
    a lookup among the static runs, which cover every ratio)."""
    def of(mode, p=0, s=None):
        return [runs[Job(preset, staleness, groups, x, mode, p, shape if mode != "colocated" else "same", keep)]
                for x in (seeds if s is None else [s]) for keep in (False, True)
                if Job(preset, staleness, groups, x, mode, p, shape if mode != "colocated" else "same", keep) in runs]

    mean = lambda rs: statistics.fmean(r["steady_step_s"] for r in rs)  # noqa: E731
    statics = {p: mean(of("static", p)) for p in ratios}
    best = min(statics, key=lambda p: statics[p] if statics[p] == statics[p] else float("inf"))  # NaN last
    colo, adaptive, best_runs = of("colocated"), of("adaptive"), of("static", best)
    by_mode = (("colocated", colo), ("best static", best_runs), ("adaptive", adaptive))
    per_seed = [a["steady_step_s"] / b["steady_step_s"] if b["steady_step_s"] > 0 else float("nan")
                for a, b in zip(adaptive, best_runs)]
    steps = [len(r["step_times_s"]) for r in adaptive]
    return {
        "preset": preset, "staleness": staleness, "groups": groups, "seeds": len(seeds), "decode_shape": shape,
        "colocated_s": mean(colo), "best_static": f"{best}:{best_runs[0]['decode_instances']}",
        "best_static_prefill": best, "best_static_s": statics[best], "adaptive_s": mean(adaptive),
        "adaptive_over_best": mean(adaptive) / statics[best] if statics[best] > 0 else float("nan"),
        "adaptive_over_best_seeds": per_seed,
        "adaptive_over_best_ci95": interval95(per_seed),
        # colocated did not finish within --max-sim-s (inf): no ratio, not 0
        "adaptive_over_colocated": mean(adaptive) / mean(colo) if 0 < mean(colo) < float("inf") else float("nan"),
        "statics": {str(p): v for p, v in statics.items()},
        "switches_per_step": statistics.fmean(r["switches"] / max(n, 1) for r, n in zip(adaptive, steps)),
        "switches": statistics.fmean(r["switches"] for r in adaptive),
        "switches_paid_share": (sum(r["switches_paid"] for r in adaptive) / sum(r["switches"] for r in adaptive)
                                if sum(r["switches"] for r in adaptive) else None),
        "wape_prefill": statistics.fmean(r["wape_prefill"] for r in adaptive if r["wape_prefill"] is not None)
        if any(r["wape_prefill"] is not None for r in adaptive) else None,
        "wape_decode": statistics.fmean(r["wape_decode"] for r in adaptive if r["wape_decode"] is not None)
        if any(r["wape_decode"] is not None for r in adaptive) else None,
        "interference": {m: statistics.fmean(r["interference_idle_ratio"] for r in rs) for m, rs in by_mode},
        "imbalance": {m: statistics.fmean(r["imbalance_idle_ratio"] for r in rs) for m, rs in by_mode},
        "gpu_idle": {m: statistics.fmean(r["gpu_idle_ratio"] for r in rs) for m, rs in by_mode},
        "prefix_hit": {m: statistics.fmean(r["prefix_hit_ratio"] for r in rs) for m, rs in by_mode},
        "completion_mean_s": {m: statistics.fmean(r["completion_mean_s"] or 0 for r in rs)
                              if all("completion_mean_s" in r for r in rs) else None  # reused runs may lack it
                              for m, rs in by_mode},
        # Trajectory time outside the engines (the workload's tools, sandbox, reward) and inside them
        **{f"completion_{part}_s": {m: statistics.fmean(r[f"completion_{part}_mean_s"] for r in rs)
                                    if all(r.get(f"completion_{part}_mean_s") is not None for r in rs) else None
                                    for m, rs in by_mode}
           for part in ("environment", "engine")},
        "hold_reasons": _sum_dicts(r["hold_reasons"] for r in adaptive),
        **({"baselines": _versus(picks, statics, mean(adaptive))} if picks is not None else {}),
        "cpu_s": sum(r["cpu_s"] for r in runs.values()
                     if (r["preset"], r["staleness"], r.get("groups_per_step", r.get("groups"))) ==
                     (preset, staleness, groups)),
    }


def cell_baselines(args, preset: str, shape: str = "same") -> dict:
    """The baselines of sim/baselines.py for a workload on the grid's cluster, and the flow balance's quantities."""
    model = load_model(args.model)
    cluster = ClusterConfig(gpus=args.gpus, mode="static", decode_shape=shape)
    flow = baselines.flow_balance(model, preset, cluster)
    return {"paper optimum": baselines.paper_optimum(model, preset, cluster),
            "1:1": baselines.one_to_one(model, cluster), "flow balance": flow.baseline, "flow": flow}


def _versus(picks: dict, statics: dict[int, float], adaptive_s: float) -> dict:
    """Each baseline's split, its static step time and adaptive / it (None: no split, or not among the runs)."""
    out = {}
    for name in baselines.BASELINES:
        pick = picks[name]
        static_s = statics.get(pick.prefill_instances) if pick.prefill_instances is not None else None
        ratio = adaptive_s / static_s if static_s is not None and 0 < static_s < float("inf") else None
        out[name] = pick.to_dict() | {"static_s": static_s, "adaptive_over": ratio}
    out["flow balance"]["flow"] = {k: v for k, v in picks["flow"].to_dict().items() if k != "baseline"}
    return out


def _sum_dicts(dicts) -> dict:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def mark_gpu_bound(rows: list[dict]) -> None:
    """A load is GPU-bound when the best static step time grew >= GPU_BOUND_GROWTH x over half that load."""
    by_cell: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        by_cell.setdefault((r["preset"], r["staleness"], r["decode_shape"]), {})[r["groups"]] = r
    for loads in by_cell.values():
        for g, r in loads.items():
            half = loads.get(g // 2)
            r["growth_over_half_load"] = r["best_static_s"] / half["best_static_s"] if half else None
            r["gpu_bound"] = half is not None and r["growth_over_half_load"] >= GPU_BOUND_GROWTH


def grid_ratios(args, picks: dict, shape: str = "same") -> list[int]:
    """The static splits to run: every one, or ``--ratios`` and each baseline's pick."""
    every = static_ratios(load_model(args.model), ClusterConfig(gpus=args.gpus, mode="static", decode_shape=shape))
    if not args.ratios:
        return every
    wanted = set(args.ratios) | {b.prefill_instances for p in picks.values() for name, b in p.items()
                                 if name in baselines.BASELINES and b.prefill_instances is not None}
    return [p for p in every if p in wanted]


def run_grid(args, opts: dict) -> dict:
    seeds = list(range(args.seed, args.seed + args.seeds))
    picks = {p: cell_baselines(args, p) for p in args.presets}
    ratios = grid_ratios(args, picks)
    cells = [(p, k) for p in args.presets for k in args.staleness]
    jobs, plan = [], []
    for p, k in cells:
        loads = args.loads.get(f"{p}/{k}", args.loads.get(p, LOADS[(p, k)]))
        for g in loads:
            top = g == max(loads)
            jobs += cell_jobs(p, k, g, seeds, ratios, keep=top)
            plan.append((p, k, g))
    runs = _map(jobs, opts, f"{args.model} grid")
    _checkpoint(args.out / "runs_grid.json", runs)
    rows = [summarise(runs, p, k, g, seeds, ratios, picks=picks[p]) for p, k, g in plan]
    mark_gpu_bound(rows)
    series = {f"{j.preset}/{'sync' if j.staleness == 0 else f'stale{j.staleness}'}": r
              for j, r in runs.items() if j.keep_series}
    return {"rows": rows, "runs": [_slim(j, r) for j, r in runs.items()],
            "figure9": {n: r["windows"] for n, r in series.items() if n.endswith("stale8") and "math" not in n},
            "roles": {n: r["timeline"] for n, r in series.items() if "math" not in n}}


def run_shift(args, opts: dict) -> list[dict]:
    model = load_model(args.model)
    seeds = list(range(args.seed, args.seed + args.seeds))
    ratios = static_ratios(model, ClusterConfig(gpus=args.gpus, mode="static"))
    jobs = [j for w, k, g in SHIFT for j in cell_jobs(w, k, g, seeds, ratios)]
    runs = _map(jobs, opts, f"{args.model} shifting mix")
    _checkpoint(args.out / "runs_shift.json", runs)
    picks = {w: cell_baselines(args, w) for w in dict.fromkeys(w for w, _, _ in SHIFT)}
    return [summarise(runs, w, k, g, seeds, ratios, picks=picks[w]) for w, k, g in SHIFT]


WIDE = (("coding_agent", 0, 32), ("coding_agent", 2, 12))


def run_wide(args, opts: dict) -> list[dict]:
    """Stage-specific parallelism (§3.2, §5.3): decode instances at the model's wide shape (EP32 for MiMo)."""
    model = load_model(args.model)
    seeds = list(range(args.seed, args.seed + args.seeds))
    ratios = static_ratios(model, ClusterConfig(gpus=args.gpus, mode="static", decode_shape="wide"))
    jobs = [j for w, k, g in WIDE for j in cell_jobs(w, k, g, seeds, ratios, shape="wide")]
    runs = _map(jobs, opts, f"{args.model} wide decode")
    _checkpoint(args.out / "runs_wide.json", runs)
    picks = {w: cell_baselines(args, w, "wide") for w in dict.fromkeys(w for w, _, _ in WIDE)}
    return [summarise(runs, w, k, g, seeds, ratios, shape="wide", picks=picks[w]) for w, k, g in WIDE]


def _checkpoint(path: Path, runs: dict[Job, dict]) -> None:
    """Every run's result, before any summary can fail on it."""
    path.write_text(json.dumps([dataclasses.asdict(j) | {"result": _slim(j, r)} for j, r in runs.items()],
                               default=str))


def _slim(job: Job, r: dict) -> dict:
    keep = ("mode", "prefill_instances", "decode_instances", "seed", "steady_step_s", "step_times_s", "switches",
            "switches_paid", "interference_idle_ratio", "imbalance_idle_ratio", "gpu_idle_ratio", "prefix_hit_ratio",
            "wape_prefill", "wape_decode", "cpu_s", "wall_s", "retractions", "switches_per_step", "completion_mean_s",
            "completion_environment_mean_s", "completion_engine_mean_s",
            "hold_reasons")
    return {"preset": job.preset, "staleness": job.staleness, "groups": job.groups} | {k: r[k] for k in keep if k in r}


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'workload':<20}{'stale':>6}{'groups':>7} {'GPU-bnd':>7}{'colo s':>9}{'best':>6}{'static s':>10}"
          f"{'adapt s':>9}{'ad/best':>8}{'(seeds)':>16}{'ad/colo':>8}{'sw/step':>8}{'paid':>6}{'WAPE P/D':>12}"
          f"{'ad/paper':>9}{'ad/1:1':>8}{'ad/flow':>8}")
    for r in rows:
        versus = [(r.get("baselines") or {}).get(name, {}).get("adaptive_over") for name in baselines.BASELINES]
        seeds = "/".join(f"{x:.3f}" for x in r["adaptive_over_best_seeds"])
        paid = "-" if r["switches_paid_share"] is None else f"{100 * r['switches_paid_share']:.0f}%"
        wape = ("-" if r["wape_prefill"] is None else
                f"{100 * r['wape_prefill']:.0f}/{100 * (r['wape_decode'] or 0):.0f}%")
        bound = {True: "yes", False: "no", None: "-"}[r.get("gpu_bound")]
        print(f"{r['preset']:<20}{r['staleness']:>6}{r['groups']:>7} {bound:>7}{r['colocated_s']:9.0f}"
              f"{r['best_static']:>6}{r['best_static_s']:10.0f}{r['adaptive_s']:9.0f}{r['adaptive_over_best']:8.3f} "
              f"{seeds:>16}{r['adaptive_over_colocated']:8.2f}{r['switches_per_step']:8.1f}{paid:>6}{wape:>12}"
              + "".join(f"{'-' if v is None else f'{v:.3f}':>{w}}" for v, w in zip(versus, (9, 8, 8))))


def measure_speed(args) -> list[dict]:
    """Simulated GPU-hours per wall-clock second and per CPU second: 128 GPUs, one rollout hour, per mode."""
    model, out = load_model(args.model), []
    rollout = RolloutConfig(preset="coding_agent", staleness=2, group_size=32, groups_per_step=8, steps=10_000)
    for mode, p in (("colocated", 0), ("static", 4), ("adaptive", 0)):
        for _ in range(args.speed_repeats):
            cluster = ClusterConfig(gpus=128, mode=mode, prefill_instances=p, max_sim_s=3600.0)
            clear_plan_cache()  # each measurement draws its own workload
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


def merge_grids(folders: list[Path]) -> dict:
    """One result from several runs' grid.json (one model): rows, runs and plotted series side by side, each
    run's command kept (``merged_from``; a merged grid brings the commands it was merged from). A cell and load in
    more than one grid is kept once (the first; runs are deterministic, so the copies agree), and GPU-bound is marked
    again over the merged load ladder."""
    parts = [json.loads((folder / "grid.json").read_text()) for folder in folders]
    models = {p["model"] for p in parts}
    if len(models) != 1:
        raise SystemExit(f"--merge: the grids are of different models {sorted(models)}")
    merged = {"model": models.pop(), "args": parts[0]["args"], "rows": [], "runs": [], "figure9": {}, "roles": {},
              "merged_from": [a for p in parts for a in p.get("merged_from", [p["args"]])],
              "wall_s": sum(p.get("wall_s", 0.0) for p in parts)}
    rows, runs = {}, {}
    for p in parts:
        for r in p.get("rows", []):
            rows.setdefault(row_key(r), r)
        for r in p.get("runs", []):
            runs.setdefault(tuple(r[k] for k in ("preset", "staleness", "groups", "mode", "prefill_instances",
                                                 "decode_instances", "seed")), r)
        merged["figure9"] |= p.get("figure9", {})
        merged["roles"] |= p.get("roles", {})
    order = {name: i for i, name in enumerate(PRESETS)}
    merged["rows"] = [rows[k] for k in sorted(rows, key=lambda k: (order.get(k[0], len(order)), k[0], *k[1:]))]
    merged["runs"] = list(runs.values())
    mark_gpu_bound(merged["rows"])
    return merged


def write_readme(path: Path, result: dict, model_name: str) -> None:
    from sglang_prorsa.sim import report

    path.write_text(report.markdown(result, model_name, assumed_parameters(load_model(model_name)), PAPER))


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every flag checked before the first run (a grid takes minutes): a usage error names the flag (exit 2)."""
    for name in ("gpus", "seeds", "sync_steps", "async_measured", "jobs", "speed_repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.seed < 0 or any(k < 0 for k in args.staleness) or not args.max_sim_s > 0:
        ap.error("--seed and --staleness must be >= 0 and --max-sim-s > 0")
    try:
        model = load_model(args.model)
    except FileNotFoundError as exc:
        ap.error(f"--model: {exc}")
    splits = static_ratios(model, ClusterConfig(gpus=args.gpus, mode="static"))
    bad = [p for p in args.ratios if p not in splits]
    if bad:
        ap.error(f"--ratios {bad[0]}: not a static split of {args.gpus} GPUs for {args.model} "
                 f"(prefill instances {splits[0]}-{splits[-1]})")
    loads = {}
    for item in args.loads:
        key, eq, values = item.partition("=")
        task, _, staleness = key.partition("/")
        try:
            groups = tuple(int(x) for x in values.split(","))
            if not eq or task not in PRESETS or (staleness and int(staleness) < 0) or min(groups) < 1:
                raise ValueError
        except ValueError:
            ap.error(f"--loads {item!r}: expected TASK=G1,G2 or TASK/STALENESS=G1,G2 with TASK in {list(PRESETS)} "
                     "and groups >= 1")
        loads[key] = groups
    args.loads = loads
    unknown = [p for p in args.presets if p not in PRESETS]
    if unknown:
        ap.error(f"--presets: unknown {unknown[0]!r}; the grid's tasks are {list(PRESETS)}")
    for p_, k in ((p_, k) for p_ in args.presets for k in args.staleness):
        if (p_, k) not in LOADS and f"{p_}/{k}" not in loads and p_ not in loads:
            ap.error(f"no default load for {p_} at staleness {k}: give one with --loads {p_}/{k}=G1,G2")
    for folder in args.reuse:
        if not any(folder.glob("runs_*.json")):
            ap.error(f"--reuse {folder}: no runs_*.json there (a grid's --out folder keeps them)")
    for folder in args.merge:
        if not (folder / "grid.json").is_file():
            ap.error(f"--merge {folder}: no grid.json there")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mimo_v25_pro")
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--presets", nargs="+", default=list(PRESETS))
    ap.add_argument("--staleness", nargs="+", type=int, default=list(STALENESS))
    ap.add_argument("--loads", nargs="*", default=[],
                    help="override per task or per task and staleness, e.g. math=16,32 coding_agent/8=4,8")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--ratios", nargs="+", type=int, default=[], metavar="P",
                    help="static runs only at these prefill-instance counts (plus each baseline's pick), not at "
                         "every split: for many seeds of a model with many splits; the best static is then the "
                         "best of these")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sync-steps", type=int, default=1)
    ap.add_argument("--async-measured", type=int, default=6,
                    help="async steps averaged after the staleness + 1 warm-up steps")
    ap.add_argument("--max-sim-s", type=float, default=10 * 3600.0,
                    help="safety stop per run (coding at staleness 2, 16 groups, needs > 4 h)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shift", action="store_true", help="also run the shifting-mix experiment")
    ap.add_argument("--shift-only", action="store_true")
    ap.add_argument("--wide", action="store_true", help="also run coding with stage-specific (wide) decode instances")
    ap.add_argument("--planner", choices=PLANNERS, default="guarded",
                    help="adaptive runs' planner: guarded, guarded with the wait rule (waits), or the paper's")
    ap.add_argument("--move-review", action="store_true",
                    help="adaptive runs undo each move after which decode's completions fell (review.py; not a default)")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--speed-only", action="store_true",
                    help="measure only the speed; an existing grid.json in --out keeps its grid, only 'speed' changes")
    ap.add_argument("--speed-repeats", type=int, default=3)
    ap.add_argument("--reuse", nargs="+", type=Path, default=[], metavar="DIR",
                    help="take colocated and static runs from earlier grids' runs_grid.json (same model, seeds and "
                         "settings) and run only what is missing: the adaptive runs after a controller change")
    ap.add_argument("--merge", nargs="+", type=Path, default=[], metavar="DIR",
                    help="combine the grids of earlier runs (their --out folders) into one report in --out; runs "
                         "nothing")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    check_args(ap, args)
    args.out.mkdir(parents=True, exist_ok=True)
    opts = {"model": args.model, "gpus": args.gpus, "sync_steps": args.sync_steps,
            "async_measured": args.async_measured, "max_sim_s": args.max_sim_s, "jobs": args.jobs,
            "planner": args.planner, "move_review": args.move_review,
            "reused": reused_runs(args.reuse)}
    started = time.perf_counter()
    result: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "model": args.model}
    previous = args.out / "grid.json"
    if args.speed_only and previous.exists():  # re-measure the speed of an existing grid's simulator
        result = json.loads(previous.read_text()) | {"speed_args": result["args"]}
    if args.merge:
        result = merge_grids(args.merge)
        print_rows(f"{result['model']}: merged grid", result["rows"])
    elif not (args.speed_only or args.shift_only):
        result |= run_grid(args, opts)
        print_rows(f"{args.model}: grid (mean over {args.seeds} seeds)", result["rows"])
    if "rows" in result and not args.speed_only:
        (args.out / "grid.json").write_text(json.dumps(result, indent=1, default=str))  # kept if a plot fails
        plots.normalised_step_times(result["rows"], args.out / "fig5_step_time.png")
        plots.idle_ratios(result["rows"], args.out / "fig6_idle.png")
        plots.switching_gain(result["rows"], args.out / "fig7_switching.png")
        plots.forecast_wape(result["rows"], args.out / "fig8_wape.png")
        plots.forecast_vs_measured(result["figure9"], args.out / "fig9_forecast.png")
        plots.roles_over_time(result["roles"], args.out / "roles.png")
        plots.load_sweep(result["rows"], args.out / "load_sweep.png")
    if args.shift or args.shift_only:
        result["shift"] = run_shift(args, opts)
        print_rows(f"{args.model}: shifting mix (mean over {args.seeds} seeds)", result["shift"])
    if args.wide:
        result["wide"] = run_wide(args, opts)
        print_rows(f"{args.model}: decode at the wide shape (mean over {args.seeds} seeds)", result["wide"])
    if not (args.no_speed or args.shift_only or args.merge):
        result["speed"] = measure_speed(args)
    if not args.merge:
        result["speed_wall_s" if "speed_args" in result else "wall_s"] = time.perf_counter() - started
    (args.out / "grid.json").write_text(json.dumps(result, indent=1, default=str))
    write_readme(args.out / "README.md", result, result["model"])
    print("\npaper, for comparison:")
    for k, v in PAPER.items():
        print(f"  {k}: {v}")
    print(f"\nwrote {args.out}/grid.json, README.md and PNGs in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
