"""benchmarks/bench_paper.py: the paper's numbers beside ours, the matching and verdict rules, hand-computed."""

from __future__ import annotations

import json

import pytest
from unit_support import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def bp():
    return load_benchmark("bench_paper")


def _row(preset, staleness, groups, colo, adaptive, *, shape="same", bound=False, interference=0.05, wape=None,
         best="2:6", paper_static=None, completion=None):
    return {"preset": preset, "staleness": staleness, "groups": groups, "decode_shape": shape, "gpu_bound": bound,
            "colocated_s": colo, "adaptive_s": adaptive, "best_static": best, "best_static_s": adaptive,
            "interference": {"colocated": interference, "best static": 0.0, "adaptive": 0.0},
            "wape_prefill": wape, "wape_decode": wape,
            "baselines": {"paper optimum": {"label": "5:3", "static_s": paper_static}},
            "completion_mean_s": completion or {"colocated": 2 * adaptive, "best static": adaptive,
                                                "adaptive": adaptive}}


GRID = {"model": "mimo_v25_pro", "args": {"model": "mimo_v25_pro", "seeds": "2"}, "wall_s": 10.0, "rows": [
    _row("coding_agent", 0, 16, 90.0, 100.0, interference=0.02),
    _row("coding_agent", 0, 32, 200.0, 100.0, bound=True, interference=0.04, wape=1.5, best="1:7", paper_static=120.0,
         completion={"colocated": 400.0, "adaptive": 200.0}),
    _row("general_agent", 0, 32, 300.0, 100.0, interference=0.03, wape=0.1, best="3:5", paper_static=90.0,
         completion={"colocated": 150.0, "adaptive": 50.0}),
], "wide": [_row("coding_agent", 0, 32, 200.0, 80.0, shape="wide")]}


def _entry(**kw):
    base = {"id": "x", "figure": "Figure 5", "models": ["mimo_v25_pro"], "tasks": ["coding_agent", "general_agent"],
            "staleness": [0, 2], "quantity": "rollout_speedup_over_colocation", "kind": "range",
            "value": [1.11, 4.05], "unit": "x", "quote": "q", "line": 1}
    return base | kw


def test_measure_takes_each_cells_top_and_light_load_and_lists_missing_cells(bp):
    grids = {"mimo_v25_pro": GRID}
    top = bp.measure(_entry(), grids, "top")
    # coding/0 top load 32: 200 / 100 = 2.0; general/0 (one load) 300 / 100 = 3.0
    assert top["values"] == [("mimo/coding/0@32", 2.0), ("mimo/general/0@32", 3.0)]
    assert top["missing"] == ["mimo/coding/2", "mimo/general/2"]
    assert top["gpu_bound"] == ["mimo/coding/0@32"]
    assert bp.span(top["values"]) == (2.0, 3.0)
    light = bp.measure(_entry(), grids, "light")  # general has one load: no light value
    assert light["values"] == [("mimo/coding/0@16", 0.9)]
    assert bp.measure(_entry(models=["deepseek_v32"]), grids)["values"] == []


def test_row_quantities_by_hand(bp):
    grids = {"mimo_v25_pro": GRID}
    one = dict(tasks=["coding_agent"], staleness=[0])
    value = lambda q: bp.measure(_entry(quantity=q, **one), grids)["values"][0][1]  # noqa: E731
    assert value("step_time_over_colocation") == pytest.approx(0.5)
    assert value("colocated_interference_idle_pct") == pytest.approx(4.0)
    assert value("switching_speedup_over_paper_optimum") == pytest.approx(1.2)  # 120 / 100
    assert value("best_static_prefill_of_8") == 1.0
    assert value("trajectory_completion_ratio") == pytest.approx(2.0)  # 400 / 200
    assert value("trajectory_completion_adaptive_s") == 200.0
    assert value("wape_prefill_pct") == pytest.approx(150.0)
    assert value("stage_specific_speedup") == pytest.approx(1.25)  # same-shape adaptive 100 / wide 80
    ratio = bp.measure(_entry(quantity="coding_over_general_completion", staleness=[0]), grids)["values"]
    assert ratio == [("mimo/coding@32+general@32/0", pytest.approx(4.0))]  # 200 / 50


