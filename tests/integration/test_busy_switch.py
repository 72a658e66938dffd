"""Switching busy instances (issue 6) through the adaptive front, on real SGLang servers over Mooncake TCP.

One front with three instances serves every test here; each test first arranges the roles it needs (idle switches).
References are the same requests through the same front without a switch (greedy, fp32 tiny model).
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from sglang_prorsa.testing.pd import pd_generate
from sglang_prorsa.testing.front_client import switch_under_load
from tests_support import (arrange, computed_tokens, distinct_prompts, flush_prefix_caches, generate, instances,
                           run_all, running_front, sampling, status)

pytestmark = pytest.mark.integration

PAGE = 1  # the CPU recipe's page size


@pytest.fixture(scope="module")
def front(tiny_model, log_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("kv-store")
    with running_front(log_dir, ["--prorsa-kv-store", "file", "--prorsa-kv-store-path", str(store)]) as srv:
        srv.store = store
        yield srv


def test_decode_instance_switched_mid_generation(front):
    arrange(front, prefill=1, decode=2)
    prompts = distinct_prompts(32, lambda i: 24 + 3 * i, seed=1)
    max_new = 128
    reference = run_all(front, prompts, max_new)
    assert all(s == 200 for s, _ in reference)
    target = next(i for i in instances(front) if i["role"] == "decode")

    # settle_s: let them generate a few tokens first
    sw, results, before = switch_under_load(front.url, lambda p: generate(front, p, max_new), prompts, target,
                                            "prefill", ready=lambda st: st["running"] >= 16, settle_s=0.3)
    running_before = before["running"]

    assert sw.status_code == 200, sw.text
    report = sw.json()
    assert report["old_role"] == "decode" and report["new_role"] == "prefill"
    assert running_before >= 16 and report["migrated"] >= 16
    assert report["persisted_bytes"] > 0
    for k in ("quiesce_s", "persist_s", "rebuild_s"):
        assert report["timings"][k] >= 0
    migrated = 0
    for (s_ref, ref), (s, out), prompt in zip(reference, results, prompts):
        assert s == 200, out
        assert out["output_ids"] == ref["output_ids"]
        moves = out["meta_info"].get("prorsa", {}).get("migrations")
        if not moves:
            continue
        migrated += 1
        left, landed = moves
        assert left["from_instance"] == target["instance"] and left["kv_tokens"] > 0
        assert landed["loaded_tokens"] + landed["already_cached_tokens"] == left["kv_tokens"]
        resumed_prompt = len(prompt) + left["tokens_kept"]
        # Everything but the newest token came from the store or the prefix cache: at most one page computed.
        assert resumed_prompt - landed["cached_tokens"] <= PAGE
    assert migrated == report["migrated"]
    roles = {i["instance"]: i["role"] for i in instances(front)}
    assert roles[target["instance"]] == "prefill"


def test_prefill_instance_switched_with_queued_requests(front):
    arrange(front, prefill=2, decode=1)
    prompts = distinct_prompts(12, lambda i: 120 + i, seed=2)
    max_new = 8
    reference = run_all(front, prompts, max_new)
    assert all(s == 200 for s, _ in reference)
    flush_prefix_caches(front)
    before = computed_tokens(front)
    target = next(i for i in instances(front) if i["role"] == "prefill")

    sw, results, _ = switch_under_load(front.url, lambda p: generate(front, p, max_new), prompts, target, "decode",
                                       ready=lambda st: st["queued"] >= 3, timeout_s=120)

    assert sw.status_code == 200, sw.text
    assert sw.json()["restarted"] >= 1  # queued requests were handed back and re-sent elsewhere
    # None lost: every request answered, with exactly the reference tokens.
    for (_, ref), (s, out) in zip(reference, results):
        assert s == 200, out
        assert out["output_ids"] == ref["output_ids"]
    # None duplicated: across all instances each prompt was computed exactly once.
    assert computed_tokens(front) - before == sum(len(p) for p in prompts)


def test_corrupted_store_entry_is_detected_and_recomputed(front):
    arrange(front, prefill=1, decode=2)
    insts = instances(front)
    prefill = next(i for i in insts if i["role"] == "prefill")
    dec_a, dec_b = [i for i in insts if i["role"] == "decode"]
    prompt = distinct_prompts(1, lambda i: 60, seed=3)[0]
    max_new = 400  # long enough to still be running when migrate_out arrives, even on an idle machine
    s, reference = generate(front, prompt, max_new)
    assert s == 200

    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", pd_generate(
        prefill["url"], dec_a["url"], prefill["bootstrap_port"],
        {"input_ids": prompt, "sampling_params": sampling(max_new), "rid": "corruption-test"})))
    t.start()
    deadline = time.monotonic() + 120
    while status(dec_a["url"])["running"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    moved = requests.post(dec_a["url"] + "/prorsa/migrate_out", timeout=60).json()["requests"]
    t.join(timeout=120)
    assert status(dec_a["url"])["admitting"] is False  # a migrate_out takes the instance out of admission
    assert requests.post(dec_a["url"] + "/prorsa/admission", json={"accept": True}, timeout=10).json() == {
        "admitting": True}
    (rec,) = [r for r in moved if r["rid"] == "corruption-test"]
    assert rec["kv_tokens"] == len(prompt) + len(rec["output_ids"]) - 1 and rec["output_ids"]
    assert rec["sampling_params"]["max_new_tokens"] == max_new - len(rec["output_ids"])

    # Flip one byte in the first block on disk.
    (block,) = list(front.store.glob(rec["keys"][0] + "*"))
    raw = bytearray(block.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    block.write_bytes(bytes(raw))

    assert requests.post(prefill["url"] + "/flush_cache", timeout=30).status_code == 200
    c0 = status(prefill["url"])["counters"]
    tokens = rec["input_ids"] + rec["output_ids"]
    load = requests.post(prefill["url"] + "/prorsa/kv/load", timeout=60, json={
        "token_ids": tokens[: rec["kv_tokens"]], "keys": rec["keys"], "block_tokens": rec["block_tokens"]}).json()
    assert load["checksum_failures"] == 1 and load["loaded_tokens"] == 0, load

    rest = pd_generate(prefill["url"], dec_b["url"], prefill["bootstrap_port"],
                       {"input_ids": tokens, "sampling_params": sampling(max_new - len(rec["output_ids"]))})
    assert rec["output_ids"] + rest["output_ids"] == reference["output_ids"]
    c1 = status(prefill["url"])["counters"]
    assert c1.get("kv_checksum_failures", 0) - c0.get("kv_checksum_failures", 0) == 1
    metrics = requests.get(prefill["url"] + "/prorsa/metrics", timeout=10).text
    assert f'prorsa_kv_checksum_failures_total{{instance="{prefill["instance"]}",role="prefill"}}' in metrics
    assert c1["prompt_tokens_computed"] - c0["prompt_tokens_computed"] == len(tokens)  # recomputed, still exact


def test_switch_requests_are_validated(front):
    insts = instances(front)
    r = requests.post(front.url + "/prorsa/switch", json={"instance": "99", "new_role": "decode"}, timeout=10)
    assert r.status_code == 422 and "instance" in r.json()["error"]
    r = requests.post(front.url + "/prorsa/switch", json={"instance": insts[0]["instance"], "new_role": "x"},
                      timeout=10)
    assert r.status_code == 422 and "new_role" in r.json()["error"]
    same = insts[0]
    r = requests.post(front.url + "/prorsa/switch", json={"instance": same["instance"], "new_role": same["role"]},
                      timeout=10)
    assert r.status_code == 409
    r = requests.post(insts[0]["url"] + "/prorsa/kv/load", json={"token_ids": [1, -2], "keys": [],
                                                                 "block_tokens": 64}, timeout=10)
    assert r.status_code == 422 and "token_ids" in r.json()["error"]
    r = requests.post(front.url + "/generate", data=b"{not json", timeout=10)
    assert r.status_code == 400 and "body" in r.json()["error"]
    r = requests.post(front.url + "/generate", json={"text": "x", "input_ids": [1]}, timeout=10)
    assert r.status_code == 422


def test_last_instance_of_a_role_is_never_switched(front):
    arrange(front, prefill=1, decode=2)
    only_prefill = next(i for i in instances(front) if i["role"] == "prefill")
    r = requests.post(front.url + "/prorsa/switch", json={"instance": only_prefill["instance"],
                                                          "new_role": "decode"}, timeout=30)
    assert r.status_code == 409 and "last routable prefill" in r.json()["error"]


def test_control_tick_turns_the_forecast_into_a_switch(front):
    """Forecast -> Eq. 1 -> planned switch -> executed, on the real instances (the automatic loop runs this tick)."""
    arrange(front, prefill=1, decode=2)
    # A ready backlog far beyond one prefill instance's speed: the prefill side needs every instance it can get.
    events = [{"trajectory_id": f"tick-{i}", "event": "request_arrived", "prompt_tokens": 100_000} for i in range(20)]
    assert requests.post(front.url + "/lifecycle", json={"events": events}, timeout=30).status_code == 200
    tick = requests.post(front.url + "/prorsa/control_tick", timeout=300).json()
    assert tick["forecast"]["sources"]["ready"] == 2_000_000
    decision = tick["decision"]
    assert decision["inputs"]["W_P"] >= 2_000_000 and decision["inputs"]["G"] == 3
    assert decision["target"] == {"prefill": 2, "decode": 1}
    assert [(s["from"], s["to"]) for s in decision["plan"]["switches"]] == [("decode", "prefill")]
    assert len(tick["executed"]) == 1
    assert sum(i["role"] == "prefill" for i in instances(front)) == 2
    exposed = requests.get(front.url + "/prorsa/decision", timeout=10).json()["decision"]
    assert exposed["target"] == {"prefill": 2, "decode": 1}
