"""A continuation stops at the second instance death (srt/engine/continuation.py, issue 29): a request whose
prefill instance died (the record counts it) and whose next pair dies too is answered ``suspected_poison``, not
sent to a third pair; each attempt tells its instances how many died before (``X-Prorsa-Lost``)."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace

import aiohttp
import pytest

from sglang_prorsa.srt.common.messages import LOST_HEADER, MigratedRequest, Stage
from sglang_prorsa.srt.engine import continuation as cont
from sglang_prorsa.srt.engine.peers import Peer


class Client:
    """The peer client a continuation is given, with its peer view and counters; each attempt's decode stream does
    what ``streams`` says."""

    def __init__(self, streams: list) -> None:
        self.streams = streams
        self.sent: list[dict[str, str]] = []
        self.counters: collections.Counter = collections.Counter()
        self.peers = SimpleNamespace(pick_pair=self.pick_pair, acquire=lambda p, d: None,
                                     release=lambda p, d: None, by_bootstrap=lambda h, p: None)

    def pick_pair(self, exclude=frozenset(), prefer_prefill=None, decode_here=False):
        n = len(self.sent)
        return (Peer(f"p{n}", f"http://p{n}", "prefill", "active", "127.0.0.1", 1, 0),
                Peer(f"d{n}", f"http://d{n}", "decode", "active", "127.0.0.1", None, 0))

    async def post_raw(self, url, raw, headers):
        return 200, b"{}"

    async def stream(self, url, raw, headers):
        self.sent.append(headers)
        what = self.streams[len(self.sent) - 1]
        if isinstance(what, BaseException):
            raise what
        yield what

    async def abort_on(self, peers, rid):
        return None


_sleep = asyncio.sleep


def no_wait(seconds: float):
    return _sleep(0)


def run(side: Client, deaths: int) -> list[dict]:
    record = MigratedRequest(rid="r0", role="decode", stage=Stage.QUEUED, input_ids=[5, 6, 7], output_ids=[],
                             sampling_params={"max_new_tokens": 4}, deaths=deaths)
    stitcher = SimpleNamespace(ids=[], finished=False, rid="r0", migrations=[], rebase=lambda: None,
                               update=lambda chunk: None, straddle_stop=False)
    from sglang.srt.managers.io_struct import GenerateReqInput  # SGLang's request, as the continuation gets it

    obj = GenerateReqInput(sampling_params={"max_new_tokens": 4})

    async def collect():
        c = cont.Continuation(obj, record, stitcher, {}, peers=side.peers, client=side, counters=side.counters,
                              holder="holder")
        return [out async for out in c.run()]

    return asyncio.run(collect())


def test_a_request_whose_prefill_died_stops_when_its_next_decode_dies_too(monkeypatch):
    monkeypatch.setattr(cont.asyncio, "sleep", no_wait)
    side = Client([aiohttp.ServerDisconnectedError(), {"never": "reached"}])
    with pytest.raises(cont.SuspectedPoison, match="suspected_poison: request r0 was on 2 instances"):
        run(side, deaths=1)
    assert [h[LOST_HEADER] for h in side.sent] == ["1"]  # one attempt, told of the first death
    assert side.counters["suspected_poison"] == 1


def test_a_request_that_met_two_deaths_is_not_sent_at_all():
    side = Client([])
    with pytest.raises(cont.SuspectedPoison):
        run(side, deaths=2)
    assert side.sent == []


def test_an_attempt_stopped_as_poison_by_its_instance_stops_its_holder(monkeypatch):
    monkeypatch.setattr(cont.asyncio, "sleep", no_wait)
    side = Client([cont.ResumeFailed("http://d0/generate answered 502: {\"detail\":\"suspected_poison: ...\"}"),
                 {"never": "reached"}])
    with pytest.raises(cont.SuspectedPoison):
        run(side, deaths=0)
    assert len(side.sent) == 1


def test_failures_that_are_not_deaths_are_retried_as_before(monkeypatch):
    monkeypatch.setattr(cont.asyncio, "sleep", no_wait)
    side = Client([cont.ResumeFailed("decode d0 took the continuation off without continuing it")] * 3
                + [aiohttp.ServerDisconnectedError()] * 2)
    with pytest.raises(cont.SuspectedPoison):
        run(side, deaths=0)
    assert [h[LOST_HEADER] for h in side.sent] == ["0", "0", "0", "0", "1"]


def _request(**headers):
    return SimpleNamespace(headers={k.lower(): v for k, v in headers.items()} | headers)


def test_a_continuation_half_whose_prefill_died_is_handed_back_saying_so_until_the_second_death():
    from sglang_prorsa.srt.common.messages import RESUME_HEADER
    from sglang_prorsa.srt.engine.aborts import INSTANCE_LOST, HandedBack, _hand_back_if_queued

    counters = collections.Counter()

    def record(deaths):
        return MigratedRequest(rid="c", role="decode", stage=Stage.QUEUED, input_ids=[1], output_ids=[],
                               sampling_params={}, deaths=deaths)

    with pytest.raises(HandedBack) as e:  # taken off by a switch: handed back, no death
        _hand_back_if_queued(counters, _request(**{RESUME_HEADER: "1", LOST_HEADER: "0"}), record(0))
    assert INSTANCE_LOST not in str(e.value)
    with pytest.raises(HandedBack, match=INSTANCE_LOST):  # its prefill died: the holder counts it
        _hand_back_if_queued(counters, _request(**{RESUME_HEADER: "1", LOST_HEADER: "0"}), record(1))
    # its prefill died and one instance had died before: not handed back, continued here as poison (refused)
    kept = _hand_back_if_queued(counters, _request(**{RESUME_HEADER: "1", LOST_HEADER: "1"}), record(1))
    assert kept.deaths == 2
    # a request from a caller (no resume header) keeps its record, its deaths counted from the header
    assert _hand_back_if_queued(counters, _request(**{LOST_HEADER: "1"}), record(0)).deaths == 1
    assert _hand_back_if_queued(counters, _request(**{LOST_HEADER: "junk"}), record(0)).deaths == 0
