"""Instances on any machine (issue 12): a controller started with no instances of its own, engine instances started
separately that register with it by URL (``--prorsa-controller``), the Mooncake Store as the KV store they share,
and a busy switch between them that is exact. Both "machines" are this one, on 127.0.0.1. Last, an engine started
the way slime starts one (our ``launch_server`` with SGLang's signature) joins by ``POST /workers``, as slime posts
it to its router."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
from tests_support import ENGINE_FLAGS, LOGPROB_TOL, instances, max_logprob_gap

from sglang_prorsa.srt.utils import processes
from sglang_prorsa.testing.front_client import busiest, distinct_prompts, generate, run_all, switch_under_load

pytestmark = pytest.mark.integration


HORIZON_S = 4.0


def seen_before_attach(url: str) -> dict:
    """What a controller with no instance yet answers: its horizon everywhere, and a tick that cannot decide."""
    tick = requests.post(url + "/prorsa/control_tick", timeout=30)
    return {"info": requests.get(url + "/prorsa/info", timeout=10).json(),
            "forecast": requests.get(url + "/prorsa/forecast", timeout=10).json(),
            "tick": (tick.status_code, tick.json()),
            "decision": requests.get(url + "/prorsa/decision", timeout=10).json()}


@pytest.fixture(scope="module")
def cluster(tiny_model, log_dir):
    port = processes.free_port()
    with ExitStack() as stack:
        controller = processes.start(
            ["--pd-adaptive", "--prorsa-instances", "0", "--prorsa-manual-switch", "--prorsa-min-dwell", "0",
             "--prorsa-horizon", str(HORIZON_S),  # not the default 10: every consumer must report this one
             "--prorsa-kv-store", "mooncake", "--prorsa-log-dir", str(log_dir / "controller"),
             "--host", processes.LOOPBACK, "--port", str(port), *ENGINE_FLAGS],
            name=f"controller-{port}", port=port, log_dir=log_dir)
        stack.callback(controller.stop)
        controller.wait_ready(timeout=300)
        controller.before_attach = seen_before_attach(controller.url)
        master = requests.get(controller.url + "/prorsa/info", timeout=10).json()["kv_store"]["mooncake_master"]

        def remote(k: int, role: str, attempt: int = 0) -> processes.ServerProcess:
            iport, bport = processes.free_port(), processes.free_port()
            srv = processes.start(
                ["--prorsa-controller", controller.url, "--prorsa-instance-id", f"remote-{k}",
                 "--disaggregation-mode", role, "--disaggregation-bootstrap-port", str(bport),
                 "--prorsa-kv-store", "mooncake", "--prorsa-mooncake-master", master,
                 "--host", processes.LOOPBACK, "--port", str(iport), *ENGINE_FLAGS],
                name=f"remote-{k}" + (f"-retry{attempt}" if attempt else ""), port=iport, log_dir=log_dir)
            stack.callback(srv.stop)
            return srv

        roles = ("prefill", "decode", "decode")
        started = [remote(k, role) for k, role in enumerate(roles)]
        for k, role in enumerate(roles):
            # One whose port another process bound first is started again on fresh ports, as an operator would, and
            # as the front does for the instances it starts.
            processes.ready_or_restarted(started[k], lambda attempt: remote(k, role, attempt), retries=2, timeout=900)
        deadline = time.monotonic() + 120
        while sum(i["status"] == "active" for i in instances(controller.url)) < 3:
            assert time.monotonic() < deadline, instances(controller.url)
            time.sleep(0.5)
        yield controller


def test_instances_attach_by_url(cluster):
    insts = {i["instance"]: i for i in instances(cluster.url)}
    assert set(insts) == {"remote-0", "remote-1", "remote-2"}
    assert [insts[f"remote-{k}"]["role"] for k in range(3)] == ["prefill", "decode", "decode"]
    assert not any(i["started_here"] for i in insts.values())


def test_busy_switch_between_machines_is_exact(cluster):
    prompts = distinct_prompts(12, lambda i: 40 + 7 * i, seed=5)
    max_new = 400  # long enough to still run when the switch arrives, seconds after they start (see test_busy_switch)
    ref = run_all(lambda p: generate(cluster.url, p, max_new), prompts)
    sw, got, before = switch_under_load(cluster.url, lambda p: generate(cluster.url, p, max_new), prompts,
                                        lambda: busiest(cluster.url, "decode"), "prefill",
                                        ready=lambda st: st["running"] >= 4, settle_s=0.3)
    assert sw.status_code == 200, sw.text
    assert sw.json()["taken"] >= 4 and sw.json()["persisted_bytes"] > 0, sw.json()
    loaded = 0
    for (_, r), (s, out) in zip(ref, got):
        assert s == 200, out
        assert out["output_ids"] == r["output_ids"]
        assert max_logprob_gap(out, r) <= LOGPROB_TOL
        for move in out["meta_info"].get("prorsa", {}).get("migrations", []):
            loaded += move.get("loaded_tokens", 0)
    assert loaded > 0  # prefixes came back from the Mooncake Store
    roles = {i["instance"]: i["role"] for i in instances(cluster.url)}
    assert roles[before["instance"]] == "prefill"


def test_one_horizon_and_a_coded_refusal_before_any_instance_attaches(cluster):
    """Issue 11: --prorsa-horizon reaches the control plane, the controller and the control interval; a controller
    with nothing to allocate yet answers a tick with a typed 409, not a 500, and logs no traceback."""
    seen = cluster.before_attach
    assert seen["info"]["horizon_s"] == seen["info"]["control_interval_s"] == HORIZON_S
    assert seen["forecast"]["horizon_s"] == seen["decision"]["horizon_s"] == HORIZON_S
    status, body = seen["tick"]
    assert status == 409 and body["code"] == "too_few_instances", body
    assert seen["decision"]["decision"] is None and seen["decision"]["cannot_decide"]["code"] == "too_few_instances"
    assert "Traceback" not in cluster.log_path.read_text(errors="replace")
    # With its instances attached the same controller decides, on the same S.
    tick = requests.post(cluster.url + "/prorsa/control_tick", timeout=600)
    assert tick.status_code == 200, tick.text
    assert tick.json()["decision"]["inputs"]["S"] == tick.json()["forecast"]["horizon_s"] == HORIZON_S
    exposed = requests.get(cluster.url + "/prorsa/decision", timeout=10).json()
    assert exposed["horizon_s"] == HORIZON_S and exposed["cannot_decide"] is None


@pytest.fixture(scope="module")
def slime_engine(cluster, log_dir):
    """One more engine started the way slime starts its engines (``slime_engine.py``: our ``launch_server`` called
    with a ``ServerArgs`` in a spawned process, no ``--prorsa-controller``), a PD decode instance with its own
    bootstrap port. Registered by the test, as slime registers it with its router."""
    master = requests.get(cluster.url + "/prorsa/info", timeout=10).json()["kv_store"]["mooncake_master"]
    here = str(Path(__file__).resolve().parent)

    def start(attempt: int) -> processes.ServerProcess:
        port, bport = processes.free_port(), processes.free_port()
        return processes.start(
            ["--kv-store", "mooncake", "--mooncake-master", master, "--",
             "--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", str(bport),
             "--disaggregation-transfer-backend", "mooncake",
             "--host", processes.LOOPBACK, "--port", str(port), *ENGINE_FLAGS],
            name=f"slime-engine-{attempt}", port=port, log_dir=log_dir, module="slime_engine",
            env={"PYTHONPATH": here})

    srv = start(0)
    try:
        srv, _ = processes.ready_or_restarted(srv, start, retries=2, timeout=900)
        srv.wait_ready(timeout=300, path="/health_generate")
        srv.bootstrap_port = int(srv.argv[srv.argv.index("--disaggregation-bootstrap-port") + 1])
        yield srv
    finally:
        srv.stop()


def events_sent(url: str) -> float:
    found = re.search(r"prorsa_lifecycle_events_sent_total\{[^}]*\} ([0-9.e+]+)",
                      requests.get(url + "/prorsa/metrics", timeout=10).text)
    assert found is not None
    return float(found.group(1))


def test_a_slime_style_engine_registers_by_url_switches_busy_exactly_and_takes_the_abort_loop(cluster, slime_engine):
    """slime's flow, its code unchanged: POST /workers as slime posts a decode engine to its router (url and
    worker_type; a bootstrap port only for prefill), a rollout through the front, a busy switch of that engine,
    then slime's end-of-rollout loop: GET /workers, POST /abort_request {"abort_all": true} to every URL listed."""
    url = slime_engine.url
    body = {"url": url, "worker_type": "decode"}  # slime/backends/sglang_utils/sglang_engine.py, _init_normal
    first = requests.post(cluster.url + "/workers", json=body, timeout=60)
    again = requests.post(cluster.url + "/workers", json=body, timeout=60)
    wid = f"{processes.LOOPBACK}:{slime_engine.port}"
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert (first.json()["worker_id"], first.json()["new"]) == (wid, True)
    assert (again.json()["worker_id"], again.json()["new"]) == (wid, False)
    assert first.json()["worker"] == {"id": wid, "url": url, "worker_type": "decode",
                                      "bootstrap_port": slime_engine.bootstrap_port, "is_healthy": True,
                                      "status": "active"}
    listed = requests.get(cluster.url + "/workers", timeout=10).json()
    assert sorted(w["id"] for w in listed["workers"]) == sorted([wid, "remote-0", "remote-1", "remote-2"])
    info = requests.get(url + "/prorsa/info", timeout=10).json()
    assert info["controller"] is None  # it never registered itself; the front's peer push told it where events go
    assert info["events_to"] == cluster.url + "/lifecycle"

    prompts = distinct_prompts(16, lambda i: 30 + 5 * i, seed=31)
    max_new = 200  # still decoding when the switch comes (the switch waits for >= 2 running there)
    ref = run_all(lambda p: generate(cluster.url, p, max_new, headers={"X-Trajectory-Id": f"slime-{p[0]}-{len(p)}"}),
                  prompts)
    assert any(r["route"].endswith("/" + wid) for _, r in ref), [r["route"] for _, r in ref]  # it decoded some
    deadline = time.monotonic() + 10  # its request events went to the front's forecast (batched every 50 ms)
    while events_sent(url) == 0:
        assert time.monotonic() < deadline, requests.get(url + "/prorsa/metrics", timeout=10).text
        time.sleep(0.2)
    target = {"instance": wid, "url": url}
    sw, got, before = switch_under_load(cluster.url, lambda p: generate(cluster.url, p, max_new), prompts, target,
                                        "prefill", ready=lambda st: st["running"] >= 2, settle_s=0.3)
    assert sw.status_code == 200, sw.text
    assert before["running"] >= 2 and sw.json()["taken"] >= 2, (before, sw.json())
    for (_, r), (s, out) in zip(ref, got):
        assert s == 200, out
        assert out["output_ids"] == r["output_ids"]
        assert max_logprob_gap(out, r) <= LOGPROB_TOL
    assert {i["instance"]: i["role"] for i in instances(cluster.url)}[wid] == "prefill"

    # slime's abort at the end of a rollout (slime/rollout/sglang_rollout.py, abort), with requests in flight.
    with ThreadPoolExecutor(len(prompts)) as ex:
        rollout = [ex.submit(generate, cluster.url, p, 2000) for p in prompts]
        deadline = time.monotonic() + 300
        while sum(i["running"] for i in instances(cluster.url) if i["role"] == "decode") < 4:
            assert time.monotonic() < deadline, instances(cluster.url)
            time.sleep(0.05)
        urls = [w["url"] for w in requests.get(cluster.url + "/workers", timeout=10).json()["workers"]]
        aborts = {u: requests.post(u + "/abort_request", json={"abort_all": True}, timeout=60).status_code
                  for u in urls}
        results = [f.result(timeout=600) for f in rollout]
    assert len(urls) == 4 and url in urls
    assert aborts == {u: 200 for u in urls}
    assert [s for s, _ in results] == [200] * len(prompts), results
    finished = [out["meta_info"]["finish_reason"]["type"] for _, out in results]
    assert "abort" in finished and set(finished) <= {"abort", "length"}, finished
    assert generate(cluster.url, prompts[0], 8)[0] == 200
