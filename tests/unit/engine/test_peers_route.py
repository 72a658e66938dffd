"""``POST /prorsa/peers`` (srt/engine/routes.py): a peer pushed back under a new epoch -- a switch puts it back in
one push, already active -- is forgotten by this instance's scheduler before the view shows it, so no continuation
picks it while its old transfer endpoints are still cached here."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from sglang_prorsa.srt.engine.peers import Peer, PeerView
from sglang_prorsa.srt.engine.routes import make_engine_router


def peer(iid: str, role: str, status: str = "active", epoch: int = 0, port: int | None = None) -> Peer:
    return Peer(iid, f"http://{iid}", role, status, "127.0.0.1", port, epoch)


def test_a_peer_back_under_a_new_epoch_is_forgotten_before_it_can_be_picked():
    view = PeerView("d0")
    view.update([peer("p1", "prefill", status="draining", port=9001), peer("d1", "decode")], version=5)
    seen: list[tuple] = []

    class Scheduler:
        async def forget_prefills(self, peers):
            now = view.peers["p1"]
            seen.append(([p.instance_id for p in peers], now.status, now.epoch))
            return len(peers)

    endpoint = next(r.endpoint for r in make_engine_router(SimpleNamespace(peers=view, scheduler=Scheduler()),
                                                           cpu=True).routes if r.path == "/prorsa/peers")
    pushed = {"version": 6, "instances": [peer("p1", "decode", epoch=1, port=9001).to_json(),
                                          peer("d1", "decode").to_json()]}

    async def body():
        return pushed

    answer = asyncio.run(endpoint(SimpleNamespace(json=body)))
    assert json.loads(answer.body) == {"peers": 2, "version": 6, "forgotten": 1}
    assert seen == [(["p1"], "draining", 0)]  # forgotten while the view still held it out of the pools
    assert view.peers["p1"].active and view.peers["p1"].epoch == 1 and view.version == 6


def test_a_pushed_controller_is_followed_and_a_malformed_one_refused_naming_the_field():
    view = PeerView("d0")
    followed: list[str] = []

    class Scheduler:
        async def forget_prefills(self, peers):
            return 0

    side = SimpleNamespace(peers=view, scheduler=Scheduler(), events=SimpleNamespace(follow=followed.append))
    endpoint = next(r.endpoint for r in make_engine_router(side, cpu=True).routes if r.path == "/prorsa/peers")

    def push(controller):
        async def body():
            return {"version": 1, "instances": [peer("d0", "decode").to_json()], "controller": controller}

        return asyncio.run(endpoint(SimpleNamespace(json=body)))

    bad = push(5)
    assert bad.status_code == 422 and json.loads(bad.body)["field"] == "controller" and followed == []
    assert push("http://front:30000").status_code == 200 and followed == ["http://front:30000"]
