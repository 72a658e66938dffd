"""`python -m sglang_prorsa.sim fit --url`: fit the simulator's perf model from timings of a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_fit_from_a_live_server(single_server, tmp_path):
    out, samples = tmp_path / "fitted.json", tmp_path / "samples.json"
    r = subprocess.run(
        [sys.executable, "-m", "sglang_prorsa.sim", "fit", "--url", single_server.url, "--base", "mimo_v25_pro",
         "--out", str(out), "--save-samples", str(samples), "--prompt-lengths", "64,128,256", "--batches", "1,2,4"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONSAFEPATH="1"))
    assert r.returncode == 0, r.stderr
    measured = json.loads(samples.read_text())
    assert [row[0] for row in measured["prefill"]] == [64, 128, 256]
    assert all(row[2] > 0 for row in measured["prefill"])
    assert [row[0] for row in measured["decode"]] == [1, 2, 4]
    fitted = json.loads(out.read_text())
    for stage in ("prefill", "decode"):
        assert "live /generate timing of http://127.0.0.1:" in fitted["sources"][stage]
        assert all(v >= 0 for v in fitted[stage].values())
    assert fitted["prefill"]["iter_base_s"] + fitted["prefill"]["per_token_s"] > 0
