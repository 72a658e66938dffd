"""The locally generated model: deterministic to the byte, and its options really change it."""

from __future__ import annotations

import filecmp
import json

import pytest

from sglang_prorsa.testing.tiny_model import TinyModelSpec, generate, main

SMALL = TinyModelSpec(layers=1, hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=400)


def _files(d):
    return sorted(p.name for p in d.iterdir())


def test_same_options_give_byte_identical_files(tmp_path):
    a, b = generate(SMALL, tmp_path / "a"), generate(SMALL, tmp_path / "b")
    names = _files(a)
    assert names == _files(b)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert mismatch == [] and errors == [] and sorted(match) == names


def test_seed_changes_weights_but_not_shapes(tmp_path):
    a = generate(SMALL, tmp_path / "a")
    c = generate(TinyModelSpec(**{**SMALL.__dict__, "seed": 1}), tmp_path / "c")
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert json.loads((a / "config.json").read_text())["hidden_size"] == 64


def test_config_follows_options(tmp_path):
    out = generate(SMALL, tmp_path / "m")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (1, 2, 1)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == cfg["vocab_size"] <= 400
    ids = tok("the agent calls a tool")["input_ids"]
    assert tok.decode(ids) == "the agent calls a tool"  # byte-level BPE round-trips


def test_cli_refuses_a_non_empty_output_dir(tmp_path, capsys):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--layers", "1"])
    assert e.value.code == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "x").read_text() == "keep me"
