"""Instances on two hosts (issues 12 and 32): a controller started with no instances of its own, engine instances
started separately, exactly as the README tells a user (``--host 0.0.0.0 --prorsa-advertise-url``, no address
variables in their environment), that register with it by URL (``--prorsa-controller``), the Mooncake Store as the
KV store they share, sglang-router 0.3.2 in front, and a busy switch between them that is exact.

The two hosts are two network namespaces joined by a veth pair (``testing/two_hosts.py``): the controller, the
router, the Mooncake master and one decode instance on host A; the prefill instance, a second decode instance and the
slime-style engine on host B. Each host's 127.0.0.1 is its own, so anything advertised as loopback to the other host
fails. Where namespaces cannot be created, every process runs on this host's 127.0.0.1 and the checks that need two
hosts skip, saying why. Then an engine started the way slime starts one (our ``launch_server`` with SGLang's
signature) joins by ``POST /workers``, as slime posts it to its router. Last, the controller is killed (SIGKILL)
with a switch in flight under a rollout through the router, and restarted."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
from tests_support import ENGINE_FLAGS, LOGPROB_TOL, instances, max_logprob_gap

from sglang_prorsa.srt.utils import processes
from sglang_prorsa.testing import two_hosts
from sglang_prorsa.testing.front_client import (
    arrange,
    busiest,
    distinct_prompts,
    generate,
    instance_status,
    run_all,
    switch_under_load,
)

pytestmark = pytest.mark.integration


HORIZON_S = 4.0
NO_TWO_HOSTS = two_hosts.unavailable()  # None where two namespaces can be made here
PLACES = {"remote-0": ("prefill", "b"), "remote-1": ("decode", "a"), "remote-2": ("decode", "b")}


def seen_before_attach(url: str) -> dict:
    """What a controller with no instance yet answers: its horizon everywhere, and a tick that cannot decide."""
    tick = requests.post(url + "/prorsa/control_tick", timeout=30)
    return {"info": requests.get(url + "/prorsa/info", timeout=10).json(),
            "forecast": requests.get(url + "/prorsa/forecast", timeout=10).json(),
            "tick": (tick.status_code, tick.json()),
            "decision": requests.get(url + "/prorsa/decision", timeout=10).json()}


class Cluster:
    """The processes of the module, where they run, and how to start the controller again."""

    def __init__(self, hosts: two_hosts.TwoHosts | None) -> None:
        self.hosts = hosts
        self.controller: processes.ServerProcess | None = None
        self.router: processes.ServerProcess | None = None
        self.master = ""
        self.instances: dict[str, processes.ServerProcess] = {}

    def on(self, side: str) -> tuple[str | None, str]:
        """(network namespace, address) of host ``side``; this host's loopback without namespaces."""
        if self.hosts is None:
            return None, processes.LOOPBACK
        return (self.hosts.ns_a, self.hosts.host_a) if side == "a" else (self.hosts.ns_b, self.hosts.host_b)

    @property
    def url(self) -> str:
        return self.controller.url

    def bind(self, side: str, port: int) -> list[str]:
        """The README's flags for a server others reach: every address of its host, and the URL to advertise."""
        _, host = self.on(side)
        if self.hosts is None:
            return ["--host", host, "--port", str(port)]
        return ["--host", "0.0.0.0", "--prorsa-advertise-url", f"http://{host}:{port}", "--port", str(port)]

    def start_controller(self, port: int, log_dir: Path, extra: list[str], name: str) -> processes.ServerProcess:
        ns, host = self.on("a")
        self.controller = processes.start(
            ["--pd-adaptive", "--prorsa-instances", "0", "--prorsa-manual-switch", "--prorsa-min-dwell", "0",
             "--prorsa-horizon", str(HORIZON_S),  # not the default 10: every consumer must report this one
             "--prorsa-router", self.router.url, "--prorsa-log-dir", str(log_dir / name),
             "--host", host, "--port", str(port), *extra, *ENGINE_FLAGS],
            name=name, port=port, log_dir=log_dir, netns=ns, host=host)
        return self.controller


