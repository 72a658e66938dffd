"""``--pd-static 1:1`` with API keys (issues 14 and 15): the static mode answers like every other mode, and every route
refuses a missing or wrong key and accepts the right one, SGLang's way (``--api-key`` for generation and reads,
``--admin-api-key`` for everything that changes state; health and metrics stay open)."""

from __future__ import annotations

import pytest
import requests
from tests_support import ENGINE_FLAGS, PROMPTS

from sglang_prorsa.srt.utils import processes

pytestmark = pytest.mark.integration

GEN, ADMIN = "gen-key", "admin-key"
MAX_NEW = 16

FRONT_NORMAL = [("POST", "/generate"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                ("POST", "/lifecycle"), ("GET", "/prorsa/forecast"), ("GET", "/lifecycle/status"),
                ("GET", "/lifecycle/config"), ("GET", "/prorsa/instances"), ("GET", "/prorsa/decision"),
                ("GET", "/workers"), ("GET", "/get_load"), ("GET", "/v1/models"), ("GET", "/get_model_info"),
                ("GET", "/prorsa/info"), ("GET", "/prorsa/metrics")]
FRONT_ADMIN = [("POST", "/prorsa/switch"), ("POST", "/prorsa/control_tick"), ("POST", "/prorsa/register"),
               ("POST", "/lifecycle/config"), ("POST", "/update_weights_from_disk"), ("POST", "/pause_generation"),
               ("POST", "/continue_generation"), ("POST", "/flush_cache"), ("POST", "/release_memory_occupation"),
               ("POST", "/resume_memory_occupation"), ("POST", "/abort_request"), ("POST", "/init_weights_update_group")]
INSTANCE_ADMIN = [("POST", p) for p in ("/prorsa/switch_role", "/prorsa/migrate_out", "/prorsa/admission",
                                        "/prorsa/release", "/prorsa/expect", "/prorsa/held_rooms", "/prorsa/peer_lost",
                                        "/prorsa/kv/load", "/prorsa/peers", "/pd_role_switch",
                                        "/update_weights_from_disk")]
INSTANCE_NORMAL = [("GET", "/prorsa/status"), ("GET", "/prorsa/metrics"), ("POST", "/generate")]
OPEN = [("GET", "/health"), ("GET", "/metrics")]
# Bodies that pass authentication and then fail validation (or do nothing): the right key must never change state.
HARMLESS = b'{"not_a_field": 1}'
BODIES = {"/pause_generation": b'{"mode": "not-a-mode"}', "/release_memory_occupation": b'{"tags": 5}',
          "/resume_memory_occupation": b'{"tags": 5}'}


@pytest.fixture(scope="module")
def static_front(tiny_model, log_dir):
    port = processes.free_port()
    srv = processes.start(["--pd-static", "1:1", "--api-key", GEN, "--admin-api-key", ADMIN, "--prorsa-log-dir",
                           str(log_dir / f"static-{port}"), "--host", processes.LOOPBACK, "--port", str(port),
                           *ENGINE_FLAGS], name=f"static-front-{port}", port=port, log_dir=log_dir)
    try:
        srv.wait_ready(timeout=900)
        yield srv
    finally:
        srv.stop(grace_s=20)


def call(method: str, url: str, key: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    path = "/" + url.split("/", 3)[3]
    body = BODIES.get(path, HARMLESS) if method == "POST" else None
    return requests.request(method, url, data=body, headers=headers, timeout=120).status_code


def instance_urls(front) -> list[str]:
    r = requests.get(front.url + "/prorsa/instances", headers={"Authorization": f"Bearer {GEN}"}, timeout=10)
    return [i["url"] for i in r.json()["instances"]]


def test_static_mode_serves_the_same_greedy_output_as_a_single_server(static_front, single_server, tiny_model):
    """A prefill/decode pair over Mooncake (TCP, loopback) behind the front answers exactly what one colocated server
    answers, for prompts that span several chunked-prefill chunks (``--chunked-prefill-size 64``) too."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert max(len(tok(p)["input_ids"]) for p in PROMPTS) > 64
    for prompt in PROMPTS:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}
        ours = requests.post(static_front.url + "/generate", json=body, timeout=300,
                             headers={"Authorization": f"Bearer {GEN}"})
        ref = requests.post(single_server.url + "/generate", json=body, timeout=300)
        assert ours.status_code == 200, ours.text
        assert ours.json()["output_ids"] == ref.json()["output_ids"]
    info = requests.get(static_front.url + "/prorsa/info", headers={"Authorization": f"Bearer {GEN}"}).json()
    assert info["mode"] == "static" and info["auto_switch"] is False
    roles = sorted(i["role"] for i in requests.get(static_front.url + "/prorsa/instances", timeout=10, headers={
        "Authorization": f"Bearer {GEN}"}).json()["instances"])
    assert roles == ["decode", "prefill"]


@pytest.mark.parametrize("method,path", FRONT_NORMAL)
def test_front_reads_and_generation_need_the_generation_key(static_front, method, path):
    url = static_front.url + path
    assert call(method, url, None) == 401
    assert call(method, url, "wrong") == 401
    assert call(method, url, ADMIN) == 401  # SGLang: with an API key set, only it opens normal routes
    assert call(method, url, GEN) not in (401, 403)


@pytest.mark.parametrize("method,path", FRONT_ADMIN)
def test_front_state_changes_need_the_admin_key(static_front, method, path):
    url = static_front.url + path
    assert call(method, url, None) == 401
    assert call(method, url, "wrong") == 401
    assert call(method, url, GEN) == 401
    assert call(method, url, ADMIN) not in (401, 403)


@pytest.mark.parametrize("method,path", INSTANCE_ADMIN)
def test_instance_state_changes_need_the_admin_key(static_front, method, path):
    for base in instance_urls(static_front):
        assert call(method, base + path, None) == 401
        assert call(method, base + path, "wrong") == 401
        assert call(method, base + path, GEN) == 401
        assert call(method, base + path, ADMIN) not in (401, 403)
        if path == "/prorsa/migrate_out":  # it closed admission (with nothing to move): open it again
            r = requests.post(base + "/prorsa/admission", json={"accept": True}, timeout=10,
                              headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.json() == {"admitting": True}


@pytest.mark.parametrize("method,path", INSTANCE_NORMAL)
def test_instance_reads_need_the_generation_key(static_front, method, path):
    for base in instance_urls(static_front):
        assert call(method, base + path, None) == 401
        assert call(method, base + path, GEN) not in (401, 403)


@pytest.mark.parametrize("method,path", OPEN)
def test_health_and_metrics_stay_open_for_probes(static_front, method, path):
    assert call(method, static_front.url + path, None) == 200
    for base in instance_urls(static_front):
        assert call(method, base + path, None) in (200, 404)  # SGLang's /metrics needs --enable-metrics


def test_the_controller_still_reaches_its_instances_with_the_keys(static_front):
    r = requests.get(static_front.url + "/prorsa/instances", headers={"Authorization": f"Bearer {GEN}"}, timeout=10)
    assert all(i["status"] == "active" and i["kv_capacity_tokens"] > 0 for i in r.json()["instances"])
    r = requests.post(static_front.url + "/flush_cache", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 200 and len(r.json()["instances"]) == 2
