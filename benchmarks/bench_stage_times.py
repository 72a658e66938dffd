#!/usr/bin/env python3
"""Where a turn's time goes at adjacent static splits, and how far the wait rule's model of a move is from it.

For one simulator cell and a few static prefill:decode splits, each over ``--seeds`` seeds, every turn's realised
time in the engines is split into prefill (queue and service), the wait for a decode slot, and decode (KV transfer
and generation) (sim/stage_clock.py), averaged over the turns that arrive after the warm-up (``staleness + 1``
steps, as bench_sim_grid.py measures the steady step time).

Between two adjacent splits (one more prefill instance, one fewer decode instance) it prints:

- the realised change of prefill's time and of decode's slot wait;
- what the planner's wait rule predicts from the smaller split's times (waits.move_shortens_waits holds each stage's
  queue and takes its wait as inverse to its instances): prefill falls by w_P / (n_P + 1), decode's wait rises by
  w_D / (n_D - 1);
- the load that a wait of the form c / (n - n0) would need to pass through both splits' times (Kingman's
  heavy-traffic form, the load n0 in instances): n0 = (w_a n_a - w_b n_b) / (w_a - w_b). A stage whose n0 sits
  close to its instances is near saturation, where one instance more or less moves its wait far more than the
  held-queue model says.

Writes ``--out``/<model>_<preset>_<staleness>_<groups>.json and .png (stacked stage times per split, step time
beside them).

    python benchmarks/bench_stage_times.py --model qwen3_235b --preset general_agent --staleness 8 --groups 8 \\
        --ratios 11 12 13 --seeds 12 --async-measured 12 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.runner import simulate
from sglang_prorsa.sim.stage_clock import StageClock
from sglang_prorsa.sim.workloads import default_group_size

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "stage_times"
STAGES = ("prefill_s", "slot_wait_s", "decode_s")


# ----- pure computations (unit-tested) -----
def split_means(per_seed: list[dict]) -> dict:
    """One split's means over seeds (each seed weighs the same): steady step time and the three stage times."""
    out = {"seeds": len(per_seed), "prefill_instances": per_seed[0]["prefill_instances"],
           "decode_instances": per_seed[0]["decode_instances"],
           "steady_step_s": statistics.fmean(r["steady_step_s"] for r in per_seed),
           "turns": sum(r["turns"] for r in per_seed)}
    for key in (*STAGES, "total_s"):
        out[key] = statistics.fmean(r[key] for r in per_seed)
    return out


def load_fit(w_a: float, n_a: int, w_b: float, n_b: int) -> float | None:
    """n0 with w = c / (n - n0) through (n_a, w_a) and (n_b, w_b); None when the waits are equal (no fit)."""
    return (w_a * n_a - w_b * n_b) / (w_a - w_b) if w_a != w_b else None


def moves(splits: list[dict]) -> list[dict]:
    """For each pair of adjacent splits (sorted by prefill instances): realised changes, the wait rule's predictions
    from the smaller split, their ratio, and each stage's load fit (module docstring)."""
    out = []
    for a, b in zip(splits, splits[1:]):
        n_pa, n_da, n_pb, n_db = a["prefill_instances"], a["decode_instances"], b["prefill_instances"], \
            b["decode_instances"]
        prefill_fall = a["prefill_s"] - b["prefill_s"]
        decode_rise = b["slot_wait_s"] - a["slot_wait_s"]
        predicted_fall = a["prefill_s"] / (n_pa + 1)
        predicted_rise = a["slot_wait_s"] / (n_da - 1) if n_da > 1 else float("inf")
        out.append({
            "from": f"{n_pa}:{n_da}", "to": f"{n_pb}:{n_db}",
            "prefill_fall_s": prefill_fall, "predicted_prefill_fall_s": predicted_fall,
            "decode_rise_s": decode_rise, "predicted_decode_rise_s": predicted_rise,
            "prefill_fall_over_predicted": prefill_fall / predicted_fall if predicted_fall > 0 else None,
            "decode_rise_over_predicted": decode_rise / predicted_rise if 0 < predicted_rise < float("inf") else None,
            "summed_change_s": b["total_s"] - a["total_s"],
            "step_change": b["steady_step_s"] / a["steady_step_s"],
            "prefill_load": load_fit(a["prefill_s"], n_pa, b["prefill_s"], n_pb),
            "decode_load": load_fit(a["slot_wait_s"], n_da, b["slot_wait_s"], n_db),
        })
    return out


