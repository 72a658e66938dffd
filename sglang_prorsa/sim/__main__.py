"""``python -m sglang_prorsa.sim``: simulate a rollout cluster, or fit a model config from measurements.

    python -m sglang_prorsa.sim run --preset coding_agent --staleness 2 --mode adaptive --gpus 128
    python -m sglang_prorsa.sim run --preset math --mode static --prefill-instances 4 --json out.json
    python -m sglang_prorsa.sim compare --preset general_agent --staleness 8      # colocated, best static, adaptive
    python -m sglang_prorsa.sim compare --preset math+coding_agent --seeds 3      # a mixed batch, 3 seeds
    python -m sglang_prorsa.sim fit --samples measured.json --base mimo_v25_pro --out models/mine.json
    python -m sglang_prorsa.sim fit --url http://127.0.0.1:30000 --base qwen3_235b --out mine.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path

from tqdm import tqdm

from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.sim.baselines import flow_balance, one_to_one, paper_optimum
from sglang_prorsa.sim.config import (
    MODES,
    PLANNERS,
    ROUTING,
    ClusterConfig,
    ModelConfig,
    RolloutConfig,
    available_models,
    load_model,
)
from sglang_prorsa.sim.metrics import SimResult
from sglang_prorsa.sim.runner import simulate, static_ratios
from sglang_prorsa.sim.workloads import default_group_size, workload_tasks


def _at_least(low: float, kind: type = int, strict: bool = False):
    """An argparse type: a ``kind`` number >= ``low`` (> ``low`` when ``strict``); argparse names the flag on error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < low or (strict and value == low) or value != value:  # value != value: NaN
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid <name> value" on other errors
    return parse


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Build every configuration a run or compare will use before the first simulation, so that an unknown model or
    preset, or a cluster too small for the model's instances, is a usage error (exit 2), not a traceback later."""
    try:
        model = load_model(args.model)
        workload_tasks(args.preset)
        _rollout(args)
        if args.command == "run":
            _cluster(args, args.mode).split(model)
        else:
            _cluster(args, "colocated").split(model)
            _cluster(args, "adaptive").split(model)
            static_ratios(model, _cluster(args, "static", 1))
    except (ValueError, FileNotFoundError, KeyError) as exc:
        parser.error(f"{args.command}: {exc}")


def _rollout(args: argparse.Namespace, seed: int | None = None) -> RolloutConfig:
    group = args.group_size or default_group_size(args.preset)  # §5.1
    return RolloutConfig(preset=args.preset, staleness=args.staleness, group_size=group,
                         groups_per_step=args.groups_per_step, steps=args.steps,
                         seed=args.seed if seed is None else seed)


def _cluster(args: argparse.Namespace, mode: str, prefill_instances: int | None = None) -> ClusterConfig:
    return ClusterConfig(gpus=args.gpus, mode=mode,
                         prefill_instances=args.prefill_instances if prefill_instances is None else prefill_instances,
                         horizon_s=args.horizon, min_dwell_s=args.min_dwell, hysteresis=args.hysteresis,
                         max_sim_s=args.max_sim_s, decode_shape=args.decode_shape, routing=args.routing,
                         planner=args.planner)


def _line(runs: list[SimResult], base: float | None = None) -> str:
    r = runs[0]
    steps = [statistics.fmean(x.step_times_s) if x.step_times_s else float("nan") for x in runs]
    mean = statistics.fmean(steps)
    spread = f"±{statistics.stdev(steps):5.1f}" if len(steps) > 1 else "      "
    norm = f"{mean / base:5.2f}x" if base else "   -  "
    wapes = [x for x in runs if x.wape_prefill is not None]
    wape = "" if not wapes else (f"  WAPE P {100 * statistics.fmean(x.wape_prefill for x in wapes):5.1f}% "
                                 f"D {100 * statistics.fmean(x.wape_decode or 0 for x in wapes):5.1f}%")
    switches = sum(x.switches for x in runs) / len(runs)
    paid = sum(x.switches_paid for x in runs) / len(runs)
    traj = statistics.fmean(x.completion_mean_s or 0.0 for x in runs)
    return (f"{r.label:<12} step {mean:8.1f} s{spread} {norm}  idle interf {100 * _avg(runs, 'interference_idle_ratio'):5.1f}%"
            f" imbal {100 * _avg(runs, 'imbalance_idle_ratio'):5.1f}% all {100 * _avg(runs, 'gpu_idle_ratio'):5.1f}%"
            f"  hit {100 * _avg(runs, 'prefix_hit_ratio'):4.1f}%  traj {traj:7.1f} s  switches {switches:5.1f}"
            f" (paid {paid:4.1f}){wape}  [{sum(x.wall_s for x in runs):.1f} s wall]")