def test_agree_rule_boundaries(bp):
    rng = _entry()  # paper 1.11-4.05: overlap, touching counts
    assert bp.agrees(rng, (0.5, 1.11)) and not bp.agrees(rng, (0.5, 1.10))
    assert bp.agrees(rng, (4.05, 9.0)) and not bp.agrees(rng, (4.06, 9.0))
    assert bp.agrees(rng, (0.1, 10.0))  # ours contains the paper's range
    one = _entry(kind="value", value=26.0, unit="%")  # +-20 %: [20.8, 31.2]
    assert bp.agrees(one, (31.2, 31.2)) and bp.agrees(one, (20.8, 20.8))
    assert not bp.agrees(one, (31.3, 31.3)) and not bp.agrees(one, (20.7, 20.7))
    assert bp.agrees(one, (10.0, 21.0))  # our range reaches the band
    most = _entry(kind="max", value=26.0, unit="%")  # "up to 26": our maximum within the band
    assert bp.agrees(most, (1.0, 20.8)) and not bp.agrees(most, (1.0, 20.7))
    assert not bp.agrees(most, (25.0, 40.0))


def test_direction_flags(bp):
    assert bp.direction_flag(_entry(), (0.5, 0.9)) == ("PD (adaptive) slower than colocation here; PD (adaptive) "
                                                       "faster than colocation in the paper")
    assert bp.direction_flag(_entry(), (0.5, 1.2)) is None  # not wholly on the other side
    math = _entry(quantity="step_time_over_colocation", value=[0.86, 1.28])
    assert bp.direction_flag(math, (0.5, 0.7)) is None  # the paper's range straddles 1
    best = _entry(quantity="best_static_prefill_of_8", kind="value", value=5, unit="prefill of 8 instances")
    assert bp.direction_flag(best, (1.0, 2.0)).startswith("different best ratio")
    assert bp.direction_flag(best, (5.0, 5.0)) is None
    wape = _entry(quantity="wape_prefill_pct", value=[5.40, 14.37], unit="%")
    assert bp.direction_flag(wape, (150.0, 300.0)) == "an order of magnitude apart"  # 150 >= 10 x 14.37
    assert bp.direction_flag(wape, (140.0, 300.0)) is None
    assert bp.direction_flag(wape, (0.1, 0.5)) == "an order of magnitude apart"  # 0.5 x 10 <= 5.40


def test_verdicts(bp):
    entry = _entry()
    assert bp.verdict(entry, (2.0, 3.0), None) == "agree"
    assert bp.verdict(entry, (0.5, 0.9), None) == "disagree-unexplained"
    assert bp.verdict(entry, None, None) == "not run"
    assert bp.verdict(_entry(kind="none", value=None), None, None) == "no number in the text"
    assert bp.verdict(_entry(quantity="model_input", kind="value", value=1.0), (1.0, 1.0), None) == "not measured"
    text_only = {"id": "x", "explanation": "interference is small"}
    assert bp.verdict(entry, (0.5, 0.9), text_only) == "disagree-unexplained"  # names no measurement
    named = text_only | {"measurement": {"what": "colocated interference share", "columns": ["interference.colocated"]}}
    assert bp.verdict(entry, (0.5, 0.9), named) == "disagree-explained"
    assert bp.verdict(entry, (0.5, 0.9), named, measured={}) == "disagree-unexplained"  # columns found nowhere
    found = bp.measured_columns(entry, named, {"mimo_v25_pro": GRID})
    assert found == {"interference.colocated": [("mimo/coding/0@32", 0.04), ("mimo/general/0@32", 0.03)]}
    assert bp.verdict(entry, (0.5, 0.9), named, measured=found) == "disagree-explained"
    missing = named | {"measurement": {"what": "w", "columns": ["no.such.column"]}}
    assert bp.measured_columns(entry, missing, {"mimo_v25_pro": GRID}) == {}
    # "wide:" reads the wide-decode rows; "groups" picks that load instead of the top one
    wide = named | {"measurement": {"what": "w", "tasks": ["coding_agent"], "staleness": [0], "groups": 16,
                                    "columns": ["wide:adaptive_s", "adaptive_s"]}}
    assert bp.measured_columns(entry, wide, {"mimo_v25_pro": GRID}) == {"adaptive_s": [("mimo/coding/0@16", 100.0)]}
    wide["measurement"]["groups"] = 32
    assert bp.measured_columns(entry, wide, {"mimo_v25_pro": GRID}) == {
        "wide:adaptive_s": [("mimo/coding/0@32", 80.0)], "adaptive_s": [("mimo/coding/0@32", 100.0)]}


