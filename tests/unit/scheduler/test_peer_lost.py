"""A lost prefill peer, as a decode scheduler handles it (srt/scheduler/extension.py).

- A dead one: its waiting halves are taken off counting its death, and halves bound to it that arrive later are
  released too -- until it is back under a new epoch (``ForgetPrefill``). Before, that lasted 60 s whatever
  happened: a prefill restarted at the same address within them had every continuation sent to it released on
  arrival, and a request was answered 503 after 16 moves (a CI failure).
- One that only stopped answering (slow, not dead): its waiting halves are taken off without counting a death (two
  such would have answered an innocent request ``suspected_poison``), and nothing arriving later is released."""

from __future__ import annotations

import time

from sglang_prorsa.srt.common.messages import ForgetPrefill, PeerLost, ReleaseResult
from sglang_prorsa.srt.scheduler.extension import SchedulerSide

ADDR = ("127.0.0.1", 14770)


class Side(SchedulerSide):
    """The scheduler side without a scheduler: what it releases and forgets is recorded."""

    def __init__(self) -> None:  # noqa: D107 -- no SGLang scheduler here
        self.lost: dict[tuple[str, int], float] = {}
        self.released: dict[int, float] = {}
        self.calls: list[tuple] = []

    def _forget_endpoints(self, addresses):
        self.calls.append(("forget", set(addresses)))
        return len(addresses)

    def _release_bound_to(self, addresses, deaths=0):
        self.calls.append(("release", set(addresses), deaths))
        return ReleaseResult(rids=[], rooms=[])


def test_a_dead_prefill_counts_a_death_and_holds_its_address_until_it_is_back():
    side = Side()
    side.peer_lost(PeerLost(host=ADDR[0], port=ADDR[1]))
    assert side.calls == [("forget", {ADDR}), ("release", {ADDR}, 1)]
    assert ADDR in side.lost and side.lost[ADDR] > time.monotonic() + 50
    side.calls.clear()
    side._release_late_arrivals()  # a half bound to it arriving now is released (no death counted)
    assert side.calls == [("release", {ADDR}, 0)]
    assert side.forget_prefill(ForgetPrefill(addresses=frozenset({ADDR}))) == 1  # back under a new epoch
    assert side.lost == {}
    side.calls.clear()
    side._release_late_arrivals()
    assert side.calls == []  # what is sent to it now is served


def test_a_prefill_that_stopped_answering_counts_no_death_and_holds_nothing_back():
    side = Side()
    side.peer_lost(PeerLost(host=ADDR[0], port=ADDR[1], dead=False))
    assert side.calls == [("forget", {ADDR}), ("release", {ADDR}, 0)]
    assert side.lost == {}


def test_forgetting_another_address_keeps_the_lost_one():
    side = Side()
    side.peer_lost(PeerLost(host=ADDR[0], port=ADDR[1]))
    side.forget_prefill(ForgetPrefill(addresses=frozenset({("127.0.0.1", 10770)})))
    assert ADDR in side.lost
