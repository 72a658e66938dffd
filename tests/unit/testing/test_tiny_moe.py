"""The locally generated MoE model: deterministic to the byte, keyed by its options, with the dense model's tokenizer."""

from __future__ import annotations

import filecmp
import json

from sglang_prorsa.testing.tiny_model import TinyModelSpec, ensure_default_model
from sglang_prorsa.testing.tiny_moe import TinyMoeSpec, ensure_moe_model, generate

SMALL = TinyMoeSpec(layers=1, hidden=32, heads=2, kv_heads=1, experts=4, top_k=2, moe_intermediate=16)


def test_same_options_give_byte_identical_files(tmp_path):
    tok = ensure_default_model(TinyModelSpec())
    a, b = generate(SMALL, tmp_path / "a", tok), generate(SMALL, tmp_path / "b", tok)
    names = sorted(p.name for p in a.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "prorsa_tiny_moe.json"} <= set(names)
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert mismatch == [] and errors == [] and sorted(match) == names
    assert (a / "tokenizer.json").read_bytes() == (tok / "tokenizer.json").read_bytes()
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2MoeForCausalLM"]
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["num_hidden_layers"]) == (4, 2, 1)


def test_options_change_the_key_and_the_cache_is_reused(tmp_path):
    assert TinyMoeSpec().key() != SMALL.key() != TinyMoeSpec(**{**SMALL.__dict__, "seed": 1}).key()
    first = ensure_moe_model(SMALL, cache=tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_moe_model(SMALL, cache=tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
