"""A switch does not wait on an orphaned decode half: the watchdog's check runs while it sweeps (issue 14)."""

import asyncio
import time
from collections import Counter
from types import SimpleNamespace

from sglang_prorsa.srt.common.messages import (
    Inventory,
    InventoryResult,
    MigrateOut,
    MigrateOutResult,
    QueuedItem,
    ReleaseRooms,
    Status,
)
from sglang_prorsa.srt.engine import switch, watchdog
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.local import Admission, LocalScheduler
from sglang_prorsa.srt.engine.peer_client import PairHalves, PeerClient
from sglang_prorsa.srt.engine.peers import Peer, PeerView


class _Side:
    """A decode instance with one half queued for ``waited_s``, whose prefill peer holds ``held`` rooms: the
    collaborators an ``OrphanWatch`` and a ``SwitchJob`` get, over a fake scheduler channel and a fake HTTP client."""

    def __init__(self, waited_s: float, held: list[int], stuck: list[int] = (), stage: str = "transfer",
                 prefill_takes: bool = False):
        self.counters: Counter = Counter()
        self.queued = [QueuedItem("r1", 77, "127.0.0.1", 9001, (1, 2, 3), waited_s, stage)]
        self.held, self.stuck, self.prefill_takes = held, list(stuck), prefill_takes
        self.released_here: list[list[int]] = []
        self.released_there: list[list[int]] = []
        self.book = RecordBook()
        peers = PeerView("d")
        peers.update([Peer("p", "http://p", "prefill", "active", "127.0.0.1", 9001)])
        self.pairs = PairHalves(peers, _Client(self))
        self.scheduler = LocalScheduler(SimpleNamespace(call=self._call), self.book, self.counters, lambda: "decode")
        self.admission = Admission()
        self.orphans = watchdog.OrphanWatch(self.scheduler, self.pairs, self.counters)

    def booked(self) -> list[str]:
        return [r.rid for r in self.book.recent]

    async def _call(self, msg, timeout_s=None):
        if isinstance(msg, Inventory):
            return InventoryResult(role="decode", with_kv=[], queued=list(self.queued))
        if isinstance(msg, Status):
            return SimpleNamespace(idle=not self.queued)
        if isinstance(msg, ReleaseRooms):
            self.released_here.append(sorted(msg.rooms))
            self.queued = [q for q in self.queued if q.bootstrap_room not in msg.rooms]
            return SimpleNamespace(rids=["r1"], rooms=sorted(msg.rooms))
        assert isinstance(msg, MigrateOut)
        return MigrateOutResult(role="decode", rids=[], rooms=[], persisted_bytes=0, persist_s=0.0)

    def job(self, timeout_s: float) -> switch.SwitchJob:
        return switch.SwitchJob("prefill", timeout_s, True, old_role="decode", scheduler=self.scheduler,
                                pairs=self.pairs, admission=self.admission, orphans=self.orphans)


class _Client(PeerClient):
    """The prefill peer ``p`` as our HTTP client sees it."""

    def __init__(self, side: _Side) -> None:
        super().__init__()
        self.side = side

    async def post_json(self, url, body, timeout_s=None, generation=False):
        side = self.side
        if url == "http://p/prorsa/release":
            assert body["only_not_started"]  # a prefill that began is never thrown away
            side.released_there.append(body["rooms"])
            return 200, {"rooms": body["rooms"] if side.prefill_takes else []}  # else: begun meanwhile, not taken
        assert url == "http://p/prorsa/held_rooms"
        return 200, {"held": [r for r in body["rooms"] if r in side.held],
                     "stuck": [r for r in body["rooms"] if r in side.stuck]}


def test_an_unheld_half_is_taken_on_the_second_check_in_a_row():
    side = _Side(waited_s=5.0, held=[])
    assert asyncio.run(side.orphans.check_once(stale_s=3.0)) == []  # a suspect: may be a transfer just done
    assert asyncio.run(side.orphans.check_once(stale_s=3.0)) == [77]
    assert side.booked() == ["r1"] and side.released_here == [[77]] and side.counters["orphans_continued"] == 1


