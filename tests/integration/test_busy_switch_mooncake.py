"""The busy switch with the Mooncake Store as the KV store (the front starts its own mooncake_master on 127.0.0.1)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests_support import arrange, distinct_prompts, generate, instances, run_all, start_front, status

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def front(tiny_model, log_dir):
    srv = start_front(log_dir, ["--prorsa-kv-store", "mooncake"])
    try:
        yield srv
    finally:
        srv.stop(grace_s=20)


def test_decode_switch_resumes_from_the_mooncake_store(front):
    arrange(front, prefill=1, decode=2)
    prompts = distinct_prompts(8, lambda i: 40 + 7 * i, seed=5)
    max_new = 160
    reference = run_all(front, prompts, max_new)
    target = next(i for i in instances(front) if i["role"] == "decode")
    with ThreadPoolExecutor(len(prompts)) as ex:
        futures = [ex.submit(generate, front, p, max_new) for p in prompts]
        deadline = time.monotonic() + 300
        while status(target["url"])["running"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        sw = requests.post(front.url + "/prorsa/switch", json={"instance": target["instance"], "new_role": "prefill"},
                           timeout=300)
        results = [f.result() for f in futures]
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