def table(splits: list[dict], pairs: list[dict]) -> list[str]:
    lines = [f"{'split':>6} {'step s':>7} {'prefill s':>9} {'slot wait s':>11} {'decode s':>8} {'sum s':>6} "
             f"{'turns':>8}"]
    for s in splits:
        lines.append(f"{s['prefill_instances']:>3}:{s['decode_instances']:<2} {s['steady_step_s']:7.1f} "
                     f"{s['prefill_s']:9.2f} {s['slot_wait_s']:11.2f} {s['decode_s']:8.2f} {s['total_s']:6.2f} "
                     f"{s['turns']:8,}")
    for m in pairs:
        fit = " ".join(f"{name} load {m[key]:.1f}" for name, key in (("prefill", "prefill_load"),
                                                                    ("decode", "decode_load")) if m[key] is not None)
        lines.append(f"{m['from']} -> {m['to']}: prefill {-m['prefill_fall_s']:+.2f} s (rule: "
                     f"{-m['predicted_prefill_fall_s']:+.2f}), decode slot wait {m['decode_rise_s']:+.2f} s (rule: "
                     f"{m['predicted_decode_rise_s']:+.2f}), sum {m['summed_change_s']:+.2f} s, step x"
                     f"{m['step_change']:.3f}; {fit}")
    return lines


def draw(splits: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{s['prefill_instances']}:{s['decode_instances']}" for s in splits]
    bottom = [0.0] * len(splits)
    for i, (key, name) in enumerate(zip(STAGES, ("prefill (queue + service)", "wait for a decode slot",
                                                  "decode (transfer + generation)"))):
        values = [s[key] for s in splits]
        ax.bar(labels, values, bottom=bottom, color=f"C{i}", label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, (s, top) in enumerate(zip(splits, bottom)):
        ax.annotate(f"step {s['steady_step_s']:.0f} s", (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(bottom) * 1.15)
    ax.set_xlabel("static split, prefill:decode instances")
    ax.set_ylabel("mean seconds per turn")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----- running -----
def run_one(job: tuple[str, str, int, int, int, int, int]) -> dict:
    model_name, preset, staleness, groups, prefill, seed, measured = job
    warm = staleness + 1 if staleness else 0
    clock = StageClock()
    rollout = RolloutConfig(preset=preset, staleness=staleness, group_size=default_group_size(preset),
                            groups_per_step=groups, steps=warm + measured if staleness else 1, seed=seed)
    r = simulate(load_model(model_name), ClusterConfig(gpus=128, mode="static", prefill_instances=prefill), rollout,
                 stage_clock=clock)
    since = sum(r.step_times_s[:warm])  # the warm-up's end: steps follow one another from time 0
    return {"prefill_instances": prefill, "decode_instances": r.decode_instances, "seed": seed,
            "steady_step_s": r.steady_step_s(warm), "reprefilled_turns": clock.reprefilled_turns} | clock.means(since)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_235b")
    ap.add_argument("--preset", default="general_agent")
    ap.add_argument("--staleness", type=int, default=8)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--ratios", type=int, nargs="+", default=[11, 12, 13], metavar="P",
                    help="prefill instances of the static splits (at least two)")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--async-measured", type=int, default=4, help="steps measured after the warm-up")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if len(set(args.ratios)) < 2 or min(args.ratios) < 1 or args.seeds < 1 or args.async_measured < 1 \
            or args.jobs < 1:
        ap.error("need two or more distinct --ratios >= 1, and --seeds, --async-measured, --jobs >= 1")
    args.ratios = sorted(set(args.ratios))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    jobs = [(args.model, args.preset, args.staleness, args.groups, p, s, args.async_measured)
            for p in args.ratios for s in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(tqdm(pool.map(run_one, jobs), total=len(jobs), desc="static runs", unit="run"))
    splits = [split_means([r for r in runs if r["prefill_instances"] == p]) for p in args.ratios]
    pairs = moves(splits)
    cell = f"{args.model} {args.preset}/{args.staleness}/{args.groups}"
    print(f"\n{cell}, 128 GPUs, {args.seeds} seeds, {args.async_measured} steps after the warm-up; means per turn")
    print("\n".join(table(splits, pairs)))
    result = {"cell": cell, "seeds": args.seeds, "async_measured": args.async_measured, "splits": splits,
              "moves": pairs, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{args.model}_{args.preset}_{args.staleness}_{args.groups}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    draw(splits, f"{cell}: where a turn's time goes ({args.seeds} seeds)", stem.with_suffix(".png"))
    return result


if __name__ == "__main__":
    main()