def start_router(cluster: Cluster, log_dir: Path) -> processes.ServerProcess:
    """sglang-router 0.3.2 in PD mode on host A with empty pools (the controller fills them)."""
    ns, host = cluster.on("a")
    port = processes.free_port()
    srv = processes.start(["--pd-disaggregation", "--host", host, "--port", str(port), "--policy", "round_robin",
                           "--log-level", "warn", "--prometheus-port", str(processes.free_port()),
                           "--prometheus-host", "127.0.0.1"],
                          name=f"sglang-router-{port}", port=port, log_dir=log_dir, module="sglang_router.launch_router",
                          netns=ns, host=host)
    srv.wait_ready(timeout=120, path="/workers")
    return srv


@pytest.fixture(scope="module")
def cluster(tiny_model, log_dir):
    with ExitStack() as stack:
        hosts = None if NO_TWO_HOSTS else stack.enter_context(two_hosts.two_hosts())
        c = Cluster(hosts)
        c.router = start_router(c, log_dir)
        stack.callback(c.router.stop)
        port = processes.free_port()
        c.start_controller(port, log_dir, ["--prorsa-kv-store", "mooncake"], "controller")
        stack.callback(lambda: c.controller.stop())  # whichever controller runs at the end
        stack.callback(lambda: stop_orphaned_master(c))
        c.controller.wait_ready(timeout=300)
        c.controller.before_attach = seen_before_attach(c.url)
        c.master = requests.get(c.url + "/prorsa/info", timeout=10).json()["kv_store"]["mooncake_master"]

        def remote(name: str, attempt: int = 0) -> processes.ServerProcess:
            role, side = PLACES[name]
            ns, host = c.on(side)
            iport, bport = processes.free_port(), processes.free_port()
            srv = processes.start(
                ["--prorsa-controller", c.url, "--prorsa-instance-id", name,
                 "--disaggregation-mode", role, "--disaggregation-bootstrap-port", str(bport),
                 "--prorsa-kv-store", "mooncake", "--prorsa-mooncake-master", c.master,
                 *c.bind(side, iport), *ENGINE_FLAGS],
                name=name + (f"-retry{attempt}" if attempt else ""), port=iport, log_dir=log_dir, netns=ns, host=host)
            stack.callback(srv.stop)
            return srv

        started = {name: remote(name) for name in PLACES}
        for name in PLACES:
            # One whose port another process bound first is started again on fresh ports, as an operator would, and
            # as the front does for the instances it starts.
            c.instances[name], _ = processes.ready_or_restarted(started[name], lambda attempt: remote(name, attempt),
                                                                retries=2, timeout=900)
        deadline = time.monotonic() + 120
        while sum(i["status"] == "active" for i in instances(c.url)) < 3:
            assert time.monotonic() < deadline, instances(c.url)
            time.sleep(0.5)
        yield c


def stop_orphaned_master(c: Cluster) -> None:
    """The Mooncake master the first controller started outlives that controller's SIGKILL (it runs in its own
    session, and the instances keep using it): ended here, by the PID listening on its port."""
    port = int(c.master.rsplit(":", 1)[1]) if c.master else 0
    ns, _ = c.on("a")
    for pid in two_hosts.listening_pids(ns, port):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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
    seen = cluster.controller.before_attach
    assert seen["info"]["horizon_s"] == seen["info"]["control_interval_s"] == HORIZON_S
    assert seen["forecast"]["horizon_s"] == seen["decision"]["horizon_s"] == HORIZON_S
    status, body = seen["tick"]
    assert status == 409 and body["code"] == "too_few_instances", body
    assert seen["decision"]["decision"] is None and seen["decision"]["cannot_decide"]["code"] == "too_few_instances"
    assert "Traceback" not in cluster.controller.log_path.read_text(errors="replace")
    # With its instances attached the same controller decides, on the same S.
    tick = requests.post(cluster.url + "/prorsa/control_tick", timeout=600)
    assert tick.status_code == 200, tick.text
    assert tick.json()["decision"]["inputs"]["S"] == tick.json()["forecast"]["horizon_s"] == HORIZON_S
    exposed = requests.get(cluster.url + "/prorsa/decision", timeout=10).json()
    assert exposed["horizon_s"] == HORIZON_S and exposed["cannot_decide"] is None


