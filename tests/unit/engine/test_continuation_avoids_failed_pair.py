"""A continuation does not spend its moves on the pair that just failed it (srt/engine/continuation.py).

A CI run answered a request 503 ``resume_failed`` after 16 moves, every one of them on the same pair: the request's
prompt holder (a prefill instance restarted at the same address) was preferred again after each hand-back, while
another prefill instance was active. The next attempt now goes to another pair when one is active, and back to
the same one only when nothing else is."""

from __future__ import annotations

import asyncio
import collections

import orjson
import pytest

from sglang_prorsa.srt.common.messages import MigratedRequest, Stage
from sglang_prorsa.srt.engine import continuation as cont
from sglang_prorsa.srt.engine.peers import Peer, PeerView
from sglang_prorsa.srt.engine.stitch import Kept, Shape, Stitcher

HANDED_BACK = {"error": {"message": "prorsa: continuation x handed back to its holder (prorsa_handed_on)"}}
DONE = {"output_ids": [9, 9], "meta_info": {"finish_reason": {"type": "length", "length": 2}}}


class Client:
    """The peer client: records which pair each attempt went to; decode stream k answers ``streams[k]``."""

    def __init__(self, view: PeerView, streams: list[dict]) -> None:
        self.peers = view
        self.streams = list(streams)
        self.pairs: list[tuple[str, str]] = []
        self.counters: collections.Counter[str] = collections.Counter()

    async def post_raw(self, url, raw, headers):
        return 200, b"{}"

    async def stream(self, url, raw, headers):
        body = orjson.loads(raw)
        prefill = self.peers.by_bootstrap(body["bootstrap_host"], body["bootstrap_port"])
        self.pairs.append((prefill.instance_id, url.split("//")[1].split("/")[0]))
        yield self.streams.pop(0)

    async def abort_on(self, peers, rid):
        return None


def view(prefills: list[str], decodes: list[str]) -> PeerView:
    v = PeerView("holder")
    peers = [Peer(p, f"http://{p}", "prefill", "active", "127.0.0.1", 7000 + i) for i, p in enumerate(prefills)]
    peers += [Peer(d, f"http://{d}", "decode", "active", "127.0.0.1", None) for d in decodes]
    v.update(peers)
    return v


def run(side: Client) -> list[dict]:
    # restarted from its prompt, its prompt holder is p0 (bootstrap port 7000): the first pick prefers it
    record = MigratedRequest(rid="r0", role="decode", stage=Stage.QUEUED, input_ids=[5, 6, 7], output_ids=[],
                             sampling_params={"max_new_tokens": 2}, bootstrap_host="127.0.0.1", bootstrap_port=7000)
    stitcher = Stitcher("r0", Kept(prompt_tokens=3, ids=[]), Shape(stream=False, incremental=False),
                        decode=lambda ids: " ".join(map(str, ids)))
    from sglang.srt.managers.io_struct import GenerateReqInput  # SGLang's request, as the continuation gets it

    c = cont.Continuation(GenerateReqInput(sampling_params={"max_new_tokens": 2}), record, stitcher, {},
                          peers=side.peers, client=side, counters=side.counters, holder="holder")

    async def collect():
        return [out async for out in c.run()]

    return asyncio.run(collect())


@pytest.fixture
def no_sleep(monkeypatch):
    async def sleep(s):
        pass

    monkeypatch.setattr(cont.asyncio, "sleep", sleep)


def test_after_a_hand_back_the_next_attempt_goes_to_another_pair(no_sleep):
    side = Client(view(["p0", "p1"], ["d0", "d1"]), [HANDED_BACK, HANDED_BACK, DONE])
    outs = run(side)
    assert outs[-1]["output_ids"] == [9, 9]
    assert side.pairs[0] == ("p0", "d0")  # the prompt holder first
    assert side.pairs[1] == ("p1", "d1")  # not p0 again, nor d0
    assert side.pairs[2] == ("p0", "d0")  # and back: only the last failed pair is avoided


def test_with_one_pair_it_is_tried_again(no_sleep):
    side = Client(view(["p0"], ["d0"]), [HANDED_BACK, DONE])
    outs = run(side)
    assert outs[-1]["output_ids"] == [9, 9] and side.pairs == [("p0", "d0"), ("p0", "d0")]


def test_a_pair_that_keeps_failing_does_not_take_every_move(no_sleep):
    # p0 hands back every time (as the restarted instance did); p1 serves
    side = Client(view(["p0", "p1"], ["d0"]), [HANDED_BACK, DONE])
    outs = run(side)
    assert outs[-1]["output_ids"] == [9, 9]
    assert side.pairs == [("p0", "d0"), ("p1", "d0")]  # the decode instance is shared: the pair still differs
