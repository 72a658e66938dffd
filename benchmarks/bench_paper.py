"""The paper's results beside the simulator's, entry by entry, with a verdict per entry.

Every number the paper's text gives for its results is in ``benchmarks/paper_numbers.json`` (id, figure, models,
tasks, staleness, quantity, value or range, the exact quote and its line in the paper's text file). This script reads
grids written by ``bench_sim_grid.py`` (``--grid MODEL=DIR``, DIR holding a ``grid.json``; a model may be given more
than once, its rows are then merged), or runs the grid itself for each model it lacks (``--run``), computes our number
for each entry on the same cells and assigns a verdict:

- ``agree``: the paper gives a range and ours overlaps it; or the paper gives one value (or an "up to" value) and ours
  (our range, or our maximum for "up to") comes within ``TOLERANCE`` (20 %) of it, i.e. overlaps [0.8 v, 1.2 v].
- ``disagree-explained``: not ``agree``, and ``benchmarks/paper_explanations.json`` has an explanation for the entry
  that names a measurement (``measurement.columns``: grid-row columns such as ``interference.colocated``) which this
  script finds on the entry's cells; the measured values are printed beside the explanation.
- ``disagree-unexplained``: otherwise.
- ``no number in the text`` / ``not measured`` (the grid records no such quantity) / ``not run`` (no cell of the entry
  was in the grids).

Ours is the min-max over the entry's cells (model x task x staleness) at the top load of each cell (the GPU-bound load
where the grid found one; the README says how many were) and, labelled, at the cell's lighter load. The verdict is read
at the top load. A direction flag marks a difference in kind: PD faster vs slower than colocation, adaptive slower than
the paper's static optimum, a different best static ratio, or numbers an order of magnitude apart.

Writes <out>/report.json, README.md and paper_vs_ours.png.

    python benchmarks/bench_paper.py --grid mimo_v25_pro=/tmp/g/mimo deepseek_v32=/tmp/g/ds
    python benchmarks/bench_paper.py --run --models mimo_v25_pro deepseek_v32 --seeds 2 --jobs 2 --work /tmp/g
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NUMBERS = HERE / "paper_numbers.json"
EXPLANATIONS = HERE / "paper_explanations.json"
RESULTS = HERE / "results" / "paper_side_by_side"
PAPER_TEXT = Path("/work/shared/paper/prorsa-2610.16592.txt")
MODELS = ("mimo_v25_pro", "deepseek_v32", "qwen3_235b")
TOLERANCE = 0.20  # a single paper value agrees with ours within +-20 %
MAGNITUDE = 10.0  # "an order of magnitude apart"
WAPE_BAR = 2.0  # decode-admission WAPE within this factor of the same cell's prefill WAPE
SHORT = {"mimo_v25_pro": "mimo", "deepseek_v32": "deepseek", "qwen3_235b": "qwen3", "math": "math",
         "coding_agent": "coding", "general_agent": "general"}
# Quantities with a pivot at 1: which side of it says which system is faster.
PIVOT = {"rollout_speedup_over_colocation": ("PD (adaptive) faster than colocation",
                                             "PD (adaptive) slower than colocation"),
         "step_time_over_colocation": ("PD (adaptive) slower than colocation", "PD (adaptive) faster than colocation"),
         "switching_speedup_over_paper_optimum": ("adaptive faster than the paper's static optimum",
                                                  "adaptive slower than the paper's static optimum"),
         "stage_specific_speedup": ("wide decode faster", "wide decode slower"),
         "trajectory_completion_ratio": ("trajectories finish sooner under PD (adaptive)",
                                         "trajectories finish later under PD (adaptive)")}
NOT_MEASURED = {"prefill_decode_token_ratio_max_over_min", "model_input", "forecast_vs_measured",
                "token_curves_and_itl"}


# ----- our numbers from grid rows -----
def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf


def _ratio(a, b) -> float | None:
    return a / b if _finite(a) and _finite(b) else None


def _best_prefill_of_8(row: dict) -> float | None:
    p, _, d = str(row.get("best_static", "")).partition(":")
    try:
        return 8 * int(p) / (int(p) + int(d))
    except ValueError:
        return None


def _paper_optimum_static(row: dict) -> float | None:
    return ((row.get("baselines") or {}).get("paper optimum") or {}).get("static_s")


def _completion(row: dict, mode: str) -> float | None:
    value = (row.get("completion_mean_s") or {}).get(mode)
    return value if _finite(value) else None


def _pct(x) -> float | None:
    return 100 * x if isinstance(x, (int, float)) and x == x else None


ROW_QUANTITIES = {  # a grid row -> our number
    "rollout_speedup_over_colocation": lambda r: _ratio(r.get("colocated_s"), r.get("adaptive_s")),
    "step_time_over_colocation": lambda r: _ratio(r.get("adaptive_s"), r.get("colocated_s")),
    "colocated_interference_idle_pct": lambda r: _pct((r.get("interference") or {}).get("colocated")),
    "switching_speedup_over_paper_optimum": lambda r: _ratio(_paper_optimum_static(r), r.get("adaptive_s")),
    "best_static_prefill_of_8": _best_prefill_of_8,
    "trajectory_completion_ratio": lambda r: _ratio(_completion(r, "colocated"), _completion(r, "adaptive")),
    "trajectory_completion_colocated_s": lambda r: _completion(r, "colocated"),
    "trajectory_completion_adaptive_s": lambda r: _completion(r, "adaptive"),
    "wape_prefill_pct": lambda r: _pct(r.get("wape_prefill")),
    "wape_decode_pct": lambda r: _pct(r.get("wape_decode")),
}


def column(row: dict, path: str):
    """A grid row's value at a dotted path (``interference.colocated``), or None."""
    value = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def index_rows(grid: dict) -> dict[tuple, list[dict]]:
    """(preset, staleness, decode shape) -> the grid's rows of that cell, lightest load first."""
    out: dict[tuple, list[dict]] = {}
    for r in list(grid.get("rows") or []) + list(grid.get("wide") or []):
        out.setdefault((r["preset"], int(r["staleness"]), r.get("decode_shape", "same")), []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["groups"])
    return out


