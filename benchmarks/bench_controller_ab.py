#!/usr/bin/env python3
"""A controller or simulator change, A/B on one simulator cell over many seeds: adaptive on a baseline revision and on
the working tree, both against the static ratios of the same seeds, in one run.

Each run is one process with its tree first on the module path (the baseline tree is ``git archive`` of
``--baseline``), so both sides run the code of their revision with the same seeds, settings and measurement: the
steady step time after ``staleness + 1`` warm-up steps, as ``bench_sim_grid.py`` measures it. The best static ratio is
the one with the fastest mean over the seeds (the grid's choice), among ``--static`` (every ratio by default). Static
runs use the working tree only; ``--check-static`` also runs them on the baseline tree for the first seed and
requires identical results, for a change meant to touch the adaptive path only.

Prints per seed adaptive / best static for both trees, their means with 95 % t-intervals, and the paired change
(current / baseline per seed); writes ``--json`` and a PNG of the per-seed ratios.

    python benchmarks/bench_controller_ab.py --baseline HEAD --preset coding_agent --staleness 2 --groups 16 \\
        --seeds 12 --jobs 2 --json benchmarks/results/controller_ab/ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sim_speed import export  # noqa: E402  (the baseline tree, as the speed benchmark builds it)

from sglang_prorsa.sim.metrics import interval95  # noqa: E402  (the grid's 95 % t-interval of the mean)

ONE_RUN = """
import json, sys
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.workloads import default_group_size
from sglang_prorsa.sim.runner import simulate
a = json.loads(sys.argv[1])
warm = a["staleness"] + 1 if a["staleness"] else 0
rollout = RolloutConfig(preset=a["preset"], staleness=a["staleness"], group_size=default_group_size(a["preset"]),
                        groups_per_step=a["groups"], steps=1 if a["staleness"] == 0 else warm + a["measured"],
                        seed=a["seed"])
cluster = ClusterConfig(gpus=a["gpus"], mode=a["mode"], prefill_instances=a["p"], max_sim_s=a["max_sim_s"])
r = simulate(load_model(a["model"]), cluster, rollout)
done = r.steps_done == rollout.steps
print(json.dumps({"steady_step_s": r.steady_step_s(warm) if done else None, "switches": r.switches,
                  "steps": r.steps_done, "events": r.events, "instances": r.instances}))
