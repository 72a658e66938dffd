"""A whole request from an in-process caller on a PD instance is paired by the engine (srt/engine/in_process.py):
on a decode instance that admits requests, its prefill half goes to the least loaded prefill peer and its decode half
stays here; anywhere else it is handed on. A request that names a room, or came over HTTP, is not ours to pair."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace

import orjson
from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_prorsa.srt.common.messages import ROLE_HEADER
from sglang_prorsa.srt.engine import in_process
from sglang_prorsa.srt.engine.peers import Peer, PeerView


class Client:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[tuple[str, dict, dict]] = []

    async def post_raw(self, url: str, raw: bytes, headers: dict[str, str]):
        self.posts.append((url, orjson.loads(raw), headers))
        return self.status, b"{}"


def side(role: str = "decode", admitting: bool = True, peers: tuple[Peer, ...] = ()) -> SimpleNamespace:
    view = PeerView("me")
    view.update([Peer("me", "http://me", role, "active", "10.0.0.9", 7000), *peers])

    async def prompt_ids(obj):
        return list(obj.input_ids)

    return SimpleNamespace(role=role, admission=SimpleNamespace(admitting=admitting), peers=view, client=Client(),
                           tm_view=SimpleNamespace(prompt_ids=prompt_ids), counters=collections.Counter())


P1 = Peer("p1", "http://p1", "prefill", "active", "10.0.0.1", 7001)
P2 = Peer("p2", "http://p2", "prefill", "active", "10.0.0.2", 7002)


def test_which_requests_the_engine_pairs():
    whole = GenerateReqInput(input_ids=[1, 2, 3])
    assert in_process.needs_pairing(whole, None, "decode") and in_process.needs_pairing(whole, None, "prefill")
    assert not in_process.needs_pairing(whole, object(), "decode")  # over HTTP: the front or router paired it
    assert not in_process.needs_pairing(whole, None, "null")  # a colocated instance serves it whole
    half = GenerateReqInput(input_ids=[1, 2, 3], bootstrap_host="h", bootstrap_port=1, bootstrap_room=5)
    assert not in_process.needs_pairing(half, None, "decode")  # its caller paired it (verl's PD replicas)


def test_its_decode_half_runs_here_only_on_an_admitting_decode_instance_with_a_prefill_peer():
    assert in_process.pairs_here(side(peers=(P1,)))
    assert not in_process.pairs_here(side())  # no prefill peer: handed on (it waits for a pair there)
    assert not in_process.pairs_here(side(admitting=False, peers=(P1,)))  # a switch is running
    assert not in_process.pairs_here(side(role="prefill", peers=(P1,)))
    busy = side(peers=(P1, Peer("p1b", "http://p1b", "prefill", "draining", "10.0.0.3", 7003)))
    assert in_process.pairs_here(busy)


def test_the_prefill_half_goes_to_the_least_loaded_prefill_peer_with_the_callers_fields():
    s = side(peers=(P1, P2))
    s.peers.acquire(P1)  # one continuation on p1 already
    obj = GenerateReqInput(input_ids=[4, 5, 6], sampling_params={"max_new_tokens": 3, "temperature": 0},
                           return_logprob=True, routing_key="traj-1")

    async def go():
        await in_process.send_prefill_half(s, obj)
        await asyncio.gather(*in_process._SENDING)

    asyncio.run(go())
    (url, body, headers), = s.client.posts
    assert url == "http://p2/generate" and headers[ROLE_HEADER] == "prefill"
    assert (obj.bootstrap_host, obj.bootstrap_port) == ("10.0.0.2", 7002) and 0 <= obj.bootstrap_room < 2 ** 63
    assert body["bootstrap_room"] == obj.bootstrap_room and body["input_ids"] == [4, 5, 6]
    assert body["sampling_params"] == {"max_new_tokens": 3, "temperature": 0}
    assert body["return_logprob"] is True and body["routing_key"] == "traj-1"
    assert body["rid"].startswith("prorsa-") and body["rid"] != obj.rid
    assert s.counters["in_process_paired"] == 1
    assert s.peers.inflight == {"p1": 1}  # p2's count was given back when its half answered