def pick_load(rows: list[dict], load: str) -> dict | None:
    """The cell's ``top`` (highest) load or its ``light`` (lowest) one; None for ``light`` when it has one load."""
    if not rows:
        return None
    if load == "top":
        return rows[-1]
    return rows[0] if len(rows) > 1 else None


def cell_label(model: str, task: str, staleness: int, groups: int | None = None) -> str:
    return f"{SHORT.get(model, model)}/{SHORT.get(task, task)}/{staleness}" + (f"@{groups}" if groups else "")


def measure(entry: dict, grids: dict[str, dict], load: str = "top") -> dict:
    """Our number for ``entry`` on its cells at ``load``: ``values`` [(cell, value)], ``missing`` cells not in any
    grid, ``gpu_bound`` [cell, ...] of the rows used that the grid marked GPU-bound, ``undefined`` cells whose row
    has no finite value (a mode that did not finish its steps within --max-sim-s)."""
    q = entry["quantity"]
    values: list[tuple[str, float]] = []
    missing: list[str] = []
    bound: list[str] = []
    undefined: list[str] = []
    indexed = {m: index_rows(g) for m, g in grids.items()}
    if q in NOT_MEASURED:
        return {"values": values, "missing": missing, "gpu_bound": bound, "undefined": undefined}
    for model in entry["models"]:
        if q == "coding_over_general_completion":
            for k in entry["staleness"]:
                rows = indexed.get(model, {})
                a = pick_load(rows.get(("coding_agent", k, "same"), []), load)
                b = pick_load(rows.get(("general_agent", k, "same"), []), load)
                if a is None or b is None:
                    if load == "top":
                        missing.append(f"{SHORT.get(model, model)}/coding+general/{k}")
                    continue
                v = _ratio(_completion(a, "adaptive"), _completion(b, "adaptive"))
                label = f"{SHORT.get(model, model)}/coding@{a['groups']}+general@{b['groups']}/{k}"
                if v is not None:
                    values.append((label, v))
                else:
                    undefined.append(label)
            continue
        for task in entry["tasks"]:
            for k in entry["staleness"]:
                rows = indexed.get(model, {})
                if q == "stage_specific_speedup":  # wide rows against same-shape rows at the same load
                    same = {r["groups"]: r for r in rows.get((task, k, "same"), [])}
                    pairs = [(r, same[r["groups"]]) for r in rows.get((task, k, "wide"), []) if r["groups"] in same]
                    if not pairs:
                        if load == "top":
                            missing.append(cell_label(model, task, k) + " (no wide row with a same-shape row)")
                        continue
                    wide, base = pairs[-1] if load == "top" else (pairs[0] if len(pairs) > 1 else (None, None))
                    if wide is None:
                        continue
                    v = _ratio(base.get("adaptive_s"), wide.get("adaptive_s"))
                    row = wide
                else:
                    row = pick_load(rows.get((task, k, "same"), []), load)
                    if row is None:
                        if load == "top":
                            missing.append(cell_label(model, task, k))
                        continue
                    v = ROW_QUANTITIES[q](row)
                if v is not None:
                    values.append((cell_label(model, task, k, row["groups"]), v))
                    if row.get("gpu_bound"):
                        bound.append(cell_label(model, task, k, row["groups"]))
                else:  # a run that did not finish (inf) or a quantity the row lacks
                    undefined.append(cell_label(model, task, k, row["groups"]))
    return {"values": values, "missing": missing, "gpu_bound": bound, "undefined": undefined}


