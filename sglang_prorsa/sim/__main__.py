"""``python -m sglang_prorsa.sim``: simulate a rollout cluster, or fit a model config from measurements.

    python -m sglang_prorsa.sim run --preset coding_agent --staleness 2 --mode adaptive --gpus 128
    python -m sglang_prorsa.sim run --preset math --mode static --prefill-instances 4 --json out.json
    python -m sglang_prorsa.sim compare --preset general_agent --staleness 8      # colocated, best static, adaptive
    python -m sglang_prorsa.sim fit --samples measured.json --base mimo_v25_pro --out models/mine.json
    python -m sglang_prorsa.sim fit --url http://127.0.0.1:30000 --base qwen3_235b --out mine.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tqdm import tqdm

from sglang_prorsa.sim.config import MODES, ClusterConfig, RolloutConfig, available_models, load_model
from sglang_prorsa.sim.metrics import SimResult
from sglang_prorsa.sim.runner import best_static, simulate


def _rollout(args: argparse.Namespace) -> RolloutConfig:
    group = args.group_size or (8 if args.preset == "math" else 32)  # §5.1
    return RolloutConfig(preset=args.preset, staleness=args.staleness, group_size=group,
                         groups_per_step=args.groups_per_step, steps=args.steps, seed=args.seed)


def _cluster(args: argparse.Namespace, mode: str) -> ClusterConfig:
    return ClusterConfig(gpus=args.gpus, mode=mode, prefill_instances=args.prefill_instances,
                         horizon_s=args.horizon, min_dwell_s=args.min_dwell, hysteresis=args.hysteresis,
                         max_sim_s=args.max_sim_s)


def _line(r: SimResult, base: float | None = None) -> str:
    norm = f"{r.mean_step_s / base:5.2f}x" if base else "   -  "
    wape = "" if r.wape_prefill is None else f"  WAPE P {100 * r.wape_prefill:5.1f}% D {100 * (r.wape_decode or 0):5.1f}%"
    mean = r.completion_mean_s or 0.0
    return (f"{r.label:<12} step {r.mean_step_s:8.1f} s {norm}  idle(sync) {100 * r.sync_idle_ratio:5.1f}%  "
            f"idle(all) {100 * r.gpu_idle_ratio:5.1f}%  traj {mean:7.1f} s  switches {r.switches:4d}{wape}  "
            f"[{r.wall_s:.1f} s wall]")


def cmd_run(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    rollout = _rollout(args)
    with tqdm(total=rollout.steps, desc=f"{rollout.preset}/{rollout.label}/{args.mode}", unit="step") as bar:
        result = simulate(model, _cluster(args, args.mode), rollout, on_step=bar.update)
    print(_line(result))
    _write(args.json, [result])
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    model, rollout = load_model(args.model), _rollout(args)
    runs: list[SimResult] = []
    n = args.gpus // model.gpus_per_instance
    with tqdm(total=n + 1, desc=f"{rollout.preset}/{rollout.label}", unit="run") as bar:
        runs.append(simulate(model, _cluster(args, "colocated"), rollout))
        bar.update()
        best, statics = best_static(model, _cluster(args, "static"), rollout, on_run=lambda r: bar.update())
        runs += statics
        runs.append(simulate(model, _cluster(args, "adaptive"), rollout))
        bar.update()
    base = runs[0].mean_step_s
    for r in runs:
        print(("* " if r is best else "  ") + _line(r, base))
    _write(args.json, runs)
    return 0


def _write(path: str | None, results: list[SimResult]) -> None:
    if path:
        Path(path).write_text(json.dumps([r.to_dict() for r in results], indent=1, default=_json_default))
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
        p.add_argument("--preset", default="coding_agent", choices=["math", "coding_agent", "general_agent"])
        p.add_argument("--staleness", type=int, default=0, help="0 = synchronous (on-policy)")
        p.add_argument("--group-size", type=int, default=0, help="GRPO group (default: 8 math, 32 agentic)")
        p.add_argument("--groups-per-step", type=int, default=4)
        p.add_argument("--steps", type=int, default=3)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--gpus", type=int, default=128)
        p.add_argument("--prefill-instances", type=int, default=0)
        p.add_argument("--horizon", type=float, default=10.0)
        p.add_argument("--min-dwell", type=float, default=30.0)
        p.add_argument("--hysteresis", type=float, default=0.1)
        p.add_argument("--max-sim-s", type=float, default=6 * 3600.0)
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
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
