"""Perf model pieces with hand-computed values (perf_model.py)."""

import math

import pytest

from sglang_prorsa.sim.config import (
    DecodeParams,
    ModelConfig,
    PrefillParams,
    assumed_parameters,
    available_models,
    load_model,
)
from sglang_prorsa.sim.perf_model import PerfModel


def model(**over) -> ModelConfig:
    base = dict(
        name="toy", gpus_per_instance=4, dp_ranks=2, chunk_tokens=1000,
        prefill=PrefillParams(iter_base_s=0.01, per_token_s=1e-4, per_token_ctx_s=1e-8),
        decode=DecodeParams(iter_base_s=0.02, per_seq_s=0.001, per_ctx_token_s=1e-7),
        kv_tokens_per_rank=10_000, kv_bytes_per_token=1000, transfer_gbytes_per_s=1.0, transfer_latency_s=0.005,
    )
    base.update(over)
    return ModelConfig(**base)


def test_prefill_iteration_integrates_causal_context():
    perf = PerfModel(model())
    # 0.01 + 1e-4*1000 + 1e-8*1000*(500 + 1000/2) = 0.01 + 0.1 + 0.01
    assert perf.prefill_iteration_s(1000, 500) == pytest.approx(0.12)
    assert perf.prefill_iteration_s(0, 500) == 0.0


def test_prefill_request_is_chunked_and_skips_cached_prefix():
    perf = PerfModel(model())
    # 2500 tokens: chunks of 1000 (ctx 0), 1000 (ctx 1000), 500 (ctx 2000)
    expected = (0.01 + 0.1 + 1e-8 * 1000 * 500) + (0.01 + 0.1 + 1e-8 * 1000 * 1500) + (0.01 + 0.05 + 1e-8 * 500 * 2250)
    assert perf.prefill_request_s(2500) == pytest.approx(expected)
    # cached 2000: only the last 500 tokens, attending to 2000 earlier ones
    assert perf.prefill_request_s(2500, cached_tokens=2000) == pytest.approx(0.01 + 0.05 + 1e-8 * 500 * 2250)
    assert perf.chunks(2500) == 3


def test_decode_step_and_dp_synchronisation():
    perf = PerfModel(model())
    assert perf.decode_step_s(10, 50_000) == pytest.approx(0.02 + 0.01 + 0.005)
    assert perf.decode_step_s(0, 0) == 0.0
    # one rank prefills (0.12 s), the other decodes (0.035 s): the decoder idles 0.085 s (§3.2 interference)
    period, idle = perf.synchronised([0.12, 0.035])
    assert period == pytest.approx(0.12) and idle == pytest.approx(0.085)


def test_transfer_kv_capacity_and_theta():
    perf = PerfModel(model())
    # a rank of 2 GPUs sends its shards over 2 NICs of 1 GB/s: 2 GB of KV (2M tokens x 1000 B) in 1 s
    assert perf.transfer_s(2_000_000) == pytest.approx(1.0)
    assert perf.transfer_s(0) == 0.0
    assert perf.kv_tokens_per_instance == 20_000
    assert perf.max_running_per_instance == 2 * 16
    assert perf.profiled_theta(1000) == pytest.approx(2 * 1000 / perf.prefill_request_s(1000))
    assert perf.switch_s == 5.0


def test_cold_profile_is_instance_time():
    perf = PerfModel(model())
    points = dict(perf.cold_profile_points())
    assert points[4096] == pytest.approx(perf.prefill_request_s(4096) / 2)  # two ranks in parallel


def test_wide_decode_shape():
    cfg = load_model("mimo_v25_pro")
    wide = cfg.shape("wide")
    assert (wide.gpus_per_instance, wide.dp_ranks, wide.gpus_per_rank) == (32, 4, 8)
    assert wide.kv_tokens_per_rank > cfg.kv_tokens_per_rank and wide.prefill == cfg.prefill
    # Table 1: EP32 decode per server 1.31 vs EP16 1.20 at 8K, same batch per rank -> a step ~8 % shorter
    same, wider = PerfModel(cfg), PerfModel(cfg, wide)
    assert wider.decode_step_s(16, 16 * 8192) / same.decode_step_s(16, 16 * 8192) == pytest.approx(1.20 / 1.31,
                                                                                                  rel=0.01)
    with pytest.raises(ValueError, match="wide"):
        load_model("deepseek_v32").shape("wide")


CPU_MODELS = ("tiny_cpu",)  # the base bench_rollout.py --sim-predict fits to its own CPU instances


@pytest.mark.parametrize("name", available_models())
def test_shipped_model_configs_cite_their_sources(name):
    cfg = load_model(name)
    assert cfg.sources, "every shipped model must say where its numbers come from"
    for key in ("gpus_per_instance", "dp_ranks", "chunk_tokens", "switch_s", "max_running_per_rank",
                "reserved_decode_tokens", "transfer_gbytes_per_s", "kv_bytes_per_token", "kv_tokens_per_rank"):
        assert key in cfg.sources
    assert all(cfg.sources[k] for k in cfg.sources)
    perf = PerfModel(cfg)
    assert math.isfinite(perf.profiled_theta(8192))
    if name not in CPU_MODELS:  # GPU clusters: Appendix C's switch time, tens of ms per decode step at Table 1's batch
        assert cfg.switch_s == 5.0
        assert 0.01 < perf.decode_step_s(16, 16 * 8192) < 0.1


def test_model_config_rejects_unknown_fields():
    raw = load_model("mimo_v25_pro").to_dict() | {"bogus": 1}
    with pytest.raises(ValueError, match="bogus"):
        ModelConfig.from_dict(raw)


def test_mimo_kv_is_consistent_with_table_1():
    # Table 1 decodes 512K-token requests at batch 16 per attention DP rank on EP16
    assert load_model("mimo_v25_pro").kv_tokens_per_rank >= 16 * 512 * 1024


def test_assumed_parameters_are_listed():
    assumed = assumed_parameters(load_model("mimo_v25_pro"))
    assert "kv_bytes_per_token" in assumed and "max_running_per_rank" not in assumed  # Table 1: 16 per rank
    assert "kv_tokens_per_rank" not in assumed  # sourced from Table 1
