"""The RL trainer's control surface, safe against switches (issue 13), on the package's deployment.

A second tiny checkpoint (same shapes, another seed) is the trainer's new weights; greedy outputs after an update
must equal transformers' generate on that checkpoint (``test_single_server`` shows SGLang equals transformers on the
same weights). Every test ends with the deployment on the embedded checkpoint again.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from tests_support import arrange, instances, status
from transformers import AutoModelForCausalLM, GenerationConfig

from sglang_prorsa.testing.front_client import (
    busiest,
    distinct_prompts,
    generate,
    idle_keepalive_survives,
    run_all,
    switch,
)
from sglang_prorsa.testing.tiny_model import TinyModelSpec, ensure_default_model

pytestmark = pytest.mark.integration

PROMPTS = distinct_prompts(6, lambda i: 20 + 5 * i, seed=21)
MAX_NEW = 24


@pytest.fixture(scope="module")
def checkpoints(tiny_model):
    return str(tiny_model), str(ensure_default_model(TinyModelSpec(seed=1)))


def hf_greedy(model_path: str, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    config = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = []
    with torch.no_grad():
        for ids in prompts:
            out.append(model.generate(torch.tensor([ids]), generation_config=config)[0, len(ids):].tolist())
    return out


def update(url: str, model_path: str, version: str) -> requests.Response:
    return requests.post(url + "/update_weights_from_disk", timeout=1800,
                         json={"model_path": model_path, "weight_version": version})


def versions(front) -> set[tuple[str, str]]:
    return {(i["instance"], requests.get(i["url"] + "/model_info", timeout=30).json()["weight_version"])
            for i in instances(front.url)}


def answered(results) -> None:
    for s, out in results:
        assert s == 200, out


def test_weight_update_through_the_front_during_a_rollout(deployment, checkpoints):
    front = deployment
    base, new = checkpoints
    arrange(front, prefill=2, decode=2)
    jobs = distinct_prompts(16, lambda i: 30 + 3 * i, seed=22)
    with ThreadPoolExecutor(16) as ex:
        rollout = [ex.submit(generate, front.url, p, 96) for p in jobs]
        time.sleep(2.0)
        r = update(front.url, new, "step-1")
        results = [f.result() for f in rollout]
    updated_or_unflushed(r)
    assert set(r.json()["instances"]) == {i["instance"] for i in instances(front.url)}
    answered(results)  # nothing lost: SGLang holds or finishes them around the update
    assert {v for _, v in versions(front)} == {"step-1"}
    flush(front)
    got = [generate(front.url, p, MAX_NEW)[1]["output_ids"] for p in PROMPTS]
    assert got == hf_greedy(new, PROMPTS, MAX_NEW)
    assert update(front.url, base, "step-0").status_code == 200
    assert [generate(front.url, p, MAX_NEW)[1]["output_ids"] for p in PROMPTS] == hf_greedy(base, PROMPTS, MAX_NEW)


@pytest.fixture(autouse=True)
def base_weights_after(deployment, checkpoints):
    """A test that failed half-way must not leave the next one paused or on the other checkpoint."""
    yield
    front, (base, _) = deployment, checkpoints
    requests.post(front.url + "/continue_generation", json={}, timeout=120)
    if {v for _, v in versions(front)} - {"default", "step-0"}:
        update(front.url, base, "step-0")
        requests.post(front.url + "/flush_cache", timeout=120)


def updated_or_unflushed(r) -> None:
    """SGLang's answer to a weight update: success, or -- with requests still running -- weights updated but the prefix
    cache not flushed (400, success false: SGLang asks the caller to flush once they finish). Nothing else."""
    if r.status_code == 200:
        assert r.json()["success"] is True, r.text
        return
    assert r.status_code == 400, r.text
    for answer in r.json()["instances"].values():
        assert answer["status"] == 200 or "cache was not flushed" in answer["body"]["message"], r.text


def flush(front) -> None:
    r = requests.post(front.url + "/flush_cache", timeout=120)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("order", ["switch-first", "update-first"])
def test_a_weight_update_and_a_busy_switch_never_interleave(deployment, checkpoints, order):
    front = deployment
    base, new = checkpoints
    arrange(front, prefill=2, decode=2)
    jobs = distinct_prompts(16, lambda i: 40 + 2 * i, seed=23)
    box: dict = {}
    with ThreadPoolExecutor(16) as ex:
        rollout = [ex.submit(generate, front.url, p, 160) for p in jobs]
        deadline = time.monotonic() + 300
        while status(busiest(front.url, "decode")["url"])["running"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        target = busiest(front.url, "decode")
        sw = threading.Thread(target=lambda: box.setdefault("switch", switch(front.url, target["instance"],
                                                                              "prefill")))
        up = threading.Thread(target=lambda: box.setdefault("update", update(front.url, new, "step-2")))
        first, second = (sw, up) if order == "switch-first" else (up, sw)
        first.start()
        time.sleep(0.05)
        second.start()
        sw.join()
        up.join()
        results = [f.result() for f in rollout]
    updated_or_unflushed(box["update"])
    # The switch ran before or after the update, never during: it succeeded, or was refused while the update held.
    assert box["switch"].status_code in (200, 409), box["switch"].text
    answered(results)
    assert {v for _, v in versions(front)} == {"step-2"}  # no instance left on the old weights
    flush(front)  # SGLang skips the flush while requests run and asks for one afterwards, as a trainer does
    for _, out in results:  # each token's version is reported, as SGLang does
        spans = out["meta_info"]["weight_versions"]
        assert spans[0]["start"] == 0 and spans[-1]["end"] == len(out["output_ids"])
        assert {s["version"] for s in spans} <= {"step-0", "step-2", "default"}
    assert [generate(front.url, p, MAX_NEW)[1]["output_ids"] for p in PROMPTS] == hf_greedy(new, PROMPTS, MAX_NEW)
    assert update(front.url, base, "step-0").status_code == 200


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_pause_holds_switches_until_continue(deployment, mode):
    front = deployment
    arrange(front, prefill=2, decode=2)
    jobs = distinct_prompts(8, lambda i: 30 + i, seed=24)
    with ThreadPoolExecutor(8) as ex:
        rollout = [ex.submit(generate, front.url, p, 128) for p in jobs]
        time.sleep(2.0)
        r = requests.post(front.url + "/pause_generation", json={"mode": mode}, timeout=300)
        assert r.status_code == 200, r.text
        decode = busiest(front.url, "decode")
        held = switch(front.url, decode["instance"], "prefill")
        assert held.status_code == 409 and held.json()["code"] == "control_operation", held.text
        forecast = requests.get(front.url + "/prorsa/forecast", timeout=30).json()
        assert forecast["paused"] is True  # the tracker knows: paused generation is not low demand
        tick = requests.post(front.url + "/prorsa/control_tick", timeout=60).json()
        assert tick["held_by"] and tick["executed"] == []
        r = requests.post(front.url + "/continue_generation", json={}, timeout=300)
        assert r.status_code == 200, r.text
        results = [f.result() for f in rollout]
    for s, out in results:  # every request answered: in abort mode some say so, the others complete
        assert s == 200, out
        reason = out["meta_info"]["finish_reason"]["type"]
        assert reason in (("abort", "length") if mode == "abort" else ("length",)), out["meta_info"]
    assert requests.get(front.url + "/prorsa/forecast", timeout=30).json()["paused"] is False
    assert switch(front.url, busiest(front.url, "decode")["instance"], "prefill").status_code == 200


def test_abort_all_flush_and_memory_release_with_a_switch_racing(deployment):
    front = deployment
    arrange(front, prefill=2, decode=2)
    jobs = distinct_prompts(8, lambda i: 30 + i, seed=25)
    with ThreadPoolExecutor(8) as ex:
        rollout = [ex.submit(generate, front.url, p, 400) for p in jobs]
        time.sleep(2.0)
        r = requests.post(front.url + "/abort_request", json={"abort_all": True}, timeout=120)
        assert r.status_code == 200, r.text
        results = [f.result() for f in rollout]
    assert all(s == 200 for s, _ in results)
    assert any(out["meta_info"]["finish_reason"]["type"] == "abort" for _, out in results)
    # An abort takes effect at the scheduler's next step, so the callers can have their answers before every
    # scheduler is idle; SGLang's flush refuses while anything is pending unless told to wait (?timeout=, which the
    # front passes on to every instance).
    r = requests.post(front.url + "/flush_cache?timeout=30", timeout=120)
    assert r.status_code == 200 and set(r.json()["instances"]) == {i["instance"] for i in instances(front.url)}
    r = requests.post(front.url + "/release_memory_occupation", json={}, timeout=300)
    if not torch.cuda.is_available():
        # SGLang's memory release needs CUDA (torch_memory_saver); on CPU it would kill every scheduler. Each instance
        # refuses it with a typed code, nothing is held, and everything keeps serving.
        assert r.status_code == 400 and r.json()["code"] == "unsupported", r.text
        assert {b["body"]["code"] for b in r.json()["instances"].values()} == {"unsupported"}
        assert len(r.json()["instances"]) == len(instances(front.url))
    else:
        assert r.status_code == 200, r.text
        held = switch(front.url, busiest(front.url, "decode")["instance"], "prefill")
        assert held.status_code == 409 and held.json()["code"] == "control_operation"
        r = requests.post(front.url + "/resume_memory_occupation", json={}, timeout=300)
        assert r.status_code == 200, r.text
    assert generate(front.url, PROMPTS[0], 8)[0] == 200
    assert switch(front.url, busiest(front.url, "decode")["instance"], "prefill").status_code == 200


def test_instances_called_directly_hold_their_own_switches(deployment):
    """slime and AReaL call engines directly: a pause there holds that instance's switch too."""
    front = deployment
    arrange(front, prefill=2, decode=2)
    decode = busiest(front.url, "decode")
    assert requests.post(decode["url"] + "/pause_generation", json={"mode": "in_place"}, timeout=60).status_code == 200
    r = switch(front.url, decode["instance"], "prefill")
    assert r.status_code == 409 and r.json()["code"] == "control_operation", r.text  # the instance declined
    now = {i["instance"]: i for i in instances(front.url)}[decode["instance"]]
    assert now["status"] == "active" and now["role"] == "decode"  # back in the pools, unchanged
    assert requests.post(decode["url"] + "/continue_generation", json={}, timeout=60).status_code == 200
    assert switch(front.url, decode["instance"], "prefill").status_code == 200


