"""PNG plots of a simulated grid, in the spirit of the paper's Figures 5-9 (matplotlib, Agg backend).

Every function takes plain rows (dicts, as bench_sim_grid.py writes them to JSON) and a path, so plots can be
redrawn from a results file without rerunning the simulation.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PRESETS = ("math", "coding_agent", "general_agent")
MODE_COLOURS = {"colocated": "#9e9e9e", "best static": "#5b8def", "adaptive": "#e8793a"}


def _settings(rows: list[dict]) -> list[int]:
    return sorted({r["staleness"] for r in rows})


def _stale_label(k: int) -> str:
    return "on policy" if k == 0 else f"stale. = {k}"


def _top(rows: list[dict], preset: str, staleness: int) -> dict | None:
    """The row of the highest load of a cell (the plotted one)."""
    cell = [r for r in rows if r["preset"] == preset and r["staleness"] == staleness]
    return max(cell, key=lambda r: r["groups"]) if cell else None


def _panels(n: int, title: str, width: float = 4.2):
    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.4), squeeze=False)
    fig.suptitle(title)
    return fig, axes[0]


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def normalised_step_times(rows: list[dict], path: Path) -> None:
    """Figure 5 (+ the static baseline of Figure 7): mean step time at each cell's top load, normalised to colocation."""
    settings = _settings(rows)
    fig, axes = _panels(len(PRESETS), "Rollout time per step at the top load, normalised to PD colocation "
                                      "(lower is better)")
    width = 0.26
    keys = {"colocated": "colocated_s", "best static": "best_static_s", "adaptive": "adaptive_s"}
    for ax, preset in zip(axes, PRESETS):
        for j, mode in enumerate(MODE_COLOURS):
            values = []
            for k in settings:
                r = _top(rows, preset, k)
                values.append(r[keys[mode]] / r["colocated_s"] if r else float("nan"))
            ax.bar([i + (j - 1) * width for i in range(len(settings))], values, width, label=mode,
                   color=MODE_COLOURS[mode])
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(settings)), [_stale_label(k) for k in settings])
        ax.set_title(preset)
        ax.set_ylabel("normalised step time")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def idle_ratios(rows: list[dict], path: Path) -> None:
    """Figure 6: GPU time lost at the MoE collective, split into P/D interference (solid) and DP imbalance (hatched)."""
    settings = _settings(rows)
    fig, axes = _panels(len(PRESETS), "Idle inside busy iterations: interference (solid) + imbalance (hatched)")
    width = 0.26
    for ax, preset in zip(axes, PRESETS):
        for j, mode in enumerate(MODE_COLOURS):
            xs = [i + (j - 1) * width for i in range(len(settings))]
            inter = [(_top(rows, preset, k) or {}).get("interference", {}).get(mode, float("nan")) for k in settings]
            imbal = [(_top(rows, preset, k) or {}).get("imbalance", {}).get(mode, float("nan")) for k in settings]
            ax.bar(xs, inter, width, color=MODE_COLOURS[mode], label=mode)
            ax.bar(xs, imbal, width, bottom=inter, color=MODE_COLOURS[mode], alpha=0.45, hatch="//")
        ax.set_xticks(range(len(settings)), [_stale_label(k) for k in settings])
        ax.set_title(preset)
    axes[0].set_ylabel("share of busy GPU time")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def switching_gain(rows: list[dict], path: Path) -> None:
    """Figure 7: best static step time over adaptive's, per cell and load; bars = seed range."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    labels, values, lows, highs, colours = [], [], [], [], []
    for r in rows:
        labels.append(f"{r['preset'].split('_')[0]}/{r['staleness']}/{r['groups']}g")
        seeds = [1 / x for x in r["adaptive_over_best_seeds"]]
        values.append(1 / r["adaptive_over_best"])
        lows.append(values[-1] - min(seeds))
        highs.append(max(seeds) - values[-1])
        colours.append("#e8793a" if r.get("gpu_bound") else "#f3c19f")
    ax.bar(range(len(rows)), values, color=colours, yerr=[lows, highs], capsize=2)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.axhline(1 / 1.02, color="red", lw=0.8, ls=":")
    ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=7)
    ax.set_ylabel("speedup over best static")
    ax.set_title("Role switching vs the best static ratio of each cell (dark: GPU-bound load; dotted: 1/1.02)")
    _save(fig, path)


def forecast_wape(rows: list[dict], path: Path) -> None:
    """Figure 8: predictor WAPE (prefill arrivals, decode admissions) of the adaptive runs at the top load."""
    settings = _settings(rows)
    fig, axes = _panels(2, "Prediction WAPE (adaptive runs, top load)")
    for ax, preset in zip(axes, ("coding_agent", "general_agent")):
        for j, (key, label) in enumerate((("wape_prefill", "prefill"), ("wape_decode", "decode"))):
            values = [(_top(rows, preset, k) or {}).get(key) for k in settings]
            ax.bar([i + (j - 0.5) * 0.35 for i in range(len(settings))],
                   [100 * v if v is not None else float("nan") for v in values], 0.35, label=label)
        ax.set_xticks(range(len(settings)), [_stale_label(k) for k in settings])
        ax.set_title(preset)
        ax.set_ylabel("WAPE (%)")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def load_sweep(rows: list[dict], path: Path) -> None:
    """Mean step time against load (groups per step) for each cell: colocated, best static, adaptive."""
    cells = sorted({(r["preset"], r["staleness"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(2.6 * len(cells), 3.0), squeeze=False)
    for ax, (preset, k) in zip(axes[0], cells):
        cell = sorted((r for r in rows if (r["preset"], r["staleness"]) == (preset, k)), key=lambda r: r["groups"])
        g = [r["groups"] for r in cell]
        for mode, key in (("colocated", "colocated_s"), ("best static", "best_static_s"), ("adaptive", "adaptive_s")):
            ax.plot(g, [r[key] for r in cell], marker="o", ms=3, color=MODE_COLOURS[mode], label=mode)
        ax.set_title(f"{preset.split('_')[0]} / {_stale_label(k)}", fontsize=8)
        ax.set_xlabel("groups per step", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("mean step time (s)")
    axes[0][0].legend(fontsize=6)
    _save(fig, path)


def forecast_vs_measured(series: dict[str, list[dict]], path: Path) -> None:
    """Figure 9: predicted and measured prefill arrivals per horizon window, normalised to the measured peak."""
    if not series:
        return
    fig, axes = _panels(len(series), "Predicted vs measured prefill workload (adaptive)", width=5.5)
    for ax, (name, windows) in zip(axes, series.items()):
        if not windows:
            continue
        t = [w["start"] / 60 for w in windows]
        measured = [w["realised_arrivals"] for w in windows]
        peak = max(max(measured), 1.0)
        ax.plot(t, [m / peak for m in measured], lw=1.0, label="measured")
        ax.plot(t, [w["forecast_arrivals"] / peak for w in windows], lw=1.0, ls="--", label="predicted")
        ax.set_title(name)
        ax.set_xlabel("time (minutes)")
    axes[0].set_ylabel("normalised prefill tokens")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def roles_over_time(series: dict[str, list[dict]], path: Path) -> None:
    """Prefill instances chosen by the allocator over time (adaptive runs)."""
    if not series:
        return
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, timeline in series.items():
        ax.step([p["t"] / 60 for p in timeline], [p["n_prefill"] for p in timeline], where="post", lw=1, label=name)
    ax.set_xlabel("time (minutes)")
    ax.set_ylabel("prefill instances")
    ax.set_title("Adaptive PD ratio over time")
    ax.legend(fontsize=7)
    _save(fig, path)
