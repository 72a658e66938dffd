"""The held-out family of settings kept in the repository (benchmarks/forecast_settings.json): exactly what its
generator script writes for the recorded seed, large enough, and covering every dimension value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_prorsa.workload.family import DIMENSIONS, spec_from_params
from sglang_prorsa.workload.hints import HINT_SETS

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = ROOT / "benchmarks" / "forecast_settings.json"
SCRIPT = ROOT / "benchmarks" / "make_forecast_settings.py"


@pytest.fixture(scope="module")
def document() -> dict:
    return json.loads(SETTINGS.read_text())


def test_the_committed_file_is_what_the_script_writes_for_its_seed(document, tmp_path):
    out = tmp_path / "settings.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONSAFEPATH="1")
    subprocess.run([sys.executable, str(SCRIPT), "--seed", str(document["seed"]), "--count", str(document["count"]),
                    "--out", str(out)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    assert out.read_bytes() == SETTINGS.read_bytes()


def test_enough_settings_each_with_an_id_a_seed_and_every_parameter(document):
    settings = document["settings"]
    assert len(settings) >= 50 and document["count"] == len(settings)
    assert len({s["id"] for s in settings}) == len(settings)
    assert len({s["seed"] for s in settings}) == len(settings)
    keys = set(settings[0])
    assert {"id", "seed", "duration_s", "prefill_instances", "decode_kv_tokens", *DIMENSIONS} <= keys
    for s in settings:
        assert set(s) == keys
        spec = spec_from_params(s)  # every parameter the workload needs is in the entry
        assert spec.rollout.concurrency >= 1 and s["duration_s"] >= 1010  # >= ~100 scored 10 s windows


def test_every_dimension_value_appears(document):
    settings = document["settings"]
    seen = {name: {s[name] for s in settings} for name in DIMENSIONS}
    for name, (values, _) in DIMENSIONS.items():
        assert set(values) <= seen[name], name
    # the values the family is meant to span, whatever the file's own list says
    assert {"lognormal", "gamma", "weibull", "bimodal"} <= seen["tool_shape"]
    assert min(seen["live"]) == 32 and max(seen["live"]) == 1024
    assert {"async", "sync"} <= seen["mode"] and len(seen["group_size"]) >= 4
    assert None in seen["cold_fraction"] and {0.0, 1.0} <= seen["cold_fraction"]  # no sandbox, all prewarm, all cold
    assert 1 in seen["turns"] and max(seen["turns"]) >= 32
    assert set(HINT_SETS) == seen["hints"] and {"no_sandbox", "no_tool", "no_reward", "none"} <= seen["hints"]
    assert {"idle", "saturated"} <= seen["prefill_load"] and {"unbounded", "full"} <= seen["decode_kv"]
    sync = [s for s in settings if s["mode"] == "sync"]
    assert all(s["train_gap_s"] > 0 for s in sync)
    assert any(s["weights_updated_before_s"] is None for s in sync)
    assert any(s["weights_updated_before_s"] is not None for s in sync)
    spread = [s["tool_scale"] for s in settings]
    assert min(spread) < 0.5 and max(spread) > 2.0


def test_capacities_span_idle_to_saturated(document):
    settings = document["settings"]
    util = {load: [s["est_prefill_util"] for s in settings if s["prefill_load"] == load]
            for load in ("idle", "saturated")}
    assert max(util["idle"]) < 0.15 and min(util["saturated"]) > 1.2  # a prefill queue that never drains
    full = [s for s in settings if s["decode_kv"] == "full"]
    assert full and all(s["decode_kv_tokens"] < 0.7 * s["est_decode_kv_demand"] for s in full)
    assert all(s["decode_kv_tokens"] is None for s in settings if s["decode_kv"] == "unbounded")
