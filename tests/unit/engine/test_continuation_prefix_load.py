"""A persisted prefix that fails to load is tried on another pair before it is recomputed (srt/engine/continuation.py):
recomputing what the store holds is the duplicated prompt work a busy switch must not cause (issue 14)."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace

from unit_support import one_chunk_stitcher

from sglang_prorsa.srt.common.messages import MigratedRequest, Stage
from sglang_prorsa.srt.engine import continuation as cont
from sglang_prorsa.srt.engine.peers import Peer


class Client:
    """The peer client a continuation talks to, with its peer view and counters: pairs p0+d0, p1+d0, ... in turn;
    prefix loads answer ``load_statuses`` in turn; a decode stream finishes the request at once."""

    def __init__(self, load_statuses: list[int]) -> None:
        self.load_statuses = list(load_statuses)
        self.counters: collections.Counter[str] = collections.Counter()
        self.loads: list[str] = []
        self.streams: list[str] = []
        self.picks = 0
        self.peers = SimpleNamespace(pick_pair=self.pick_pair, acquire=lambda *p: None, release=lambda *p: None)

    def pick_pair(self, exclude=frozenset(), prefer_prefill=None, decode_here=False):
        k, self.picks = self.picks, self.picks + 1
        return (Peer(f"p{k}", f"http://p{k}", "prefill", "active", "127.0.0.1", 7000 + k, 0),
                Peer("d0", "http://d0", "decode", "active", "127.0.0.1", None, 0))

    async def load_prefix(self, prefill, tokens, record, rid):
        self.loads.append(prefill.instance_id)
        status = self.load_statuses.pop(0)
        return {"load_status": status, **({"loaded_tokens": len(tokens)} if status == 200 else {})}

    async def post_raw(self, url, raw, headers):
        return 200, b"{}"

    async def stream(self, url, raw, headers):
        self.streams.append(url)
        yield {"output_ids": [9], "meta_info": {"cached_tokens": 4, "finish_reason": {"type": "length"}}}

    async def abort_on(self, peers, rid):
        pass


def run(side: Client) -> tuple[cont.Continuation, list[dict]]:
    stitcher = one_chunk_stitcher()
    record = MigratedRequest(rid="r0", role="decode", stage=Stage.RUNNING, input_ids=[5, 6, 7], output_ids=[1],
                             sampling_params={"max_new_tokens": 3}, kv_tokens=4)
    from sglang.srt.managers.io_struct import GenerateReqInput  # SGLang's request, as the continuation gets it

    c = cont.Continuation(GenerateReqInput(sampling_params={"max_new_tokens": 4}), record, stitcher, {},
                          peers=side.peers, client=side, counters=side.counters, holder="holder")

    async def collect():
        return [out async for out in c.run()]

    return c, asyncio.run(collect())


def test_a_failed_load_moves_to_another_pair_instead_of_recomputing(monkeypatch):
    async def no_sleep(s):
        pass

    monkeypatch.setattr(cont.asyncio, "sleep", no_sleep)
    side = Client([503, 200])
    c, outs = run(side)
    assert len(outs) == 1 and side.loads == ["p0", "p1"]
    assert side.streams == ["http://d0/generate"]  # nothing was sent with the failed load
    first, second = c.stitcher.migrations
    assert first["to_prefill"] == "p0" and first["load_status"] == 503 and "failed" in first
    assert second["to_prefill"] == "p1" and second["load_status"] == 200 and "failed" not in second
    assert side.counters["prefix_loads_failed"] == 1


def test_after_the_retries_the_prefix_is_recomputed_rather_than_the_request_failed(monkeypatch):
    async def no_sleep(s):
        pass

    monkeypatch.setattr(cont.asyncio, "sleep", no_sleep)
    side = Client([503] * (cont.LOAD_RETRIES + 1))
    c, outs = run(side)
    assert len(outs) == 1 and len(side.loads) == cont.LOAD_RETRIES + 1
    assert len(side.streams) == 1  # the last attempt went ahead and recomputed
    assert side.counters["prefix_loads_failed"] == cont.LOAD_RETRIES + 1
    assert "failed" not in c.stitcher.migrations[-1]