@pytest.fixture
def slime_engine(cluster, log_dir):
    """One more engine started the way slime starts its engines (``slime_engine.py``: our ``launch_server`` called
    with a ``ServerArgs`` in a spawned process, no ``--prorsa-controller``), a PD decode instance with its own
    bootstrap port, on host B. Registered by the test, as slime registers it with its router; removed from the front
    (``DELETE /workers/{id}``) and stopped after it, as slime's engine shutdown would."""
    here = str(Path(__file__).resolve().parent)
    ns, host = cluster.on("b")

    def start(attempt: int) -> processes.ServerProcess:
        port, bport = processes.free_port(), processes.free_port()
        return processes.start(
            ["--kv-store", "mooncake", "--mooncake-master", cluster.master, "--",
             "--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", str(bport),
             "--disaggregation-transfer-backend", "mooncake",
             "--host", host, "--port", str(port), *ENGINE_FLAGS],
            name=f"slime-engine-{attempt}", port=port, log_dir=log_dir, module="slime_engine",
            env={"PYTHONPATH": here}, netns=ns, host=host)

    srv = start(0)
    try:
        srv, _ = processes.ready_or_restarted(srv, start, retries=2, timeout=900)
        srv.wait_ready(timeout=300, path="/health_generate")
        srv.bootstrap_port = int(srv.argv[srv.argv.index("--disaggregation-bootstrap-port") + 1])
        srv.wid = f"{host}:{srv.port}"
        yield srv
    finally:
        try:
            requests.delete(f"{cluster.url}/workers/{srv.wid}", timeout=120)
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
    wid = slime_engine.wid
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
    # The whole answer of each that was not a 200 (a 503 once under a loaded CI host, its message cut off by the list).
    not_ok = [(i, s, out) for i, (s, out) in enumerate(results) if s != 200]
    assert [s for s, _ in results] == [200] * len(prompts), not_ok
    finished = [out["meta_info"]["finish_reason"]["type"] for _, out in results]
    assert "abort" in finished and set(finished) <= {"abort", "length"}, finished
    assert generate(cluster.url, prompts[0], 8)[0] == 200


@pytest.mark.skipif(NO_TWO_HOSTS is not None, reason=f"two network namespaces cannot be made here: {NO_TWO_HOSTS}")
def test_each_host_advertises_its_own_address_never_loopback(cluster):
    """Issue 32: what every process tells the other host is its own address on the pair, from its flags alone (its
    environment had no address variable): instance URLs, PD bootstrap hosts, the Mooncake master the controller
    started and each Mooncake Store client; the master listens on host A's address, not on loopback."""
    hosts = cluster.hosts
    where = {name: hosts.host_a if side == "a" else hosts.host_b for name, (_, side) in PLACES.items()}
    listed = {i["instance"]: i for i in instances(cluster.url)}
    assert {n: (i["url"].split("//")[1].rsplit(":", 1)[0], i["bootstrap_host"]) for n, i in listed.items()} == {
        n: (host, host) for n, host in where.items()}
    for name, host in where.items():
        advertised = requests.get(cluster.instances[name].url + "/prorsa/info", timeout=10).json()["advertised"]
        assert advertised["host"] == advertised["kv_store_client"] == host, (name, advertised)
        assert advertised["transfer"] == {"SGLANG_HOST_IP": host, "MC_TCP_BIND_ADDRESS": host}, (name, advertised)
        assert advertised["bootstrap"].startswith(host + ":")
        assert "SGLANG_HOST_IP" not in (cluster.instances[name].env or {})  # it came from the flags
    master_host, master_port = cluster.master.rsplit(":", 1)
    assert master_host == hosts.host_a
    assert (hosts.host_a, int(master_port)) in two_hosts.listening(hosts.ns_a)
    # Host B talks to host A at A's address: every connection between them is on the pair.
    peers = {peer.rsplit(":", 1)[0] for _, peer in two_hosts.connections(hosts.ns_b)}
    assert hosts.host_a in peers, peers


