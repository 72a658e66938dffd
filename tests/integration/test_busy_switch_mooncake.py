"""The busy switch with the Mooncake Store as the KV store (the front starts its own mooncake_master on 127.0.0.1)."""

from __future__ import annotations


import pytest

from sglang_prorsa.testing.front_client import switch_under_load
from tests_support import arrange, distinct_prompts, generate, instances, run_all, running_front

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def front(tiny_model, log_dir):
    with running_front(log_dir, ["--prorsa-kv-store", "mooncake"]) as srv:
        yield srv


def test_decode_switch_resumes_from_the_mooncake_store(front):
    arrange(front, prefill=1, decode=2)
    prompts = distinct_prompts(8, lambda i: 40 + 7 * i, seed=5)
    max_new = 160
    reference = run_all(front, prompts, max_new)
    target = next(i for i in instances(front) if i["role"] == "decode")
    sw, results, _ = switch_under_load(front.url, lambda p: generate(front, p, max_new), prompts, target, "prefill",
                                       ready=lambda st: st["running"] >= 4, settle_s=0.5)
    assert sw.status_code == 200, sw.text
    assert sw.json()["migrated"] >= 4 and sw.json()["persisted_bytes"] > 0
    loaded = 0
    for (_, ref), (s, out) in zip(reference, results):
        assert s == 200, out
        assert out["output_ids"] == ref["output_ids"]
        moves = out["meta_info"].get("prorsa", {}).get("migrations")
        if moves:
            left, landed = moves
            assert landed["checksum_failures"] == 0 and landed["missing_blocks"] == 0
            assert landed["loaded_tokens"] + landed["already_cached_tokens"] == left["kv_tokens"]
            loaded += landed["loaded_tokens"]
    assert loaded > 0  # bytes really came back through the Mooncake Store
