"""Instances with two tensor-parallel ranks on CPU (issue 32): a front over three ``--tp-size 2`` instances of the tiny
model (the CPU recipe's TP settings: gloo all-reduce, a core per rank), a busy switch of the busiest decode instance
under load, every answer identical to the unswitched run, and each rank's blocks in the KV store under its own keys:
the keys of rank 0 and of rank 1, derived from each moved request's tokens and the layout it was persisted under, are
all there, and they are disjoint."""

from __future__ import annotations

import pytest
import requests
from tests_support import LOGPROB_TOL, instances, max_logprob_gap, running_front

from sglang_prorsa.srt.disaggregation.kv_persist import keys_for
from sglang_prorsa.testing.front_client import busiest, distinct_prompts, generate, run_all, switch_under_load

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tp2_front(tiny_model, log_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("kv-store-tp2")
    with running_front(log_dir, ["--tp-size", "2", "--prorsa-kv-store", "file", "--prorsa-kv-store-path",
                                 str(store)], n_instances=3, initial_prefill=1) as front:
        front.store = store
        yield front


def stored_keys(store) -> set[str]:
    return {p.name.removesuffix(".kv") for p in store.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")}


def test_a_tp2_instance_switches_busy_exactly_with_each_ranks_blocks_under_its_own_keys(tp2_front):
    insts = instances(tp2_front.url)
    assert [i["role"] for i in insts].count("decode") == 2
    gpus = {requests.get(i["url"] + "/prorsa/status", timeout=10).json()["gpus"] for i in insts}
    assert gpus == {1}  # on CPU an instance counts as one device whatever its ranks
    prompts = distinct_prompts(12, lambda i: 30 + 6 * i, seed=61)
    max_new = 160
    ref = run_all(lambda p: generate(tp2_front.url, p, max_new), prompts)
    sw, got, before = switch_under_load(tp2_front.url, lambda p: generate(tp2_front.url, p, max_new), prompts,
                                        lambda: busiest(tp2_front.url, "decode"), "prefill",
                                        ready=lambda st: st["running"] >= 3, settle_s=0.3)
    assert sw.status_code == 200, sw.text
    assert sw.json()["taken"] >= 3 and sw.json()["persisted_bytes"] > 0, sw.json()
    moves = []
    for prompt, (_, r), (s, out) in zip(prompts, ref, got):
        assert s == 200, out
        assert out["output_ids"] == r["output_ids"]
        assert max_logprob_gap(out, r) <= LOGPROB_TOL
        for move in out["meta_info"].get("prorsa", {}).get("migrations", []):
            moves.append((prompt, out["output_ids"], move))
    resumed = [m for _, _, m in moves if m.get("kv_tokens")]
    assert resumed and all(not m.get("layout_refused") for _, _, m in moves), moves
    assert sum(m.get("loaded_tokens", 0) for m in resumed) > 0  # prefixes came back, loaded by both ranks
    # Each moved request's blocks: rank 0's keys and rank 1's, from its tokens and the layout it was persisted under.
    stored = stored_keys(tp2_front.store)
    per_rank: dict[int, set[str]] = {0: set(), 1: set()}
    for prompt, output_ids, move in moves:
        if not move.get("kv_tokens"):
            continue
        assert move["layout"].endswith("|TP2"), move["layout"]
        tokens = (list(prompt) + list(output_ids))[: move["kv_tokens"]]
        for rank in (0, 1):
            per_rank[rank] |= set(keys_for(tokens, move["block_tokens"], move["layout"], rank))
    assert per_rank[0] and len(per_rank[0]) == len(per_rank[1]) and not per_rank[0] & per_rank[1]
    assert per_rank[0] <= stored and per_rank[1] <= stored, (len(per_rank[0] - stored), len(per_rank[1] - stored))
    counters = [requests.get(i["url"] + "/prorsa/status", timeout=10).json()["counters"] for i in insts]
    assert sum(c.get("kv_layout_refused", 0) for c in counters) == 0