def test_two_rl_steps_the_way_slime_drives_them(deployment, checkpoints):
    """generate (return_logprob) -> pause -> flush -> update -> continue, twice: once through our front, once through
    sglang-router with the control calls sent to each engine directly."""
    front = deployment
    base, new = checkpoints
    arrange(front, prefill=2, decode=2)
    workers = [w["url"] for w in requests.get(front.router.url + "/workers", timeout=10).json()["workers"]]
    assert len(workers) == 4
    expected = {base: hf_greedy(base, PROMPTS, MAX_NEW), new: hf_greedy(new, PROMPTS, MAX_NEW)}
    for gen_url, control_urls in ((front.url, [front.url]), (front.router.url, workers)):
        weights = base
        for step, next_weights in enumerate((new, base)):
            results = run_all(lambda p: generate(gen_url, p, MAX_NEW), PROMPTS)
            answered(results)
            assert [out["output_ids"] for _, out in results] == expected[weights]
            for _, out in results:
                lp = out["meta_info"]["output_token_logprobs"]
                assert len(lp) == MAX_NEW and all(x[0] <= 0 for x in lp)
            for url in control_urls:
                assert requests.post(url + "/pause_generation", json={"mode": "retract"}, timeout=120).ok
            for url in control_urls:
                assert requests.post(url + "/flush_cache", timeout=120).ok
            for url in control_urls:
                assert update(url, next_weights, f"slime-{step}").status_code == 200
            for url in control_urls:
                assert requests.post(url + "/continue_generation", json={}, timeout=120).ok
            weights = next_weights
        assert {v for _, v in versions(front)} == {"slime-1"}
    assert update(front.url, base, "step-0").status_code == 200