def test_report_end_to_end_from_a_grid_folder(bp, tmp_path):
    folder = tmp_path / "mimo"
    folder.mkdir()
    (folder / "grid.json").write_text(json.dumps(GRID))
    grids = bp.load_grids([f"mimo_v25_pro={folder}"])
    numbers = {"entries": [
        _entry(id="speedup"),  # ours 2.0-3.0 overlaps 1.11-4.05
        _entry(id="idle", quantity="colocated_interference_idle_pct", kind="max", value=26.0, unit="%"),  # max 4 %
        _entry(id="idle2", quantity="colocated_interference_idle_pct", kind="max", value=26.0, unit="%"),
        _entry(id="fig", kind="none", value=None),
        _entry(id="ds", models=["deepseek_v32"]),
    ]}
    explanations = {"idle2": {"id": "idle2", "explanation": "interference is a few %",
                              "measurement": {"what": "colocated interference", "columns": ["interference.colocated"]}}}
    report = bp.build_report(numbers, explanations, grids)
    verdicts = {r["id"]: r["verdict"] for r in report["rows"]}
    assert verdicts == {"speedup": "agree", "idle": "disagree-unexplained", "idle2": "disagree-explained",
                        "fig": "no number in the text", "ds": "not run"}
    assert report["counts"] == {"agree": 1, "disagree-unexplained": 1, "disagree-explained": 1,
                                "no number in the text": 1, "not run": 1}
    assert next(r for r in report["rows"] if r["id"] == "idle")["direction"] is None  # 3-4 % vs 26 %: 6.5x apart
    text = bp.markdown(report, grids, "python benchmarks/bench_paper.py --grid ...", {})
    assert "| `idle2`" in text and "interference is a few %" in text and "not run" in text
    bp.plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_load_grids_merges_a_model_given_twice(bp, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "grid.json").write_text(json.dumps(GRID | {"rows": GRID["rows"][:1]}))
    (b / "grid.json").write_text(json.dumps(GRID | {"rows": GRID["rows"][1:]}))
    merged = bp.load_grids([f"mimo_v25_pro={a}", f"mimo_v25_pro={b}"])["mimo_v25_pro"]
    assert [(r["preset"], r["groups"]) for r in merged["rows"]] == [("coding_agent", 16), ("coding_agent", 32),
                                                                   ("general_agent", 32)]
    coding32 = merged["rows"][1]
    assert coding32["growth_over_half_load"] == 1.0 and coding32["gpu_bound"] is False  # remarked: 100 vs 100
    with pytest.raises(SystemExit):
        bp.load_grids([f"deepseek_v32={a}"])  # a grid of another model


def test_paper_numbers_and_explanations_are_well_formed(bp):
    numbers = json.loads((BENCHMARKS / "paper_numbers.json").read_text())["entries"]
    ids = [e["id"] for e in numbers]
    assert len(ids) == len(set(ids))
    known = set(bp.ROW_QUANTITIES) | bp.NOT_MEASURED | {"stage_specific_speedup", "coding_over_general_completion"}
    for e in numbers:
        assert e["kind"] in ("range", "value", "max", "none"), e["id"]
        assert e["quantity"] in known, e["id"]
        assert (e["value"] is None) == (e["kind"] == "none"), e["id"]
        if e["kind"] == "range":
            assert e["value"][0] <= e["value"][1], e["id"]
        assert e["quote"] and e["line"] > 0 and e["figure"], e["id"]
    explanations = json.loads((BENCHMARKS / "paper_explanations.json").read_text())["explanations"]
    for x in explanations:
        assert x["id"] in ids, x["id"]
        assert bp.valid_explanation(x), x["id"]


