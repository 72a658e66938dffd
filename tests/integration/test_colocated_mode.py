"""``--pd-colocated 2`` (issue 15): ordinary instances behind the same front, least-loaded with trajectory affinity;
the same routes as the PD modes and the same greedy output as a single server."""

from __future__ import annotations

import time

import pytest
import requests
from tests_support import ENGINE_FLAGS, PROMPTS

from sglang_prorsa.srt.utils import processes

pytestmark = pytest.mark.integration

MAX_NEW = 16


@pytest.fixture(scope="module")
def colocated(tiny_model, log_dir):
    port = processes.free_port()
    srv = processes.start(["--pd-colocated", "2", "--prorsa-log-dir", str(log_dir / f"colocated-{port}"),
                           "--host", processes.LOOPBACK, "--port", str(port), *ENGINE_FLAGS],
                          name=f"colocated-front-{port}", port=port, log_dir=log_dir)
    try:
        srv.wait_ready(timeout=900)
        yield srv
    finally:
        srv.stop(grace_s=20)


def test_colocated_serves_the_same_greedy_output_as_a_single_server(colocated, single_server):
    for prompt in PROMPTS:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}
        ours = requests.post(colocated.url + "/generate", json=body, timeout=300)
        ref = requests.post(single_server.url + "/generate", json=body, timeout=300)
        assert ours.status_code == 200, ours.text
        assert ours.json()["output_ids"] == ref.json()["output_ids"] and ours.json()["text"] == ref.json()["text"]
    insts = requests.get(colocated.url + "/prorsa/instances", timeout=10).json()["instances"]
    assert [i["role"] for i in insts] == ["null", "null"]
    assert requests.get(colocated.url + "/prorsa/info", timeout=10).json()["mode"] == "colocated"


def test_a_trajectory_stays_on_its_instance_and_its_turns_reach_the_tracker(colocated):
    """Each turn reaches the front's tracker as request_arrived, prefill_start, prefill_end, decode_end, in order: the
    non-streamed answer (SGLang takes one output and never resumes the generator) included, streamed and OpenAI chat
    too."""
    headers = {"X-Trajectory-Id": "colo-traj"}
    before = requests.get(colocated.url + "/prorsa/metrics", timeout=10).text
    events_before = requests.get(colocated.url + "/lifecycle/status", timeout=10).json()["events"]
    for turn in range(3):
        r = requests.post(colocated.url + "/generate", headers=headers, timeout=300, json={
            "input_ids": [5 + turn, 6, 7, 8], "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "stream": turn == 1})
        assert r.status_code == 200
    r = requests.post(colocated.url + "/v1/chat/completions", headers=headers, timeout=300, json={
        "model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200
    after = requests.get(colocated.url + "/prorsa/metrics", timeout=10).text

    def hits(text: str) -> float:
        return next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("prorsa_front_affinity_hits_total"))

    assert hits(after) - hits(before) >= 3  # turns 2 to 4 went where turn 1 went
    deadline = time.monotonic() + 30  # the engine sends its events in the background, every 50 ms
    while True:
        status = requests.get(colocated.url + "/lifecycle/status", timeout=10).json()
        applied = status["events"]["applied"] - events_before["applied"]
        if applied >= 4 * 4 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert applied == 4 * 4
    assert {k: status["events"][k] - events_before[k] for k in events_before if k != "applied"} == {
        "duplicate": 0, "invalid_transition": 0, "unknown_trajectory": 0, "after_finish": 0}
    assert status["states"]["decoded"] >= 1 and status["states"]["decode"] == 0


def test_a_non_streamed_request_is_in_decode_while_it_generates(colocated):
    """prefill_end comes from the scheduler when the request starts decoding, not with the only output a non-streamed
    request has (at its end): otherwise every decode looks like prefill to the forecast (issue 15's live WAPE)."""
    import threading

    done = threading.Event()
    answer = {}

    def generate():
        answer["r"] = requests.post(colocated.url + "/generate", headers={"X-Trajectory-Id": "colo-long"}, timeout=300,
                                    json={"input_ids": [9, 10, 11, 12], "sampling_params": {
                                        "max_new_tokens": 600, "temperature": 0, "ignore_eos": True}})
        done.set()

    thread = threading.Thread(target=generate)
    thread.start()
    seen_decoding = False
    while not done.is_set():
        states = requests.get(colocated.url + "/lifecycle/status", timeout=10).json()["states"]
        seen_decoding = seen_decoding or (states["decode"] >= 1 and not done.is_set())
        time.sleep(0.05)
    thread.join()
    assert answer["r"].status_code == 200 and len(answer["r"].json()["output_ids"]) == 600
    assert seen_decoding, "the tracker never saw the request in decode before it finished"


def test_the_same_routes_as_the_pd_modes(colocated):
    for path in ("/prorsa/forecast", "/prorsa/decision", "/workers", "/get_load", "/v1/models", "/get_model_info",
                 "/metrics", "/lifecycle/status"):
        assert requests.get(colocated.url + path, timeout=30).status_code == 200, path
    r = requests.post(colocated.url + "/lifecycle", timeout=10, json={"events": [
        {"trajectory_id": "hint", "event": "sampled", "task": "swe", "prompt_tokens": 100}]})
    assert r.status_code == 200 and r.json()["applied"] == 1
    r = requests.post(colocated.url + "/v1/chat/completions", timeout=300, json={
        "model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    r = requests.post(colocated.url + "/flush_cache", timeout=60)
    assert r.status_code == 200 and len(r.json()["instances"]) == 2