def span(values: list[tuple[str, float]]) -> tuple[float, float] | None:
    nums = [v for _, v in values]
    return (min(nums), max(nums)) if nums else None


# ----- verdicts -----
def paper_interval(entry: dict) -> tuple[float, float] | None:
    """The paper's number as an interval: a range as given, one value (or "up to" value) as [v, v]."""
    if entry["kind"] == "range":
        return float(entry["value"][0]), float(entry["value"][1])
    if entry["kind"] in ("value", "max"):
        return float(entry["value"]), float(entry["value"])
    return None


def agrees(entry: dict, ours: tuple[float, float], tolerance: float = TOLERANCE) -> bool:
    """The agreement rule, the same for every entry: a paper range overlaps ours; a paper value v has ours (for "up
    to" v: our maximum) within [v (1 - tolerance), v (1 + tolerance)]."""
    lo, hi = ours
    if entry["kind"] == "range":
        plo, phi = paper_interval(entry) or (math.nan, math.nan)
        return hi >= plo and lo <= phi
    v = float(entry["value"])
    band = (v * (1 - tolerance), v * (1 + tolerance)) if v >= 0 else (v * (1 + tolerance), v * (1 - tolerance))
    if entry["kind"] == "max":
        return band[0] <= hi <= band[1]
    return hi >= band[0] and lo <= band[1]


def direction_flag(entry: dict, ours: tuple[float, float] | None) -> str | None:
    """A difference in kind, not degree: the other side of 1 for a speedup, another best ratio, or 10x apart."""
    paper = paper_interval(entry)
    if paper is None or ours is None:
        return None
    (plo, phi), (lo, hi) = paper, ours
    q = entry["quantity"]
    if q == "best_static_prefill_of_8" and not (lo == hi == plo):
        return (f"different best ratio: ours {lo:g}-{hi:g} of 8 prefill, paper {plo:g}:{8 - plo:g}"
                if lo != hi else f"different best ratio: ours {lo:g}:{8 - lo:g}, paper {plo:g}:{8 - plo:g}")
    if q in PIVOT:
        above, below = PIVOT[q]
        if plo >= 1 and hi < 1:
            return f"{below} here; {above} in the paper"
        if phi <= 1 and lo > 1:
            return f"{above} here; {below} in the paper"
    if plo > 0 and lo > 0 and (lo >= MAGNITUDE * phi or hi * MAGNITUDE <= plo):
        return "an order of magnitude apart"
    return None


def valid_explanation(explanation: dict | None) -> bool:
    """An explanation counts only with text and a measurement that names grid-row columns."""
    if not explanation or not str(explanation.get("explanation", "")).strip():
        return False
    measurement = explanation.get("measurement") or {}
    return bool(measurement.get("columns")) and bool(str(measurement.get("what", "")).strip())


def measured_columns(entry: dict, explanation: dict, grids: dict[str, dict]) -> dict[str, list[tuple[str, object]]]:
    """The explanation's columns on its cells (its own ``models``/``tasks``/``staleness`` or the entry's) at the top
    load (or the measurement's ``load``: ``light``, or its ``groups``: that load): column -> [(cell, value)]; columns
    found on no cell are left out. A column ``wide:PATH`` is read on the
    cells' wide-decode rows (``bench_sim_grid.py --wide``)."""
    cells = {k: explanation.get("measurement", {}).get(k) or entry[k] for k in ("models", "tasks", "staleness")}
    load = explanation.get("measurement", {}).get("load", "top")
    groups = explanation.get("measurement", {}).get("groups")
    out: dict[str, list[tuple[str, object]]] = {}
    for path in explanation["measurement"]["columns"]:
        shape, _, inner = path.rpartition(":")  # "wide:switches_per_step" reads the wide-decode rows
        found = []
        for model in cells["models"]:
            rows = index_rows(grids.get(model, {}))
            for task in cells["tasks"]:
                for k in cells["staleness"]:
                    ladder = rows.get((task, k, shape or "same"), [])
                    row = (next((r for r in ladder if r["groups"] == groups), None) if groups is not None
                           else pick_load(ladder, load))
                    value = column(row, inner) if row else None
                    if value is not None:
                        found.append((cell_label(model, task, k, row["groups"]), value))
        if found:
            out[path] = found
    return out


