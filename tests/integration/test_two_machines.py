"""Instances on any machine (issue 12): a controller started with no instances of its own, engine instances started
separately that register with it by URL (``--prorsa-controller``), the Mooncake Store as the KV store they share,
and a busy switch between them that is exact. Both "machines" are this one, on 127.0.0.1."""

from __future__ import annotations

import time
from contextlib import ExitStack

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
