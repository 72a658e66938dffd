"""fit.py recovers known parameters and refuses non-loopback servers."""

import json

import numpy as np
import pytest

from sglang_prorsa.sim.__main__ import main as cli
from sglang_prorsa.sim.config import load_model
from sglang_prorsa.sim.fit import fit_decode, fit_model, fit_prefill, measure, nonnegative_lstsq
from sglang_prorsa.sim.perf_model import PerfModel


def test_fit_recovers_the_model_it_sampled():
    perf = PerfModel(load_model("mimo_v25_pro"))
    pre = [[n, c, perf.prefill_iteration_s(n, c)] for n in (256, 1024, 4096) for c in (0, 8192, 65536)]
    dec = [[b, b * c, perf.decode_step_s(b, b * c)] for b in (1, 8, 32) for c in (1000, 30000)]
    p, r2p = fit_prefill(pre)
    d, r2d = fit_decode(dec)
    truth = perf.model
    assert p["per_token_s"] == pytest.approx(truth.prefill.per_token_s, rel=1e-6)
    assert p["per_token_ctx_s"] == pytest.approx(truth.prefill.per_token_ctx_s, rel=1e-6)
    assert d["per_seq_s"] == pytest.approx(truth.decode.per_seq_s, rel=1e-6)
    assert r2p == pytest.approx(1.0) and r2d == pytest.approx(1.0)


def test_nonnegative_lstsq_drops_negative_terms():
    x = np.arange(1, 7, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    coef = nonnegative_lstsq(design, 10.0 - 0.5 * x)  # the unconstrained slope is negative
    assert (coef >= 0).all() and coef[1] == 0.0


def test_fit_command_writes_a_loadable_config(tmp_path):
    samples = {"prefill": [[1000, 0, 0.05], [2000, 0, 0.09], [4000, 0, 0.17], [4000, 8000, 0.2]],
               "decode": [[1, 1000, 0.021], [8, 8000, 0.028], [32, 32000, 0.05]]}
    src, out = tmp_path / "s.json", tmp_path / "m.json"
    src.write_text(json.dumps(samples))
    assert cli(["fit", "--samples", str(src), "--out", str(out)]) == 0
    cfg = load_model(str(out))
    assert "fitted" in cfg.sources["prefill"] and cfg.decode.per_seq_s > 0


def test_live_measurement_is_loopback_only():
    with pytest.raises(ValueError, match="loopback"):
        measure("http://10.0.0.1:30000", [128], [1])


def test_pd_overhead_becomes_the_transfer_latency():
    perf = PerfModel(load_model("tiny_cpu"))
    lengths = (64, 256, 1024, 2048, 3072)
    samples = {"prefill": [[n, 0, perf.prefill_iteration_s(n, 0)] for n in lengths],
               "decode": [[b, b * 300, perf.decode_step_s(b, b * 300)] for b in (1, 4, 8, 16)],
               "pd_prefill": [[n, 0, perf.prefill_iteration_s(n, 0) + 0.07 + (0.5 if n == 64 else 0.0)]
                              for n in lengths]}
    config, lines = fit_model(samples, "tiny_cpu", "test")
    assert config["transfer_latency_s"] == pytest.approx(0.07, abs=1e-9)  # the median ignores one outlier
    assert "median PD overhead over 5" in config["sources"]["transfer_latency_s"]
    assert any(line.startswith("PD overhead") for line in lines)
    without = fit_model({k: v for k, v in samples.items() if k != "pd_prefill"}, "tiny_cpu", "test")[0]
    assert without["transfer_latency_s"] == load_model("tiny_cpu").transfer_latency_s


@pytest.mark.parametrize("content, says", [
    (None, "FileNotFoundError"),
    ("not json", "JSONDecodeError"),
    ("[]", "samples must be a JSON object"),
    ('{"prefil": []}', "unknown samples key 'prefil'"),
    ('{"prefill": 3}', "samples['prefill'] must be a list"),
    ('{"decode": [[1, 2, 0.1], [1, 2, "a"]]}', "samples['decode'][1] must be [n, context, seconds]"),
    ('{"prefill": [[1, 2, -0.1]]}', "samples['prefill'][0] must be [n, context, seconds] of numbers >= 0"),
])
def test_fit_rejects_a_bad_samples_file_naming_what_is_wrong(tmp_path, capsys, content, says):
    src, out = tmp_path / "samples.json", tmp_path / "fitted.json"
    if content is not None:
        src.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        cli(["fit", "--samples", str(src), "--out", str(out)])
    assert exit_info.value.code == 2 and says in capsys.readouterr().err
    assert not out.exists()  # nothing half-written