def verdict(entry: dict, ours: tuple[float, float] | None, explanation: dict | None,
            measured: dict | None = None) -> str:
    """One of agree, disagree-explained, disagree-unexplained, no number in the text, not measured, not run.
    ``measured``: the explanation's columns as found in the grids (``measured_columns``); an explanation whose
    columns were found on no cell does not explain."""
    if entry["kind"] == "none":
        return "no number in the text"
    if entry["quantity"] in NOT_MEASURED:
        return "not measured"
    if ours is None:
        return "not run"
    if agrees(entry, ours):
        return "agree"
    if valid_explanation(explanation) and (measured is None or measured):
        return "disagree-explained"
    return "disagree-unexplained"


# ----- the report -----
def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    text = f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"
    return text + ("x" if unit == "x" else " %" if unit == "%" else " s" if unit == "s" else "")


def fmt_span(s: tuple[float, float] | None, unit: str = "") -> str:
    if s is None:
        return "-"
    return fmt(s[0], unit) if s[0] == s[1] else f"{fmt(s[0])}-{fmt(s[1], unit)}"


def fmt_paper(entry: dict) -> str:
    p = paper_interval(entry)
    if p is None:
        return "no number in the text"
    unit = {"x": "x", "%": " %", "s": " s"}.get(entry["unit"], "")
    return ("up to " if entry["kind"] == "max" else "") + (f"{p[0]:g}{unit}" if p[0] == p[1] else
                                                           f"{p[0]:g}-{p[1]:g}{unit}")


SHARES = ("interference", "imbalance", "gpu_idle", "prefix_hit")  # grid-row columns holding a share of 1


def _fmt_value(path: str, v: object) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if any(part in SHARES for part in path.split(":")[-1].split(".")) or "wape" in path:
        return f"{100 * v:.1f} %"
    return "inf" if v == math.inf else f"{v:.3g}"