def test_held_or_recent_halves_are_left_alone():
    held = _Side(waited_s=5.0, held=[77])
    for _ in range(3):
        assert asyncio.run(held.orphans.check_once(stale_s=3.0)) == []
    recent = _Side(waited_s=5.0, held=[])
    for _ in range(3):  # the serving watchdog's own bound (20 s) is not reached
        assert asyncio.run(recent.orphans.check_once()) == []
    assert held.released_here == recent.released_here == []


def test_a_switch_takes_an_orphan_off_and_quiesces(monkeypatch):
    monkeypatch.setattr(switch, "ORPHAN_CHECK_EVERY_S", 0.05)
    side = _Side(waited_s=5.0, held=[])
    job = side.job(timeout_s=20.0)
    asyncio.run(asyncio.wait_for(job._sweep_until_quiet(time.perf_counter()), timeout=10))
    assert job.orphans == [77] and side.queued == []
    assert job.report()["orphans_taken"] == 1


def test_a_switch_waits_for_a_half_its_prefill_still_holds(monkeypatch):
    monkeypatch.setattr(switch, "ORPHAN_CHECK_EVERY_S", 0.05)
    side = _Side(waited_s=5.0, held=[77])
    job = side.job(timeout_s=1.0)
    try:
        asyncio.run(job._sweep_until_quiet(time.perf_counter()))
        raise AssertionError("quiesced with a held half still queued")
    except switch.SwitchFailed as e:
        assert e.status == 503
    assert job.orphans == [] and side.released_here == []


def test_a_pair_waiting_on_itself_is_released_on_both_sides_on_the_second_check():
    # The prefill instance holds the room but reports its half stuck in the bootstrap queue; ours sent its indices.
    side = _Side(waited_s=25.0, held=[77], stuck=[77], prefill_takes=True)
    assert asyncio.run(side.orphans.check_once()) == []  # first sight: a suspect only
    assert side.released_there == [] and side.released_here == []
    assert asyncio.run(side.orphans.check_once()) == [77]
    assert side.booked() == ["r1"]  # booked before either half moves: its abort is continued, not answered
    assert side.released_there == [[77]] and side.released_here == [[77]]
    assert side.counters["stuck_pairs_continued"] == 1 and side.counters["orphans_continued"] == 0


def test_a_stuck_report_is_not_acted_on_when_ours_has_not_sent_its_indices_or_the_prefill_began():
    # Still in our prealloc queue (handshake or KV allocation not done here): the wait may be ours.
    prealloc = _Side(waited_s=25.0, held=[77], stuck=[77], stage="prealloc", prefill_takes=True)
    for _ in range(3):
        assert asyncio.run(prealloc.orphans.check_once()) == []
    assert prealloc.released_there == prealloc.released_here == []
    # The prefill half began between the checks: it is not taken there, so ours stays and receives its KV.
    began = _Side(waited_s=25.0, held=[77], stuck=[77])
    for _ in range(3):
        assert asyncio.run(began.orphans.check_once()) == []
    assert began.released_there and began.released_here == []


def _inv(with_kv=(), *queued):
    return InventoryResult(role="prefill", with_kv=list(with_kv), queued=list(queued))


def _q(room, stage, waited_s):
    return QueuedItem(f"r{room}", room, "127.0.0.1", 9002, (1,), waited_s, stage)


def test_the_prefill_side_reports_stuck_only_when_it_has_nothing_else_to_do():
    stale, fresh = watchdog.STALE_S + 1, watchdog.STALE_S - 1
    assert watchdog.stuck_rooms(_inv((), _q(1, "bootstrapping", stale), _q(2, "bootstrapping", fresh)), {1, 2}) == [1]
    assert watchdog.stuck_rooms(_inv((), _q(1, "bootstrapping", stale)), {2}) == []  # not asked about
    # Anything else on the scheduler may be what holds it (a backlog, transfer slots in use): nothing reported.
    assert watchdog.stuck_rooms(_inv(("busy",), _q(1, "bootstrapping", stale)), {1}) == []
    assert watchdog.stuck_rooms(_inv((), _q(1, "bootstrapping", stale), _q(3, "waiting", 0.0)), {1}) == []
    assert watchdog.stuck_rooms(InventoryResult(role="decode", with_kv=[], queued=[_q(1, "transfer", stale)]),
                                {1}) == []
