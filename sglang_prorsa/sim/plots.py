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


def _find(rows: list[dict], preset: str, staleness: int, mode: str) -> dict | None:
    return next((r for r in rows if r["preset"] == preset and r["staleness"] == staleness and r["mode"] == mode), None)


def _panels(n: int, title: str, width: float = 4.2):
    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.4), squeeze=False)
    fig.suptitle(title)
    return fig, axes[0]


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def normalised_step_times(rows: list[dict], path: Path) -> None:
    """Figure 5 (+ the static baseline of Figure 7): mean rollout time per step, normalised to colocation."""
    settings = _settings(rows)
    fig, axes = _panels(len(PRESETS), "Rollout time per step, normalised to PD colocation (lower is better)")
    width = 0.26
    for ax, preset in zip(axes, PRESETS):
        for j, mode in enumerate(MODE_COLOURS):
            values = [(_find(rows, preset, k, mode) or {}).get("normalised", float("nan")) for k in settings]
            ax.bar([i + (j - 1) * width for i in range(len(settings))], values, width, label=mode,
                   color=MODE_COLOURS[mode])
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(settings)), [_stale_label(k) for k in settings])
        ax.set_title(preset)
        ax.set_ylabel("normalised step time")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def idle_ratios(rows: list[dict], path: Path) -> None:
    """Figure 6: GPU time lost waiting for the slowest attention-DP rank, per mode."""
    settings = _settings(rows)
    fig, axes = _panels(len(PRESETS), "GPU idle ratio inside busy iterations (DP-rank synchronisation)")
    width = 0.26
    for ax, preset in zip(axes, PRESETS):
        for j, mode in enumerate(MODE_COLOURS):
            values = [(_find(rows, preset, k, mode) or {}).get("sync_idle_ratio", float("nan")) for k in settings]
            ax.bar([i + (j - 1) * width for i in range(len(settings))], values, width, label=mode,
                   color=MODE_COLOURS[mode])
        ax.set_xticks(range(len(settings)), [_stale_label(k) for k in settings])
        ax.set_title(preset)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("GPU idle ratio")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def switching_gain(rows: list[dict], path: Path) -> None:
    """Figure 7: speedup of role switching (adaptive) over the best static PD ratio."""
    settings = _settings(rows)
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    width = 0.26
    for j, k in enumerate(settings):
        gains = []
        for preset in PRESETS:
            static, adaptive = _find(rows, preset, k, "best static"), _find(rows, preset, k, "adaptive")
            gains.append(static["mean_step_s"] / adaptive["mean_step_s"] if static and adaptive else float("nan"))
        ax.bar([i + (j - 1) * width for i in range(len(PRESETS))], gains, width, label=_stale_label(k))
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(PRESETS)), PRESETS)
    ax.set_ylabel("speedup over best static")
    ax.set_title("Effect of prediction-based role switching")
    ax.legend(fontsize=8)
    _save(fig, path)


def forecast_wape(rows: list[dict], path: Path) -> None:
    """Figure 8: predictor WAPE (prefill arrivals, decode admissions) of the adaptive runs."""
    settings = _settings(rows)
    fig, axes = _panels(2, "Prediction WAPE (adaptive runs)")
    for ax, preset in zip(axes, ("coding_agent", "general_agent")):
        for j, (key, label) in enumerate((("wape_prefill", "prefill"), ("wape_decode", "decode"))):
            values = [(_find(rows, preset, k, "adaptive") or {}).get(key) for k in settings]
            ax.bar([i + (j - 0.5) * 0.35 for i in range(len(settings))],
                   [100 * v if v is not None else float("nan") for v in values], 0.35, label=label)
        ax.set_xticks(range(len(settings)), [_stale_label(k) for k in settings])
        ax.set_title(preset)
        ax.set_ylabel("WAPE (%)")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def forecast_vs_measured(series: dict[str, list[dict]], path: Path) -> None:
    """Figure 9: predicted and measured prefill arrivals per horizon window, normalised to the measured peak."""
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
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, timeline in series.items():
        ax.step([p["t"] / 60 for p in timeline], [p["n_prefill"] for p in timeline], where="post", lw=1, label=name)
    ax.set_xlabel("time (minutes)")
    ax.set_ylabel("prefill instances")
    ax.set_title("Adaptive PD ratio over time")
    ax.legend(fontsize=7)
    _save(fig, path)