def _fmt_measured(path: str, values: list[tuple[str, object]]) -> str:
    """A column's values: each cell's for up to 3 cells, else the min-max over the cells."""
    nums = [v for _, v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(values) <= 3 or len(nums) < len(values):
        return ", ".join(f"{c} {_fmt_value(path, v)}" for c, v in values)
    lo, hi = min(nums), max(nums)
    return f"{_fmt_value(path, lo)}-{_fmt_value(path, hi)} over {len(nums)} cells"


def build_report(numbers: dict, explanations: dict, grids: dict[str, dict]) -> dict:
    rows = []
    for entry in numbers["entries"]:
        top, light = measure(entry, grids, "top"), measure(entry, grids, "light")
        ours = span(top["values"])
        explanation = explanations.get(entry["id"])
        measured = (measured_columns(entry, explanation, grids)
                    if valid_explanation(explanation) and explanation is not None else None)
        v = verdict(entry, ours, explanation, measured)
        rows.append({"id": entry["id"], "figure": entry["figure"], "quantity": entry["quantity"],
                     "kind": entry["kind"], "unit": entry["unit"], "value": entry["value"], "line": entry["line"],
                     "quote": entry["quote"], "models": entry["models"], "tasks": entry["tasks"],
                     "staleness": entry["staleness"], "ours_top": ours, "ours_light": span(light["values"]),
                     "cells_top": top["values"], "cells_light": light["values"], "missing": top["missing"],
                     "undefined": top["undefined"],
                     "gpu_bound": top["gpu_bound"], "verdict": v,
                     "direction": direction_flag(entry, ours) if v not in ("not measured", "not run") else None,
                     "explanation": explanation if v == "disagree-explained" else None,
                     "measured": measured if v == "disagree-explained" else None,
                     "note": entry.get("note")})
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return {"rows": rows, "counts": counts, "tolerance": TOLERANCE, "wape_cells": wape_cells(grids)}


def wape_cells(grids: dict[str, dict]) -> list[dict]:
    """Every grid row with both forecast errors: decode-admission WAPE against prefill WAPE of the same cell and load
    (the issue's bar: decode within ``WAPE_BAR`` x prefill)."""
    out = []
    for model, grid in grids.items():
        for (task, k, shape), rows in sorted(index_rows(grid).items()):
            for r in rows:
                p, d = r.get("wape_prefill"), r.get("wape_decode")
                if shape != "same" or not _finite(p) or not _finite(d) or p <= 0:
                    continue
                out.append({"cell": cell_label(model, task, k, r["groups"]), "model": model, "task": task,
                            "staleness": k, "groups": r["groups"], "prefill": p, "decode": d, "ratio": d / p,
                            "within": d <= WAPE_BAR * p, "seeds": r.get("seeds")})
    return out


VERDICT_ORDER = ("agree", "disagree-explained", "disagree-unexplained", "not run", "not measured",
                 "no number in the text")


def markdown(report: dict, grids: dict[str, dict], command: str, wall: dict[str, float]) -> str:
    counts = report["counts"]
    lines = ["# The paper beside the simulator", "",
             f"Produced by `{command}`. Paper: `{PAPER_TEXT.name}` (line numbers are lines of that text file); its "
             "numbers with their quotes: [`benchmarks/paper_numbers.json`](../../paper_numbers.json); explanations: "
             "[`benchmarks/paper_explanations.json`](../../paper_explanations.json). Everything on our side comes from "
             "the cluster simulator (a model of the hardware, `docs/simulator.md`), not from GPUs.", "",
             "**Verdicts:** " + ", ".join(f"{k} **{counts[k]}**" for k in VERDICT_ORDER if k in counts) + ".", "",
             *_regenerate(grids),
             "## Rule", "",
             f"- **agree**: the paper gives a range and ours overlaps it; or it gives one value v (or \"up to\" v) and "
             f"ours (for \"up to\": our maximum) comes within ±{TOLERANCE:.0%} of it, i.e. overlaps "
             f"[{1 - TOLERANCE:g} v, {1 + TOLERANCE:g} v]. The same rule for every row.",
             "- **disagree-explained**: not agree, and `paper_explanations.json` explains it with a measurement "
             "(grid-row columns, found on the entry's cells; their values are in the last column).",
             "- **disagree-unexplained**: not agree and no such explanation.",
             "- **not run** / **not measured** / **no number in the text**: no cell of the entry in the grids; a "
             "quantity the grids do not record; a figure whose numbers are not in the text.",
             "- **Ours** is the min-max over the entry's cells (model/task/staleness) at each cell's top load "
             "(verdict) and, labelled *light*, at its half load. A cell is written `model/task/staleness@groups`.",
             "- **Flag**: a difference in kind: PD faster vs slower than colocation, adaptive vs the paper's static "
             "optimum on the other side of 1, a different best static ratio, or ours and the paper's 10x apart.", "",
             "## Grids", "", "| model | grid command | wall s | top loads GPU-bound | presets x staleness |",
             "|---|---|---|---|---|"]
    for model in MODELS:
        g = grids.get(model)
        if g is None:
            lines.append(f"| {model} | not run | - | - | - |")
            continue
        rows = g.get("rows") or []
        tops = [pick_load(rs, "top") for key, rs in index_rows(g).items() if key[2] == "same"]
        bound = sum(1 for r in tops if r and r.get("gpu_bound"))
        cells = sorted({(r["preset"], r["staleness"]) for r in rows})
        args = [a for part in g.get("merged_from", [g.get("args", {})]) for a in [part]]
        cmds = "; ".join(_grid_command(a) for a in args)
        lines.append(f"| {model} | {cmds} | {wall.get(model, g.get('wall_s', 0)):.0f} | {bound} of {len(tops)} | "
                     + ", ".join(f"{SHORT.get(p, p)}/{k}" for p, k in cells) + " |")
    lines += ["", "Where a cell's top load is not GPU-bound (a doubling of load grew the best static step less than 1.5x), "
              "ours is read where tools, rewards and the slowest trajectory still weigh on the step; higher loads are "
              "`bench_sim_grid.py --loads` (for the DeepSeek-like model: "
              "[`sim_grid_deepseek_high_load/`](../sim_grid_deepseek_high_load/README.md), not read here)."]
    lines += ["", "## Side by side", "",
              "| entry | paper (line) | ours, top load | ours, light load | cells | verdict | flag | explanation |",
              "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        paper = f"{fmt_paper(r)} (l. {r['line']})"
        cells = _cells_text(r)
        expl = "-"
        if r["explanation"]:
            meas = "; ".join(f"`{c}` {_fmt_measured(c, v)}" for c, v in (r["measured"] or {}).items())
            expl = f"{r['explanation']['explanation']} *Measured:* {r['explanation']['measurement']['what']}" + (
                f" ({meas})" if meas else "")
        lines.append(f"| `{r['id']}` {r['figure']}, {r['quantity']} | {paper} | **{fmt_span(r['ours_top'], r['unit'])}**"
                     f" | {fmt_span(r['ours_light'], r['unit'])} | {cells} | {r['verdict']} | {r['direction'] or '-'}"
                     f" | {expl} |")
    unexplained = [r["id"] for r in report["rows"] if r["verdict"] == "disagree-unexplained"]
    not_run = [f"{r['id']} ({', '.join(r['missing'])})" for r in report["rows"] if r["missing"]
               and r["verdict"] not in ("no number in the text", "not measured")]
    lines += ["", "## Open", "",
              f"Disagreeing without an explanation ({len(unexplained)}): " + (", ".join(f"`{i}`" for i in unexplained)
                                                                             or "none") + ".", "",
              "Cells missing from the grids (rows that cover them show only the cells that ran, or *not run*):", ""]
    lines += [f"- `{x}`" for x in not_run] or ["- none"]
    lines += _wape_section(report.get("wape_cells") or [])
    lines += ["", "## Quotes", "", "| entry | line | quote | note |", "|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| `{r['id']}` | {r['line']} | \"{r['quote']}\" | {r['note'] or '-'} |")
    lines += ["", "![paper vs ours](paper_vs_ours.png)", ""]
    return "\n".join(lines)


def _wape_section(cells: list[dict]) -> list[str]:
    if not cells:
        return []
    within = sum(c["within"] for c in cells)
    agentic = [c for c in cells if c["task"] != "math"]
    lines = ["", "## Decode-admission WAPE beside prefill WAPE, per cell", "",
             f"Decode within {WAPE_BAR:g}x of prefill in **{within} of {len(cells)}** cells and loads (the adaptive "
             "runs' forecast against what happened, every 10 s window, mean over the seeds)."]
    if agentic:
        lines.append(f"Agentic cells (what the paper's Figure 8 reports, for MiMo-V2.5-Pro): prefill "
                     f"{100 * min(c['prefill'] for c in agentic):.1f}-{100 * max(c['prefill'] for c in agentic):.1f} %, "
                     f"decode {100 * min(c['decode'] for c in agentic):.1f}-"
                     f"{100 * max(c['decode'] for c in agentic):.1f} %.")
    lines += ["", "| cell | seeds | prefill WAPE | decode WAPE | decode / prefill | within |", "|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c['cell']} | {c['seeds'] or '-'} | {100 * c['prefill']:.1f} % | {100 * c['decode']:.1f} % | "
                     f"{c['ratio']:.2f} | {'yes' if c['within'] else '**no**'} |")
    return lines


def _regenerate(grids: dict[str, dict]) -> list[str]:
    """The one command that reruns the grids (the first grid's settings) and this report."""
    if not grids:
        return []
    first = next(iter(grids.values()))
    a = (first.get("merged_from") or [first.get("args", {})])[0]
    flags = f"--seeds {a.get('seeds', 2)} --async-measured {a.get('async_measured', 4)} --jobs 2"
    return [f"Regenerate from scratch (grids into `/tmp/paper_grids`, minutes to an hour on 2 cores): `python "
            f"benchmarks/bench_paper.py --run --models {' '.join(grids)} {flags}`.", ""]


def _cells_text(r: dict) -> str:
    if not r["cells_top"]:
        return "-"
    text = ", ".join(f"{c} {fmt(v)}" for c, v in r["cells_top"])
    text += f" (GPU-bound: {len(r['gpu_bound'])} of {len(r['cells_top'])}"
    if r.get("undefined"):
        text += "; no finite value: " + ", ".join(r["undefined"])
    return text + (f"; {len(r['missing'])} cells not run)" if r["missing"] else ")")


def _grid_command(args: dict) -> str:
    if not args:
        return "-"
    keep = []
    for k in ("model", "presets", "staleness", "seeds", "async_measured", "jobs", "wide", "no_speed", "loads"):
        v = args.get(k)
        if v in (None, "False", "[]", "", "{}"):
            continue
        flag = "--" + k.replace("_", "-")
        if isinstance(v, str) and v.startswith("["):  # grid.json keeps list flags as their repr
            try:
                v = " ".join(str(x) for x in ast.literal_eval(v))
            except (ValueError, SyntaxError):
                pass
        keep.append(flag if v == "True" else f"{flag} {v}")
    return "`bench_sim_grid.py " + " ".join(keep) + "`"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if paper_interval(r) is not None and r["verdict"] != "not measured"]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["unit"], []).append(r)
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 1.2 + 0.32 * len(rows)),
                             gridspec_kw={"height_ratios": [len(v) + 1 for v in groups.values()]}, squeeze=False)
    colours = {"agree": "tab:green", "disagree-explained": "tab:orange", "disagree-unexplained": "tab:red",
               "not run": "tab:gray"}

    def interval(ax, lo, hi, y, colour, lw, alpha=1.0):
        ax.hlines(y, lo, hi, color=colour, lw=lw, alpha=alpha)
        ax.plot([lo, hi], [y, y], "|", color=colour, ms=2 * lw + 4, mew=2, alpha=alpha)  # points stay visible

    for ax, (unit, rs) in zip(axes[:, 0], groups.items()):
        for i, r in enumerate(rs):
            plo, phi = paper_interval(r) or (0.0, 0.0)
            interval(ax, plo, phi, i - 0.2, "black", 4)
            colour = colours.get(r["verdict"], "tab:gray")
            if r["ours_top"]:
                interval(ax, *r["ours_top"], i + 0.05, colour, 4)
            if r["ours_light"]:
                interval(ax, *r["ours_light"], i + 0.3, colour, 2, 0.45)
        ax.set_yticks(range(len(rs)))
        ax.set_yticklabels([r["id"] for r in rs], fontsize=7)
        ax.set_ylim(len(rs) - 0.4, -0.6)
        if unit != "prefill of 8 instances":
            ax.set_xscale("log")
        ax.set_xlabel({"x": "ratio (x)", "%": "percent", "s": "seconds"}.get(unit, unit), fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="black", lw=4, label="paper")] + [
        Line2D([], [], color=c, lw=4, label=f"ours, top load: {v}") for v, c in colours.items()] + [
        Line2D([], [], color="tab:gray", lw=2, alpha=0.45, label="ours, light load (thin, below)")]
    axes[0, 0].legend(handles=handles, fontsize=7, loc="upper right")
    axes[0, 0].set_title("The paper's number (black) vs ours per entry", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----- inputs -----
def load_grids(specs: list[str]) -> dict[str, dict]:
    """``MODEL=DIR`` -> {model: grid}; a model given twice gets the rows of both (the first copy of a cell wins)."""
    grids: dict[str, dict] = {}
    for spec in specs:
        model, eq, folder = spec.partition("=")
        if not eq or not model or not folder:
            raise SystemExit(f"--grid {spec!r}: expected MODEL=DIR")
        path = Path(folder) / "grid.json"
        if not path.is_file():
            raise SystemExit(f"--grid {spec!r}: no {path}")
        grid = json.loads(path.read_text())
        if grid.get("model") not in (None, model):
            raise SystemExit(f"--grid {spec!r}: {path} is a grid of {grid.get('model')!r}")
        if model in grids:
            grids[model] = merge(grids[model], grid)
        else:
            grids[model] = grid | {"merged_from": grid.get("merged_from", [grid.get("args", {})])}
    return grids


def merge(a: dict, b: dict) -> dict:
    """The rows of both grids; a cell and load in both is the first grid's row, with the columns only the second
    has added (``filled_from``: which, and that grid's seeds): a later, smaller run can measure a quantity the
    first did not record without replacing the rows it did."""
    from sglang_prorsa.sim.report import row_key

    out = dict(a)
    for key in ("rows", "wide"):
        mine = {row_key(r): dict(r) for r in a.get(key) or []}
        extra = []
        for r in b.get(key) or []:
            first = mine.get(row_key(r))
            if first is None:
                extra.append(r)
                continue
            added = _fill(first, r)
            if added:
                first["filled_from"] = first.get("filled_from", []) + [{"columns": added, "seeds": r.get("seeds")}]
        out[key] = list(mine.values()) + extra
    if a.get("rows") and b.get("rows"):
        _mark_gpu_bound(out["rows"])
    out["merged_from"] = a.get("merged_from", []) + b.get("merged_from", [b.get("args", {})])
    out["wall_s"] = a.get("wall_s", 0.0) + b.get("wall_s", 0.0)
    return out


def _fill(first: dict, later: dict, prefix: str = "") -> list[str]:
    """Copy into ``first`` what only ``later`` has: absent or None values, recursing into dicts both have (a mode's
    entry of a per-mode column). Returns the dotted paths filled."""
    filled = []
    for key, value in later.items():
        mine = first.get(key)
        if isinstance(mine, dict) and isinstance(value, dict):
            first[key] = dict(mine)
            filled += _fill(first[key], value, f"{prefix}{key}.")
        elif mine is None and value is not None:
            first[key] = value
            filled.append(prefix + key)
    return filled


def _mark_gpu_bound(rows: list[dict]) -> None:
    """The grid's own GPU-bound rule (bench_sim_grid.mark_gpu_bound), again over a merged load ladder."""
    import importlib.util

    grid = sys.modules.get("bench_sim_grid")
    if grid is None:
        spec = importlib.util.spec_from_file_location("bench_sim_grid", HERE / "bench_sim_grid.py")
        assert spec is not None and spec.loader is not None
        grid = importlib.util.module_from_spec(spec)
        sys.modules["bench_sim_grid"] = grid  # its dataclasses look their module up by name
        spec.loader.exec_module(grid)
    grid.mark_gpu_bound(rows)


def _has_wide_shape(model: str) -> bool:
    """Whether the model file gives a wide decode shape (``bench_sim_grid.py --wide`` fails without one)."""
    from sglang_prorsa.sim.config import load_model

    return getattr(load_model(model), "decode_wide", None) is not None


def run_grids(args, missing: list[str]) -> tuple[list[str], dict[str, float]]:
    """Run bench_sim_grid.py for each model lacking a grid, one after another (progress: its tqdm bars)."""
    specs, wall = [], {}
    stage_specific = {m for e in json.loads(NUMBERS.read_text())["entries"]
                      if e["quantity"] == "stage_specific_speedup" for m in e["models"]}
    for i, model in enumerate(missing, 1):
        out = args.work / model
        cmd = [sys.executable, str(HERE / "bench_sim_grid.py"), "--model", model, "--seeds", str(args.seeds),
               "--jobs", str(args.jobs), "--async-measured", str(args.async_measured), "--no-speed",
               "--out", str(out)]
        if model in stage_specific and _has_wide_shape(model):
            cmd.append("--wide")
        if args.presets:
            cmd += ["--presets", *args.presets]
        if args.staleness:
            cmd += ["--staleness", *map(str, args.staleness)]
        cmd += shlex.split(args.grid_args)
        print(f"[bench_paper] grid {i}/{len(missing)}: {model}: {' '.join(cmd[1:])}", flush=True)
        started = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall[model] = time.perf_counter() - started
        print(f"[bench_paper] grid {model} done in {wall[model]:.0f} s", flush=True)
        specs.append(f"{model}={out}")
    return specs, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", nargs="*", default=[], metavar="MODEL=DIR",
                    help="a bench_sim_grid.py --out folder (with grid.json) per model; a model may repeat")
    ap.add_argument("--run", action="store_true", help="run bench_sim_grid.py for each of --models without a --grid")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--work", type=Path, default=Path("/tmp/paper_grids"), help="--out of the grids --run runs")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--async-measured", type=int, default=4)
    ap.add_argument("--presets", nargs="+", default=[], help="restrict the grids --run runs")
    ap.add_argument("--staleness", nargs="+", type=int, default=[], help="restrict the grids --run runs")
    ap.add_argument("--grid-args", default="", help="more bench_sim_grid.py flags for --run, one string")
    ap.add_argument("--numbers", type=Path, default=NUMBERS)
    ap.add_argument("--explanations", type=Path, default=EXPLANATIONS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    specs, wall = list(args.grid), {}
    if args.run:
        have = {s.partition("=")[0] for s in specs}
        more, wall = run_grids(args, [m for m in args.models if m not in have])
        specs += more
    grids = load_grids(specs)
    numbers = json.loads(args.numbers.read_text())
    explanations = {e["id"]: e for e in json.loads(args.explanations.read_text())["explanations"]} \
        if args.explanations.is_file() else {}
    report = build_report(numbers, explanations, grids)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_paper.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report |= {"command": command, "grids": {m: g.get("merged_from") for m, g in grids.items()}, "wall_s": wall}
    (args.out / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str))
    (args.out / "README.md").write_text(markdown(report, grids, command, wall))
    plot(report, args.out / "paper_vs_ours.png")
    for r in report["rows"]:
        print(f"{r['id']:<40}{fmt_paper(r):>22}{fmt_span(r['ours_top'], r['unit']):>22}  {r['verdict']}"
              + (f"  [{r['direction']}]" if r["direction"] else ""))
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in report["counts"].items()))
    print(f"wrote {args.out}/report.json, README.md, paper_vs_ours.png")


if __name__ == "__main__":
    main()
