"""The standalone control plane over real HTTP: `python -m sglang_prorsa.control_plane` on 127.0.0.1."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from sglang_prorsa.srt.utils import processes

REPO = Path(__file__).resolve().parents[2]
STARTUP_LIMIT_S = 60


@pytest.fixture(scope="module")
def base_url():
    port = processes.free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_prorsa.control_plane", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"control plane exited early: {proc.stderr.read().decode()[-2000:]}")
            try:
                if requests.get(f"{url}/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("control plane did not start in time")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def post(url, path, body=None, data=None):
    return requests.post(f"{url}{path}", json=body, data=data, timeout=10)


def test_rejects_non_loopback_host_without_opt_in():
    out = subprocess.run([sys.executable, "-m", "sglang_prorsa.control_plane", "--host", "0.0.0.0", "--port", "1"],
                         cwd=REPO, capture_output=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode != 0 and b"not loopback" in out.stderr


def test_whole_trajectory_over_http_and_forecast(base_url):
    r = post(base_url, "/lifecycle/config", {"horizon_s": 10, "default_prompt_tokens": 2048,
                                              "injection": {"policy": "group", "group_size": 4},
                                              "prefill_instances": ["p0", "p1"]})
    assert r.status_code == 200 and r.json()["injection"] == {"policy": "group", "rate_per_s": 0.0, "group_size": 4}
    t0 = time.time()
    events = [
        {"trajectory_id": "h1", "event": "sampled", "ts": t0, "group_id": "g", "task": "swe", "prompt_tokens": 1500},
        {"trajectory_id": "h1", "event": "sandbox_start", "ts": t0, "mode": "prewarm"},
        {"trajectory_id": "h1", "event": "sandbox_ready", "ts": t0 + 0.1},
        {"trajectory_id": "h1", "event": "request_arrived", "ts": t0 + 0.2, "prompt_tokens": 1500, "instance": "p0"},
        {"trajectory_id": "h1", "event": "prefill_start", "ts": t0 + 0.2, "instance": "p0"},
        {"trajectory_id": "h1", "event": "prefill_end", "ts": t0 + 0.3},
        {"trajectory_id": "h1", "event": "decode_end", "ts": t0 + 0.5},
        {"trajectory_id": "h1", "event": "tool_start", "ts": t0 + 0.5, "tool": "bash", "turn": 0},
        {"trajectory_id": "h2", "event": "request_arrived", "ts": t0 + 0.6, "prompt_tokens": 700, "instance": "p1"},
    ]
    r = post(base_url, "/lifecycle", {"events": events})
    assert r.status_code == 200
    assert r.json() == {"received": 9, "applied": 9, "duplicates": 0, "rejected": 0, "rejections": []}
    r = post(base_url, "/lifecycle", events[-2])  # a single event, resent: idempotent
    assert r.status_code == 200 and r.json()["duplicates"] == 1
    r = post(base_url, "/lifecycle", {"trajectory_id": "h1", "event": "prefill_end"})  # h1 is in tool: invalid
    assert r.status_code == 200 and r.json()["rejections"][0]["reason"] == "invalid_transition"

    fc = requests.get(f"{base_url}/prorsa/forecast", params={"at": t0 + 1.0}, timeout=10).json()
    assert fc["t"] == pytest.approx(t0 + 1.0) and fc["horizon_s"] == 10
    assert fc["sources"]["ready"] == 700 and fc["sources"]["inflight"] == 0
    # no tool history: the prior (exponential, mean 5 s) from 0.5 s into the tool: q = 1 - exp(-10 / 5)
    arrivals = fc["arrivals"]
    assert arrivals["tool"]["raw"] == pytest.approx(1500 * (1 - math.exp(-2.0)))
    # sources.tool (the first cut's grouping) also counts h2's possible return through a tool after its decode
    assert arrivals["decode_return"]["raw"] > 0
    assert fc["sources"]["tool"] == pytest.approx(sum(arrivals[s]["raw"] for s in ("tool", "decode_return", "resend")))
    assert fc["live_trajectories"] == 2 and fc["rejected_events"] == 1
    assert fc["prefill_tokens"] == pytest.approx(700 + fc["sources"]["tool"] * fc["bias"]["prefill"])
    for key in ("decode_admission_tokens", "decode_kv_tokens", "wape", "bias", "baseline", "paused", "arrivals"):
        assert key in fc
    assert set(fc["sources"]) == {"sampler", "sandbox", "ready", "tool", "inflight"}
    assert fc["baseline"]["method"] == "persistence" and fc["paused"] is False
    now = requests.get(f"{base_url}/prorsa/forecast", timeout=10).json()  # the refresher's latest, precomputed
    assert now["horizon_s"] == 10 and now["live_trajectories"] == 2
    status = requests.get(f"{base_url}/lifecycle/status", timeout=10).json()
    assert status["events"]["invalid_transition"] == 1 and status["refresher"]["running"]


def test_control_events_over_http(base_url):
    r = post(base_url, "/lifecycle", {"events": [{"event": "generation_paused", "mode": "retract"},
                                                 {"event": "weights_updated", "weight_version": "3"}]})
    assert r.status_code == 200 and r.json()["applied"] == 2
    fc = requests.get(f"{base_url}/prorsa/forecast", params={"at": time.time()}, timeout=10).json()
    assert fc["paused"] is True and fc["weight_version"] == "3"
    r = post(base_url, "/lifecycle", {"event": "generation_continued"})
    assert r.status_code == 200 and r.json()["applied"] == 1
    r = post(base_url, "/lifecycle", {"event": "generation_paused", "mode": "sideways"})
    assert r.status_code == 422 and r.json()["field"] == "mode"


@pytest.mark.parametrize(
    "body, data, status, field, index",
    [
        (None, b"{not json", 400, "body", None),
        ({"events": [{"trajectory_id": "x", "event": "sampled"}, {"trajectory_id": "x", "event": "warp"}]}, None,
         422, "event", 1),
        ({"trajectory_id": "x", "event": "request_arrived", "prompt_tokens": -3}, None, 422, "prompt_tokens", 0),
        ({"trajectory_id": "x", "event": "request_arrived"}, None, 422, "prompt_tokens", 0),
        ({"trajectory_id": 5, "event": "sampled"}, None, 422, "trajectory_id", 0),
        ({"events": [{"trajectory_id": str(i), "event": "sampled"} for i in range(10_001)]}, None, 413, "events", None),
    ],
)
def test_bad_input_is_4xx_naming_index_and_field(base_url, body, data, status, field, index):
    before = requests.get(f"{base_url}/lifecycle/status", timeout=10).json()["live_trajectories"]
    r = post(base_url, "/lifecycle", body, data)
    assert r.status_code == status
    payload = r.json()
    assert payload["field"] == field and payload["index"] == index
    assert f"field '{field}'" in payload["error"]
    if index is not None:
        assert payload["error"].startswith(f"event {index}")
    assert requests.get(f"{base_url}/lifecycle/status", timeout=10).json()["live_trajectories"] == before  # atomic


def test_bad_config_and_forecast_time(base_url):
    r = post(base_url, "/lifecycle/config", {"injection": {"policy": "fixed_rate"}})
    assert r.status_code == 422 and r.json()["field"] == "injection"
    r = post(base_url, "/lifecycle/config", {"horizon_s": "ten"})
    assert r.status_code == 422 and r.json()["field"] == "horizon_s"
    assert requests.get(f"{base_url}/prorsa/forecast", params={"at": "nan"}, timeout=10).status_code == 422
    assert requests.get(f"{base_url}/prorsa/forecast", params={"at": "soon"}, timeout=10).status_code == 422
    assert requests.get(f"{base_url}/prorsa/forecast", timeout=10).status_code == 200


def test_an_idle_connection_outlives_client_pools(base_url):
    """As the front: an idle keep-alive connection is kept past uvicorn's 5 s default (SERVER_KEEPALIVE_S)."""
    from sglang_prorsa.testing.front_client import idle_keepalive_survives

    assert idle_keepalive_survives(base_url, 6.0) == (200, 200, True)
