"""A continuation waits for an active prefill+decode pair without spending its moves (srt/engine/continuation.py).

Before, each pair-less pick counted as one of the 16 moves, so a request gave up after ~27 s without a prefill peer
(a 5,000-request soak failed 20 requests with 503 while its instances were being switched). Now waiting is bounded
by time (NO_PAIR_WAIT_S) and only past that is the caller told, explicitly."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from sglang_prorsa.srt.common.messages import MigratedRequest, Stage
from sglang_prorsa.srt.engine import continuation as cont
from sglang_prorsa.srt.engine.peers import NoPair, Peer


class Peers:
    def __init__(self, pair_after: int | None) -> None:
        self.pair_after, self.picks = pair_after, 0

    def pick_pair(self, exclude=frozenset(), prefer_prefill=None, decode_here=False):
        self.picks += 1
        if self.pair_after is None or self.picks <= self.pair_after:
            raise NoPair("no active prefill peer to continue on")
        return (Peer("p", "http://p", "prefill", "active", "127.0.0.1", 1, 0),
                Peer("d", "http://d", "decode", "active", "127.0.0.1", None, 0))


def continuation(monkeypatch, peers: Peers) -> tuple[cont.Continuation, list[float]]:
    pauses: list[float] = []

    async def sleep(s: float) -> None:
        pauses.append(s)

    monkeypatch.setattr(cont.asyncio, "sleep", sleep)
    stitcher = SimpleNamespace(ids=[1, 2], finished=False, rid="r0", rebase=lambda: None)

    async def attempt(self, prefill, decode, sampling, failures):
        self.stitcher.finished = True
        yield {"to": (prefill.instance_id, decode.instance_id), "max_new_tokens": sampling["max_new_tokens"]}

    monkeypatch.setattr(cont.Continuation, "_attempt", attempt)
    record = MigratedRequest(rid="r0", role="decode", stage=Stage.RUNNING, input_ids=[5, 6, 7], output_ids=[1, 2],
                             sampling_params={"max_new_tokens": 8})
    from sglang.srt.managers.io_struct import GenerateReqInput  # SGLang's request, as the continuation gets it

    obj = GenerateReqInput(sampling_params={"max_new_tokens": 10})
    c = cont.Continuation(obj, record, stitcher, {}, peers=peers, client=None, counters=Counter(), holder="holder")
    return c, pauses


async def collect(c: cont.Continuation) -> list[dict]:
    return [out async for out in c.run()]


def test_many_pairless_picks_do_not_spend_the_moves(monkeypatch):
    c, pauses = continuation(monkeypatch, Peers(pair_after=3 * cont.MAX_MOVES))
    outs = asyncio.run(collect(c))
    assert outs == [{"to": ("p", "d"), "max_new_tokens": 8}]  # 10 asked, 2 already produced
    assert c.moves == 1
    assert len(pauses) == 3 * cont.MAX_MOVES and max(pauses) == 2.0
    assert sum(pauses) < cont.NO_PAIR_WAIT_S


def test_no_pair_at_all_fails_explicitly_after_the_wait(monkeypatch):
    c, pauses = continuation(monkeypatch, Peers(pair_after=None))
    with pytest.raises(cont.ResumeFailed, match=r"no active prefill peer to continue on for 120 s"):
        asyncio.run(collect(c))
    assert sum(pauses) == pytest.approx(cont.NO_PAIR_WAIT_S)
    assert c.moves == 0


def test_a_trainer_abort_while_waiting_for_a_pair_answers_aborted_at_once(monkeypatch):
    """The trainer's abort-all can reach the prefill instance first (failing the transfer that made this
    continuation) and the holder while the continuation waits for a pair: it ends as aborted, not as a 503 after
    the whole wait."""
    c, pauses = continuation(monkeypatch, Peers(pair_after=None))
    seen = {"n": 0}

    def aborted() -> bool:  # the holder saw the abort-all after three pair-less picks
        seen["n"] += 1
        return seen["n"] > 3

    c.aborted = aborted
    ended: dict = {}
    c.stitcher.final_without_continuation = lambda finish: ended.setdefault("finish", finish)
    outs = asyncio.run(collect(c))
    assert outs == [ended["finish"]] and ended["finish"]["type"] == "abort"
    assert len(pauses) == 3 and c.moves == 0 and c.counters["continuations_aborted"] == 1


@pytest.mark.parametrize("serves_decode, expected", [(True, ("p", "holder")), (False, None)])
def test_the_only_decode_instance_continues_on_itself_when_it_serves_decode(monkeypatch, serves_decode, expected):
    """A request whose KV transfer its prefill instance failed, held by the only active decode instance (the
    two-host test's abort loop: one decode instance left after two switches): continued on itself at once while it
    serves decode, else it waits the whole NO_PAIR_WAIT_S for another decode peer and fails (a 503 resume_failed)."""
    from sglang_prorsa.srt.engine.peer_client import ResumeFailed
    from sglang_prorsa.srt.engine.peers import PeerView

    view = PeerView("holder")
    view.update([Peer("p", "http://p", "prefill", "active", "127.0.0.1", 1, 0),
                 Peer("holder", "http://holder", "decode", "active", "127.0.0.1", None, 0)])
    c, pauses = continuation(monkeypatch, view)
    c.decode_here = lambda: serves_decode
    if expected is None:
        with pytest.raises(ResumeFailed, match="no active decode peer"):
            asyncio.run(collect(c))
        assert sum(pauses) == pytest.approx(cont.NO_PAIR_WAIT_S)
    else:
        outs = asyncio.run(collect(c))
        assert [o["to"] for o in outs] == [expected] and pauses == []
