"""A trainer's engine API on the front, on the package's deployment (four instances under one front, sglang-router
beside it): sglang-router's worker routes as slime drives them, and a distributed weight update through the front.

The distributed update runs the way a trainer does it, on CPU with the ``gloo`` backend: this process is rank 0 of
a group over every instance (world size 1 + 4: the deployment's four instances, one CPU "GPU" each), joined with
SGLang's own helper (``sglang.srt.utils.init_custom_process_group``); the front gives each instance its rank offset;
the new checkpoint's tensors are broadcast inside SGLang's weight-update session (begin, update, end). Greedy outputs
must then equal transformers' on the new checkpoint. Every test ends with the deployment on the embedded weights.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from safetensors.torch import load_file
from tests_support import arrange, instances

from sglang_prorsa.srt.utils.processes import free_port
from sglang_prorsa.testing.front_client import busiest, distinct_prompts, generate, switch
from switching.test_control_surface import MAX_NEW, PROMPTS, checkpoints, hf_greedy, update, versions  # noqa: F401

pytestmark = pytest.mark.integration

GROUP = "prorsa-trainer-test"


def workers(front) -> list[dict]:
    return requests.get(front.url + "/workers", timeout=10).json()["workers"]


def test_posting_a_known_instance_url_is_idempotent_and_it_stays_switchable(deployment):
    front = deployment
    arrange(front, prefill=2, decode=2)
    before = workers(front)
    decode = next(w for w in before if w["worker_type"] == "decode")
    # slime's start-up call, twice, and once more naming the other pool: the same entry every time
    for kind in ("decode", "decode", "prefill"):
        r = requests.post(front.url + "/workers", json={"url": decode["url"] + "/", "worker_type": kind,
                                                        "bootstrap_port": None}, timeout=60)
        assert r.status_code == 200, r.text
        assert (r.json()["worker_id"], r.json()["new"], r.json()["worker"]["worker_type"]) == (decode["id"], False,
                                                                                            "decode")
    assert workers(front) == before
    r = switch(front.url, decode["id"], "prefill")
    assert r.status_code == 200, r.text
    listed = {w["id"]: w for w in workers(front)}
    assert (listed[decode["id"]]["worker_type"], listed[decode["id"]]["status"]) == ("prefill", "active")
    router = {w["url"]: w["worker_type"] for w in requests.get(front.router.url + "/workers", timeout=10).json()
              ["workers"]}
    assert router[decode["url"]] == "prefill"
    assert generate(front.url, PROMPTS[0], 8)[0] == 200
    arrange(front, prefill=2, decode=2)


def test_a_slime_abort_loop_over_get_workers_reaches_every_instance_mid_switch(deployment):
    """slime ends a rollout with GET /workers on "the router" and POST /abort_request {"abort_all": true} to each
    URL listed: an instance being switched is still listed, with its state, and takes the abort."""
    front = deployment
    arrange(front, prefill=2, decode=2)
    jobs = distinct_prompts(12, lambda i: 30 + 2 * i, seed=41)
    seen: dict[str, str] = {}
    with ThreadPoolExecutor(13) as ex:
        rollout = [ex.submit(generate, front.url, p, 400) for p in jobs]
        deadline = time.monotonic() + 300
        while sum(i["running"] for i in instances(front.url) if i["role"] == "decode") < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        target = busiest(front.url, "decode")
        switching = ex.submit(switch, front.url, target["instance"], "prefill")
        while target["instance"] not in seen and not switching.done():
            listed = workers(front)
            seen.update({w["id"]: w["status"] for w in listed if w["status"] in ("draining", "switching")})
            time.sleep(0.01)
        assert target["instance"] in seen, "the switch ended before GET /workers showed it"
        urls = [w["url"] for w in listed]  # slime's loop, over the listing that shows the switch
        aborts = {url: requests.post(url + "/abort_request", json={"abort_all": True}, timeout=60).status_code
                  for url in urls}
        results = [f.result() for f in rollout]
        switched = switching.result()
    assert len(urls) == 4 and target["url"] in urls
    assert aborts == {url: 200 for url in urls}
    assert all(s == 200 for s, _ in results), results
    assert any(out["meta_info"]["finish_reason"]["type"] == "abort" for _, out in results)
    assert switched.status_code == 200, switched.text
    assert generate(front.url, PROMPTS[0], 8)[0] == 200
    arrange(front, prefill=2, decode=2)


def _post_in_thread(url: str, body: dict, box: dict, key: str) -> threading.Thread:
    th = threading.Thread(target=lambda: box.setdefault(key, requests.post(url, json=body, timeout=600)))
    th.start()
    return th


def test_a_distributed_weight_update_through_the_front_reaches_every_instance(deployment, checkpoints):  # noqa: F811
    from sglang.srt.utils import init_custom_process_group

    front = deployment
    base, new = checkpoints
    ids = [w["id"] for w in workers(front)]
    assert len(ids) == 4
    port = free_port()
    body = {"master_address": "127.0.0.1", "master_port": port, "group_name": GROUP, "backend": "gloo"}
    wrong = requests.post(front.url + "/init_weights_update_group", json={**body, "world_size": 3}, timeout=60)
    assert wrong.status_code == 400 and wrong.json()["field"] == "world_size", wrong.text
    assert wrong.json()["detail"] == {"world_size": 5, "rank_offsets": [1, 2, 3, 4], "gpus": [1, 1, 1, 1]}
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(Path(new).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    names = sorted(tensors)
    box: dict = {}
    group = None
    try:
        th = _post_in_thread(front.url + "/init_weights_update_group", {**body, "world_size": 5}, box, "init")
        group = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=5, rank=0,
                                          group_name=GROUP)
        th.join()
        assert box["init"].status_code == 200, box["init"].text
        assert box["init"].json()["rank_offsets"] == {iid: k + 1 for k, iid in enumerate(ids)}
        assert requests.post(front.url + "/begin_weight_update", json={}, timeout=120).status_code == 200
        th = _post_in_thread(front.url + "/update_weights_from_distributed", {
            "names": names, "dtypes": [str(tensors[n].dtype).removeprefix("torch.") for n in names],
            "shapes": [list(tensors[n].shape) for n in names], "group_name": GROUP, "weight_version": "dist-1"},
            box, "update")
        for n in names:
            torch.distributed.broadcast(tensors[n].contiguous(), src=0, group=group)
        th.join()
        assert box["update"].status_code == 200, box["update"].text
        assert set(box["update"].json()["instances"]) == set(ids)
        r = requests.post(front.url + "/end_weight_update", json={}, timeout=120)
        assert r.status_code == 200, r.text
        assert {v for _, v in versions(front)} == {"dist-1"}  # every instance on the same version
        assert [generate(front.url, p, MAX_NEW)[1]["output_ids"] for p in PROMPTS] == hf_greedy(new, PROMPTS,
                                                                                                 MAX_NEW)
    finally:
        requests.post(front.url + "/end_weight_update", json={}, timeout=120)  # a no-op 400 once ended
        if group is not None:
            requests.post(front.url + "/destroy_weights_update_group", json={"group_name": GROUP}, timeout=120)
            torch.distributed.destroy_process_group(group)
        assert update(front.url, base, "step-0").status_code == 200
    assert [generate(front.url, p, MAX_NEW)[1]["output_ids"] for p in PROMPTS] == hf_greedy(base, PROMPTS, MAX_NEW)
