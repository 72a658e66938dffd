"""The peer list is pushed once per change (srt/controller/orchestrator.py): one switch sends it to every instance
twice -- out of the pools, back under the new role -- where it used to send it three times (the last two back to
back), and a push of an unchanged list sends nothing but to an instance that did not accept the last one."""

from __future__ import annotations

import asyncio
from collections import Counter

from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.orchestrator import Orchestrator


class Http:
    """Three instances answering the controller; ``refuse`` names instances that answer the peer push 503."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.pushed: Counter[str] = Counter()  # instance url -> peer lists received
        self.lists: list[tuple[str, dict, State]] = []  # (url, payload, the switched instance's state then)
        self.refuse: set[str] = set()

    async def get(self, url: str, timeout_s: float = 10.0):
        assert url.endswith("/prorsa/status")
        return 200, {"held_by": []}

    async def post(self, url: str, payload=None, timeout_s: float = 30.0):
        base, _, path = url.partition("/prorsa/")
        if path == "peers":
            self.pushed[base] += 1
            self.lists.append((base, payload, self.registry.get("d1").state))
            return (503, {"error": "busy"}) if base in self.refuse else (200, {"peers": len(payload["instances"])})
        assert path == "switch_role", url
        return 200, {"taken": 3, "sweeps": 1, "timings": {}}


def deployment() -> tuple[Registry, Http, Orchestrator]:
    registry = Registry()
    for iid, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
        registry.add(Instance(iid, f"http://{iid}", role, bootstrap_port=9000 + len(registry), state=State.ACTIVE))
    http = Http(registry)
    return registry, http, Orchestrator(registry, http)


def test_one_switch_pushes_the_peer_list_to_each_instance_once_per_change():
    registry, http, orch = deployment()
    asyncio.run(orch.push_peers())  # start-up: every instance learns the list
    http.pushed.clear()
    http.lists.clear()
    asyncio.run(orch.switch("d1", "prefill"))
    assert http.pushed == {"http://p0": 2, "http://d0": 2, "http://d1": 2}  # was 3 each
    out, back = ([payload for url, payload, _ in http.lists if url == "http://d0"])
    d1_out = next(i for i in out["instances"] if i["instance_id"] == "d1")
    d1_back = next(i for i in back["instances"] if i["instance_id"] == "d1")
    assert d1_out["status"] == "draining" and d1_out["role"] == "decode" and d1_out["epoch"] == 0
    assert d1_back == {**d1_out, "status": "active", "role": "prefill", "epoch": 1}
    # The instances learn it back (and forget its old endpoints) before the front routes to it.
    assert {state for _, payload, state in http.lists if payload is back} == {State.SWITCHING}
    inst = registry.get("d1")
    assert inst.state is State.ACTIVE and inst.role == "prefill"
    assert back["instances"] == registry.peers_payload()["instances"]  # what was pushed is the registry now


def test_an_unchanged_list_is_not_pushed_again_but_to_an_instance_that_missed_it():
    registry, http, orch = deployment()
    http.refuse = {"http://d0"}
    asyncio.run(orch.push_peers())
    asyncio.run(orch.push_peers())  # nothing changed: only d0, which did not accept it, is sent it again
    assert http.pushed == {"http://p0": 1, "http://d0": 2, "http://d1": 1}
    http.refuse = set()
    asyncio.run(orch.push_peers())
    asyncio.run(orch.push_peers())
    assert http.pushed == {"http://p0": 1, "http://d0": 3, "http://d1": 1}
    registry.set_state(registry.get("p0"), State.UNHEALTHY)  # a change: everyone, once
    asyncio.run(orch.push_peers())
    asyncio.run(orch.push_peers())
    assert http.pushed == {"http://p0": 2, "http://d0": 4, "http://d1": 2}
    assert orch.peer_pushes == 8


def test_an_instance_announcing_itself_again_is_sent_the_list_it_did_not_accept():
    """An instance restarted under its id before the health checks saw it die: the push at its first registration
    reached the dead process, so its heartbeat (a registration that is not new) delivers the list -- and a
    heartbeat of an instance that has it sends nothing."""
    from types import SimpleNamespace

    from sglang_prorsa.srt.controller import workers

    registry, http, orch = deployment()
    http.refuse.add("http://d1")
    asyncio.run(orch.push_peers())
    http.pushed.clear()
    http.refuse.clear()
    front = SimpleNamespace(registry=registry, orchestrator=orch)
    inst, new = asyncio.run(workers.join(front, "d1", "http://d1", "decode", "127.0.0.1", 9002))
    assert (inst.instance_id, new) == ("d1", False)
    assert http.pushed == {"http://d1": 1}
    asyncio.run(workers.join(front, "d0", "http://d0", "decode", "127.0.0.1", 9001))
    assert http.pushed == {"http://d1": 1}
