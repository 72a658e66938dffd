"""A prefill/decode pair over Mooncake (TCP, loopback) must produce exactly what one colocated server produces."""

from __future__ import annotations

import pytest
from tests_support import PROMPTS, generate_ids, sampling
from transformers import AutoTokenizer

from sglang_prorsa.testing.pd import pd_generate

pytestmark = pytest.mark.integration

MAX_NEW = 32


def test_pd_pair_greedy_equals_colocated(single_server, pd_pair, tiny_model):
    prefill, decode, bootstrap_port = pd_pair
    tok = AutoTokenizer.from_pretrained(tiny_model)
    lengths = []
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        lengths.append(len(ids))
        expected = generate_ids(single_server.url, ids, MAX_NEW)
        got = pd_generate(prefill.url, decode.url, bootstrap_port,
                          {"input_ids": ids, "sampling_params": sampling(MAX_NEW)})
        assert got["output_ids"] == expected, f"prompt of {len(ids)} tokens diverged through the PD pair"
    assert max(lengths) > 64, "one prompt must span several chunked-prefill chunks"