def test_every_quote_is_on_its_line_of_the_paper(bp):
    if not bp.PAPER_TEXT.is_file():
        pytest.skip(f"{bp.PAPER_TEXT} is not here")
    lines = bp.PAPER_TEXT.read_text(encoding="utf-8").split("\n")
    for e in json.loads((BENCHMARKS / "paper_numbers.json").read_text())["entries"]:
        assert e["quote"] in lines[e["line"] - 1], f"{e['id']}: not on line {e['line']}"


def test_merge_keeps_the_first_row_and_adds_only_columns_it_lacks(bp):
    first = GRID | {"rows": [_row("general_agent", 0, 32, 300.0, 100.0) | {
        "seeds": 12, "completion_engine_s": {"colocated": None, "adaptive": 250.0}}]}
    later = {"rows": [_row("general_agent", 0, 32, 999.0, 1.0) | {
        "seeds": 2, "completion_environment_s": {"colocated": 88.0, "adaptive": 87.0},
        "completion_engine_s": {"colocated": 400.0, "adaptive": 1.0}}]}
    merged = bp.merge(first, later)
    (row,) = merged["rows"]
    assert row["colocated_s"] == 300.0 and row["seeds"] == 12  # the first grid's numbers stay
    assert row["completion_environment_s"] == {"colocated": 88.0, "adaptive": 87.0}
    assert row["completion_engine_s"] == {"colocated": 400.0, "adaptive": 250.0}  # only the missing mode is taken
    assert row["filled_from"] == [{"columns": ["completion_environment_s", "completion_engine_s.colocated"],
                                   "seeds": 2}]
    assert "completion_environment_s" not in first["rows"][0]  # the input grid is not changed
    assert first["rows"][0]["completion_engine_s"]["colocated"] is None


def test_wape_cells_compare_decode_with_prefill_per_cell(bp):
    rows = [_row("coding_agent", 2, 16, 1.0, 1.0) | {"wape_prefill": 0.10, "wape_decode": 0.19, "seeds": 12},
            _row("general_agent", 8, 8, 1.0, 1.0) | {"wape_prefill": 0.10, "wape_decode": 0.21},
            _row("math", 0, 256, 1.0, 1.0) | {"wape_prefill": None, "wape_decode": 0.5},  # no prefill: not a cell
            _row("coding_agent", 0, 32, 1.0, 1.0, shape="wide") | {"wape_prefill": 0.1, "wape_decode": 0.1}]
    cells = bp.wape_cells({"mimo_v25_pro": {"rows": rows[:3], "wide": rows[3:]}})
    assert [(c["cell"], round(c["ratio"], 2), c["within"]) for c in cells] == [
        ("mimo/coding/2@16", 1.9, True), ("mimo/general/8@8", 2.1, False)]
    text = "\n".join(bp._wape_section(cells))
    assert "within 2x of prefill in **1 of 2**" in text and "| mimo/general/8@8 | - | 10.0 % | 21.0 % | 2.10 | **no** |" in text


def test_the_simulators_paper_optima_are_the_quoted_ones(bp):
    from sglang_prorsa.sim.paper import PAPER_OPTIMA, paper_optima_text

    quoted = {e["tasks"][0]: e["value"] for e in json.loads((BENCHMARKS / "paper_numbers.json").read_text())["entries"]
              if e["quantity"] == "best_static_prefill_of_8"}
    assert quoted == {task: p for task, (p, _) in PAPER_OPTIMA.items()}
    assert all(p + d == 8 for p, d in PAPER_OPTIMA.values())
    assert paper_optima_text() == "math 4:4, coding 5:3, general 3:5"