def _avg(runs: list[SimResult], name: str) -> float:
    return statistics.fmean(getattr(r, name) for r in runs)


def _seeds(args: argparse.Namespace) -> list[int]:
    return list(range(args.seed, args.seed + args.seeds))


def _simulate_one(job: tuple[str, ClusterConfig, RolloutConfig]) -> SimResult:
    model, cluster, rollout = job
    return simulate(load_model(model), cluster, rollout)


def _simulate_all(args: argparse.Namespace, jobs: list[tuple[ClusterConfig, RolloutConfig]],
                  desc: str) -> list[SimResult]:
    """Every (cluster, rollout) run, in order; over ``--jobs`` worker processes when > 1 (runs are independent and
    deterministic: the results are the same, only sooner on several cores)."""
    work = [(args.model, cluster, rollout) for cluster, rollout in jobs]
    workers = min(args.jobs, len(work))
    with tqdm(total=len(work), desc=desc, unit="run") as bar, \
            (ProcessPoolExecutor(workers) if workers > 1 else nullcontext()) as pool:
        results = []
        for result in (pool.map(_simulate_one, work, chunksize=1) if pool else map(_simulate_one, work)):
            results.append(result)
            bar.update()
        return results


def cmd_run(args: argparse.Namespace) -> int:
    if args.seeds == 1:  # one run: progress per simulated step
        rollout = _rollout(args)
        with tqdm(total=rollout.steps, desc=f"{rollout.preset}/{rollout.label}/{args.mode}/seed {args.seed}",
                  unit="step") as bar:
            results = [simulate(load_model(args.model), _cluster(args, args.mode), rollout, on_step=bar.update)]
    else:
        results = _simulate_all(args, [(_cluster(args, args.mode), _rollout(args, seed)) for seed in _seeds(args)],
                                f"{args.preset}/{_rollout(args).label}/{args.mode}")
    print(_line(results))
    _write(args.json, results)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Colocated, every static ratio and adaptive, each over ``--seeds`` seeds; the best static by mean step time,
    then adaptive against the ratios a user would pick without that oracle (baselines.py)."""
    model = load_model(args.model)
    ratios = static_ratios(model, _cluster(args, "static", 1))
    configs = [("colocated", 0)] + [("static", p) for p in ratios] + [("adaptive", args.prefill_instances)]
    seeds = _seeds(args)
    results = _simulate_all(args, [(_cluster(args, mode, p), _rollout(args, seed)) for mode, p in configs
                                   for seed in seeds], f"{args.preset}/{_rollout(args).label}")
    groups = [results[i:i + len(seeds)] for i in range(0, len(results), len(seeds))]
    mean = lambda runs: statistics.fmean(r.mean_step_s for r in runs)  # noqa: E731
    statics = [g for g in groups if g[0].mode == "static"]
    best = min(statics, key=lambda g: (any(r.steps_done < args.steps for r in g), mean(g)))
    base = mean(groups[0])
    for g in groups:
        print(("* " if g is best else "  ") + _line(g, base))
    adaptive = groups[-1]
    print(f"adaptive / best static ({best[0].label}): {mean(adaptive) / mean(best):.3f}")
    summary = _versus_baselines(args, model, adaptive, best, statics, mean)
    rows = [r for g in groups for r in g]
    _write(args.json, rows, {i: summary for i, r in enumerate(rows) if r.mode == "adaptive"})
    return 0


def _versus_baselines(args: argparse.Namespace, model: ModelConfig, adaptive: list[SimResult], best: list[SimResult],
                      statics: list[list[SimResult]], mean: Callable[[list[SimResult]], float]) -> dict:
    """Print adaptive against each ratio a user would pick without simulating every one (baselines.py), looked up
    among the static runs compare made; returns the same for the JSON (``baselines``, ``flow_balance``)."""
    cluster = _cluster(args, "static", 1)
    flow = flow_balance(model, _rollout(args), cluster)
    picks = {"paper optimum": paper_optimum(model, args.preset, cluster), "1:1": one_to_one(model, cluster),
             "flow balance": flow.baseline}
    by_prefill = {g[0].prefill_instances: g for g in statics}
    out = {"best static": {"label": best[0].label.removeprefix("static "), "prefill_instances":
                           best[0].prefill_instances, "decode_instances": best[0].decode_instances,
                           "adaptive_over": mean(adaptive) / mean(best), "note": "fastest of every static ratio"}}
    for name, pick in picks.items():
        runs = by_prefill.get(pick.prefill_instances) if pick.prefill_instances is not None else None
        ratio = mean(adaptive) / mean(runs) if runs else None
        out[name] = pick.to_dict() | {"adaptive_over": ratio}
        if pick.prefill_instances is None:
            print(f"adaptive / {name}: - ({pick.note})")
        elif runs is None:
            print(f"adaptive / {name} (static {pick.label}): - (not among the static runs)")
        else:
            late = " (a seed did not finish its steps)" if any(r.steps_done < args.steps for r in runs) else ""
            print(f"adaptive / {name} ({runs[0].label}): {ratio:.3f}{late}")
    print(f"  flow balance: {flow.baseline.note}")
    return {"baselines": out, "flow_balance": flow.to_dict()}


def _write(path: str | None, results: list[SimResult], extra: dict[int, dict] | None = None) -> None:
    """Every result as a JSON list; ``extra`` adds keys to the rows it names by index."""
    if path:
        rows = [r.to_dict() | (extra or {}).get(i, {}) for i, r in enumerate(results)]
        Path(path).write_text(json.dumps(rows, indent=1, default=_json_default))
        print(f"wrote {path}")


def _json_default(obj):
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    raise TypeError(type(obj).__name__)


def cmd_fit(args: argparse.Namespace) -> int:
    from sglang_prorsa.sim.fit import main as fit_main

    return fit_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_prorsa.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "one simulation"), ("compare", "colocated vs every static ratio vs adaptive")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--model", default="mimo_v25_pro", help=f"one of {available_models()} or a JSON path")
        p.add_argument("--preset", default="coding_agent",
                       help="math | coding_agent | general_agent | research_agent | document_agent, or a mix like "
                       "math+coding_agent")
        p.add_argument("--staleness", type=_at_least(0), default=0, help="0 = synchronous (on-policy)")
        p.add_argument("--group-size", type=_at_least(0), default=0, help="GRPO group (default: 8 math, 32 agentic)")
        p.add_argument("--groups-per-step", type=_at_least(1), default=4,
                       help="the load: GRPO groups per training step")
        p.add_argument("--steps", type=_at_least(1), default=3)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--seeds", type=_at_least(1), default=1, help="repeat over seeds seed .. seed+N-1")
        p.add_argument("--gpus", type=_at_least(1), default=128)
        p.add_argument("--prefill-instances", type=_at_least(0), default=0)
        p.add_argument("--horizon", type=_at_least(0.0, float, strict=True), default=DEFAULT_HORIZON_S,
                       help="S: forecast horizon and control period")
        p.add_argument("--min-dwell", type=_at_least(0.0, float), default=30.0)
        p.add_argument("--hysteresis", type=_at_least(0.0, float), default=0.1,
                       help="absolute coverage band of the planner")
        p.add_argument("--planner", default="guarded", choices=PLANNERS, help="adaptive: guarded, guarded with the wait rule (waits), or the paper's")
        p.add_argument("--routing", default="sglang", choices=ROUTING, help="DP-rank choice (cluster.py)")
        p.add_argument("--decode-shape", default="same", choices=("same", "wide"),
                       help="PD decode instances: same shape as prefill, or the model's wide (EP x2) shape")
        p.add_argument("--max-sim-s", type=_at_least(0.0, float, strict=True), default=6 * 3600.0)
        p.add_argument("--jobs", type=_at_least(1), default=1,
                       help="worker processes for the runs (seeds, ratios); the results do not depend on it")
        p.add_argument("--json", help="write results here")
        if name == "run":
            p.add_argument("--mode", default="adaptive", choices=MODES)
    run_p, cmp_p = sub.choices["run"], sub.choices["compare"]
    run_p.set_defaults(func=cmd_run)
    cmp_p.set_defaults(func=cmd_compare)
    fit = sub.add_parser("fit", help="fit perf-model parameters from measured samples or a live server")
    from sglang_prorsa.sim.fit import add_arguments

    add_arguments(fit)
    fit.set_defaults(func=cmd_fit)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("run", "compare"):
        _check(parser, args)
        return args.func(args)
    try:  # fit: a samples file that is missing or malformed, or a server that cannot be reached, is a usage error
        return args.func(args)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"fit: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