def router_pools(cluster) -> dict[str, str]:
    listed = requests.get(cluster.router.url + "/workers", timeout=10).json()["workers"]
    return {w["url"]: str(w.get("worker_type", "")).lower() for w in listed}


def test_controller_killed_mid_switch_behind_the_router_loses_nothing_and_a_restart_takes_over(cluster, log_dir):
    """Issue 32: a rollout goes through sglang-router; the controller starts a busy switch and is SIGKILLed while
    the instance switches. Every request is answered, identical to the unswitched run; the instance finishes the
    switch on its own; the instances keep serving through the router. A controller restarted on the same address
    (given the running Mooncake master) lists every instance within 30 s of answering, each in the role it has,
    puts each back into its router pool (none left out of every pool) and makes its next decision."""
    arrange(cluster.url, prefill=1)  # 1:2 again (the switch test made it 2:1): the busy decode is not the last one
    prompts = distinct_prompts(12, lambda i: 36 + 5 * i, seed=47)
    max_new = 300
    via_router = lambda p: generate(cluster.router.url, p, max_new)  # noqa: E731
    ref = run_all(via_router, prompts)
    assert all(s == 200 for s, _ in ref), ref
    urls = {i["instance"]: i["url"] for i in instances(cluster.url)}
    with ThreadPoolExecutor(len(prompts) + 1) as ex:
        rollout = [ex.submit(via_router, p) for p in prompts]
        deadline = time.monotonic() + 300
        while True:
            target = busiest(cluster.url, "decode")
            if instance_status(target["url"])["running"] >= 3:
                break
            assert time.monotonic() < deadline, instances(cluster.url)
            time.sleep(0.05)
        switch = ex.submit(requests.post, cluster.url + "/prorsa/switch",
                           json={"instance": target["instance"], "new_role": "prefill"}, timeout=600)
        deadline = time.monotonic() + 120
        while not instance_status(target["url"])["switching"]:  # the instance's own switch has begun
            assert time.monotonic() < deadline and not switch.done(), switch.result() if switch.done() else ""
            time.sleep(0.02)
        killed = cluster.controller
        os.kill(killed.pid, signal.SIGKILL)
        killed.proc.wait(timeout=30)
        with pytest.raises(requests.RequestException):
            switch.result(timeout=60)
        results = [f.result(timeout=900) for f in rollout]
    for (_, r), (s, out) in zip(ref, results):
        assert s == 200, out
        assert out["output_ids"] == r["output_ids"]
        assert max_logprob_gap(out, r) <= LOGPROB_TOL
    # The instance finished the switch without its controller, and serves in its new role.
    deadline = time.monotonic() + 120
    while instance_status(target["url"])["switching"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert instance_status(target["url"])["role"] == "prefill"
    assert generate(cluster.router.url, prompts[0], 8)[0] == 200  # the router still serves, no controller running

    restart = cluster.start_controller(killed.port, log_dir, ["--prorsa-kv-store", "mooncake",
                                                               "--prorsa-mooncake-master", cluster.master],
                                       "controller-restarted")
    restart.wait_ready(timeout=300)
    answered = time.monotonic()
    while {i["instance"] for i in instances(cluster.url) if i["status"] == "active"} != set(PLACES):
        assert time.monotonic() - answered < 30, instances(cluster.url)
        time.sleep(0.2)
    listed_after_s = time.monotonic() - answered
    roles = {i["instance"]: i["role"] for i in instances(cluster.url)}
    assert roles == {name: instance_status(url)["role"] for name, url in urls.items()}
    assert roles[target["instance"]] == "prefill"
    deadline = time.monotonic() + 120
    while router_pools(cluster) != {urls[n]: role for n, role in roles.items()}:
        assert time.monotonic() < deadline, (router_pools(cluster), roles)
        time.sleep(0.5)
    tick = requests.post(cluster.url + "/prorsa/control_tick", timeout=600)
    assert tick.status_code == 200, tick.text
    assert tick.json()["decision"]["inputs"]["S"] == HORIZON_S
    print(f"restarted controller listed every instance {listed_after_s:.1f} s after answering")
