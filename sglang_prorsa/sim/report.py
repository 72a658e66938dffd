"""The grid benchmark's results as markdown (benchmarks/results/sim_grid*/README.md): tables, acceptance reading,
switch accounting, the paper's numbers beside ours, and every ASSUMED model parameter."""

from __future__ import annotations


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _table(rows: list[dict]) -> list[str]:
    out = ["| workload | staleness | groups/step | GPU-bound | colocated s | best static | static s | adaptive s | "
           "adaptive / best static (per seed) | adaptive / colocated | switches / step | paid | WAPE P / D |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seeds = ", ".join(f"{x:.3f}" for x in r["adaptive_over_best_seeds"])
        bound = {True: "yes", False: "no", None: "-"}[r.get("gpu_bound")]
        wape = "-" if r["wape_prefill"] is None else f"{_pct(r['wape_prefill'])} / {_pct(r['wape_decode'])}"
        out.append(f"| {r['preset']} | {r['staleness']} | {r['groups']} | {bound} | {r['colocated_s']:.0f} | "
                   f"{r['best_static']} | {r['best_static_s']:.0f} | {r['adaptive_s']:.0f} | "
                   f"**{r['adaptive_over_best']:.3f}** ({seeds}) | {r['adaptive_over_colocated']:.2f} | "
                   f"{r['switches_per_step']:.1f} | {_pct(r['switches_paid_share'])} | {wape} |")
    return out


def _idle(rows: list[dict]) -> list[str]:
    out = ["| workload | staleness | groups | interference colo / static / adaptive | imbalance colo / static / "
           "adaptive | prefix hit colo / static / adaptive |", "|---|---|---|---|---|---|"]
    modes = ("colocated", "best static", "adaptive")
    for r in rows:
        out.append(f"| {r['preset']} | {r['staleness']} | {r['groups']} | "
                   + " / ".join(_pct(r["interference"][m]) for m in modes) + " | "
                   + " / ".join(_pct(r["imbalance"][m]) for m in modes) + " | "
                   + " / ".join(_pct(r["prefix_hit"][m]) for m in modes) + " |")
    return out


def markdown(result: dict, model: str, assumed: dict[str, str], paper: dict[str, str]) -> str:
    lines = [f"# Cluster simulator: {model}", "",
             f"Produced by `python benchmarks/bench_sim_grid.py {' '.join(_cli(result))}` "
             f"({result.get('wall_s', 0):.0f} s wall). Step times are means over seeds of each run's steady step "
             "time (asynchronous runs leave out their first step). Best static = the fastest of *every* static "
             "ratio, chosen per cell and load. GPU-bound = the best static step time grew >= 1.5x over half the "
             "load.", ""]
    rows = result.get("rows") or []
    if rows:
        bound = [r for r in rows if r.get("gpu_bound")]
        worst = max(bound, key=lambda r: r["adaptive_over_best"]) if bound else None
        lines += ["## Grid", ""] + _table(rows) + [""]
        if worst:
            ok = all(r["adaptive_over_best"] <= 1.02 for r in bound)
            lines += [f"At GPU-bound loads ({len(bound)} of {len(rows)} rows) adaptive / best static is at most "
                      f"**{worst['adaptive_over_best']:.3f}** ({worst['preset']}, staleness {worst['staleness']}, "
                      f"{worst['groups']} groups): the <= 1.02 target is {'met' if ok else 'NOT met'} in every "
                      "GPU-bound row.", ""]
        lines += ["### Where the GPU time goes (top load of each cell is in fig6_idle.png)", ""] + _idle(rows) + [""]
    if result.get("shift"):
        lines += ["## Shifting prefill:decode mix", "",
                  "Workloads whose mix moves inside a step (sim/workloads.py): a mixed math + agent batch, and a "
                  "research agent that plans at length, then reads long documents.", ""] + _table(result["shift"])
        lines += [""]
    if result.get("speed"):
        lines += ["## Simulator speed", "", "| mode | simulated h | wall s | CPU s | GPU-h / wall-s | GPU-h / CPU-s |",
                  "|---|---|---|---|---|---|"]
        for s in result["speed"]:
            lines.append(f"| {s['mode']} | {s['sim_s'] / 3600:.2f} | {s['wall_s']:.1f} | {s['cpu_s']:.1f} | "
                         f"{s['gpu_hours_per_wall_s']:.1f} | {s['gpu_hours_per_cpu_s']:.1f} |")
        lines += [""]
    lines += ["## The paper, for comparison", ""] + [f"- {k}: {v}" for k, v in paper.items()] + [""]
    lines += ["## ASSUMED parameters of this model", "",
              "Every other parameter cites a paper table, a public profile or an SGLang default "
              "(sglang_prorsa/sim/models/*.json, `sources`).", ""]
    lines += [f"- `{k}`: {v}" for k, v in assumed.items()] + [""]
    return "\n".join(lines)


def _cli(result: dict) -> list[str]:
    args = result.get("args", {})
    keep = ("model", "seeds", "jobs")
    return [f"--{k} {args[k]}" for k in keep if k in args] + (["--shift"] if result.get("shift") else [])