def test_workers_metrics_and_loads_are_listed_like_the_router(deployment):
    front = deployment
    listed = requests.get(front.url + "/workers", timeout=10).json()
    assert listed["total"] == 4 and listed["stats"]["prefill_count"] + listed["stats"]["decode_count"] == 4
    assert {w["url"] for w in listed["workers"]} == {i["url"] for i in instances(front.url)}
    assert all(w["worker_type"] in ("prefill", "decode") and "bootstrap_port" in w for w in listed["workers"])
    metrics = requests.get(front.url + "/metrics", timeout=30).text
    assert "prorsa_front_requests_total" in metrics
    assert all(f'instance="{i["instance"]}"' in metrics for i in instances(front.url))
    loads = requests.get(front.url + "/get_load", timeout=10).json()["loads"]
    assert len(loads) == 4 and {"running", "queued", "role"} <= set(loads[0])
    assert requests.get(front.url + "/v1/loads", timeout=30).status_code == 200
    assert requests.get(front.url + "/health_generate", timeout=120).status_code == 200
    assert requests.get(front.url + "/v1/models", timeout=10).json()["data"]
    assert "model_path" in requests.get(front.url + "/get_model_info", timeout=10).json()


def test_the_front_keeps_an_idle_connection_longer_than_client_pools(deployment):
    """aiohttp's pool keeps an idle connection 15 s, httpx's 5 s: a listener that closes one sooner (uvicorn's 5 s
    default) races the pool, and the POST sent just as it closes is reset, not retried. 6 s idle: past uvicorn's
    default, far inside the front's SERVER_KEEPALIVE_S."""
    assert idle_keepalive_survives(deployment.url, 6.0) == (200, 200, True)