"""


def run_one(tree: Path, spec: dict) -> dict:
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", ONE_RUN, json.dumps(spec)], env=env, cwd=tempfile.gettempdir(),
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def best_static(static: dict[int, list[float | None]]) -> int:
    """The prefill count whose runs finished every seed with the fastest mean steady step (the grid's choice)."""
    finished = {p: xs for p, xs in static.items() if xs and all(x is not None for x in xs)}
    if not finished:
        raise ValueError("no static ratio finished every seed")
    return min(finished, key=lambda p: statistics.fmean(finished[p]))  # type: ignore[arg-type]


def ratios(adaptive: list[float | None], static: list[float | None]) -> list[float]:
    """Per seed adaptive / static; an adaptive run that did not finish its steps counts as infinitely slow."""
    return [float("inf") if a is None else a / s for a, s in zip(adaptive, static) if s]


def summary(values: list[float]) -> dict:
    finite = [v for v in values if v != float("inf")]
    return {"per_seed": values, "mean": statistics.fmean(values) if values else None,
            "interval95": interval95(finite) if len(finite) == len(values) else None,
            "unfinished": len(values) - len(finite)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="HEAD", help="git revision of side A (default HEAD: the last commit)")
    ap.add_argument("--model", default="mimo_v25_pro")
    ap.add_argument("--preset", default="coding_agent")
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--groups", type=int, default=16, help="GRPO groups per step (the load)")
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measured", type=int, default=12, help="measured asynchronous steps after the warm-up")
    ap.add_argument("--max-sim-s", type=float, default=36000.0)
    ap.add_argument("--static", type=int, nargs="*", default=None,
                    help="prefill counts of the static runs (default: every ratio the cluster can run)")
    ap.add_argument("--check-static", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.seeds < 2 or args.jobs < 1:
        ap.error("--seeds must be >= 2 (an interval needs two) and --jobs >= 1")
    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.baseline}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode != 0:
        ap.error(f"--baseline {args.baseline!r}: not a commit of this repository")
    base = {"model": args.model, "preset": args.preset, "staleness": args.staleness, "groups": args.groups,
            "gpus": args.gpus, "measured": args.measured, "max_sim_s": args.max_sim_s}
    seeds = list(range(args.seed, args.seed + args.seeds))
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": export(args.baseline, Path(tmp) / "baseline"), "current": ROOT}
        probe = run_one(ROOT, base | {"mode": "colocated", "p": 0, "seed": seeds[0], "max_sim_s": 1.0})
        ratios_p = args.static if args.static else list(range(1, probe["instances"]))
        jobs = [("current", "static", p, s) for p in ratios_p for s in seeds]
        jobs += [(t, "adaptive", 0, s) for t in trees for s in seeds]
        if args.check_static:
            jobs += [("baseline", "static", p, seeds[0]) for p in ratios_p]
        results: dict[tuple, dict] = {}
        with ThreadPoolExecutor(args.jobs) as pool, tqdm(total=len(jobs), desc="runs", unit="run") as bar:
            futures = {pool.submit(run_one, trees[t], base | {"mode": m, "p": p, "seed": s}): (t, m, p, s)
                       for t, m, p, s in jobs}
            for future, key in futures.items():
                results[key] = future.result()
                bar.update()
    static = {p: [results[("current", "static", p, s)]["steady_step_s"] for s in seeds] for p in ratios_p}
    best = best_static(static)
    ref = static[best]
    out: dict = {"cell": base, "baseline": args.baseline, "seeds": seeds, "best_static": f"{best}:{probe['instances'] - best}",
                 "static_mean_s": {f"{p}:{probe['instances'] - p}": (statistics.fmean(xs) if None not in xs else None)
                                   for p, xs in static.items()}}
    for tree in trees:
        adaptive = [results[(tree, "adaptive", 0, s)]["steady_step_s"] for s in seeds]
        out[tree] = summary(ratios(adaptive, ref)) | {
            "switches": [results[(tree, "adaptive", 0, s)]["switches"] for s in seeds]}
    paired = [c / b for c, b in zip(out["current"]["per_seed"], out["baseline"]["per_seed"])
              if c != float("inf") and b != float("inf")]
    out["current_over_baseline"] = summary(paired)
    if args.check_static:
        same = all(results[("baseline", "static", p, seeds[0])] == results[("current", "static", p, seeds[0])]
                   for p in ratios_p)
        out["static_identical_in_both_trees"] = same
    print(f"\n{args.model} {args.preset} staleness {args.staleness}, {args.groups} groups; best static "
          f"{out['best_static']} over {len(seeds)} seeds")
    print(f"{'seed':>4} {'baseline':>9} {'current':>9}")
    for s, b, c in zip(seeds, out["baseline"]["per_seed"], out["current"]["per_seed"]):
        print(f"{s:>4} {b:9.3f} {c:9.3f}")
    for name in ("baseline", "current", "current_over_baseline"):
        d = out[name]
        ci = d["interval95"]
        print(f"{name:<22} mean {d['mean']:.3f}" + (f" (95 % {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
              + (f", {d['unfinished']} unfinished" if d["unfinished"] else ""))
    if args.check_static:
        print(f"static runs identical in both trees (seed {seeds[0]}): {'yes' if out['static_identical_in_both_trees'] else 'NO'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    if args.png:
        draw(out, args.png)
    return 0


def draw(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    seeds = out["seeds"]
    for name, marker in (("baseline", "o"), ("current", "s")):
        ys = [min(v, 2.0) for v in out[name]["per_seed"]]
        ax.plot(seeds, ys, marker, label=f"{name}: mean {out[name]['mean']:.3f}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.02, color="r", ls="--", lw=0.8, label="1.02")
    cell = out["cell"]
    ax.set_title(f"{cell['model']} {cell['preset']} k={cell['staleness']} {cell['groups']} groups", fontsize=9)
    ax.set_xlabel("seed")
    ax.set_ylabel(f"adaptive / best static ({out['best_static']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
