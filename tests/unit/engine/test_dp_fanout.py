"""An instance with data parallelism (srt/engine/local.py, dp.py): the engine side fans every control message out to
each DP rank's scheduler and merges the answers; a rank that fails is reported, not hidden; a prefix load goes to one
rank and its continuation's prefill half is pinned there (SGLang's routed_dp_rank, continuation.halves). A layout
refusal shows in the move's metadata and the prefix is recomputed."""

from __future__ import annotations

import asyncio
import collections
import time

import orjson
import pytest
from unit_support import one_chunk_stitcher

from sglang_prorsa.srt.common.channel import ChannelAddresses, EngineChannels, SchedulerChannel
from sglang_prorsa.srt.common.messages import (
    LAYOUT_REFUSED,
    BusyInterval,
    ForgetPrefill,
    Inventory,
    InventoryResult,
    LoadPrefix,
    LoadPrefixResult,
    MigratedRequest,
    MigrateOut,
    MigrateOutResult,
    PeerLost,
    QueuedItem,
    ReleaseResult,
    ReleaseRooms,
    Stage,
    Status,
    StatusResult,
)
from sglang_prorsa.srt.engine import continuation as cont
from sglang_prorsa.srt.engine import dp
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.local import LocalScheduler
from sglang_prorsa.srt.engine.peers import Peer


def interval(seq: int, seconds: float) -> BusyInterval:
    return BusyInterval(seq=seq, role="decode", seconds=seconds, new_tokens=10 * seq, cached_tokens=0, requests=1)


class Rank:
    """One DP rank's scheduler as the channel shows it: answers by message type, records what it was sent."""

    def __init__(self, rank: int, fail: BaseException | None = None) -> None:
        self.rank, self.fail, self.sent = rank, fail, []
        self.intervals = [interval(s, 1.0 + rank) for s in range(2 + rank)]

    async def call(self, message, timeout_s=120.0):
        self.sent.append(message)
        if self.fail is not None:
            raise self.fail
        r = self.rank
        if isinstance(message, Status):
            return StatusResult(role="decode", idle=r == 0, running=2 + r, queued=r, counters={"kv_layout_refused": r,
                                "requests_migrated_out": 3.0}, kv_footprint_tokens=100 * (r + 1),
                                kv_capacity_tokens=1000, prefix_cache_tokens=7,
                                busy_intervals=[i for i in self.intervals if i.seq > message.since])
        if isinstance(message, Inventory):
            return InventoryResult(role="decode", with_kv=[f"kv{r}"],
                                   queued=[QueuedItem(rid=f"q{r}", bootstrap_room=r, bootstrap_host="h",
                                                      bootstrap_port=1)])
        if isinstance(message, MigrateOut):
            return MigrateOutResult(role="decode", rids=[f"a{r}", f"b{r}"], rooms=[10 + r], persist_s=0.5 + r,
                                    persisted_bytes=1000 * (r + 1), persisted_blocks=2 + r, left_running=r)
        if isinstance(message, (ReleaseRooms, PeerLost)):
            return ReleaseResult(rids=[f"x{r}"], rooms=[20 + r])
        if isinstance(message, ForgetPrefill):
            return 1 + r
        if isinstance(message, LoadPrefix):
            return LoadPrefixResult(loaded_tokens=64, already_cached_tokens=0, missing_blocks=0, checksum_failures=0,
                                    load_s=0.01, held=True)
        raise TypeError(message)


def scheduler(*ranks: Rank) -> LocalScheduler:
    return LocalScheduler(list(ranks), RecordBook(drain=lambda: []), collections.Counter(), lambda: "decode")


def test_status_merges_counts_counters_and_renumbers_busy_intervals():
    r0, r1 = Rank(0), Rank(1)
    local = scheduler(r0, r1)
    st = asyncio.run(local.status())
    assert (st.role, st.idle, st.running, st.queued) == ("decode", False, 5, 1)
    assert st.counters == {"kv_layout_refused": 1.0, "requests_migrated_out": 6.0}
    assert (st.kv_footprint_tokens, st.kv_capacity_tokens, st.prefix_cache_tokens) == (300, 2000, 14)
    assert [(i.seq, i.seconds, i.new_tokens) for i in st.busy_intervals] == [
        (0, 1.0, 0), (1, 1.0, 10), (2, 2.0, 0), (3, 2.0, 10), (4, 2.0, 20)]
    r0.intervals.append(interval(2, 1.0))  # rank 0's next interval
    st = asyncio.run(local.status(since=4))
    assert [(i.seq, i.new_tokens) for i in st.busy_intervals] == [(5, 20)]
    assert [m.since for m in r0.sent] == [-1, 1] and [m.since for m in r1.sent] == [-1, 2]  # each rank's own cursor


def test_sweeps_inventories_and_releases_are_merged_from_every_rank():
    r0, r1 = Rank(0), Rank(1)
    local = scheduler(r0, r1)
    out = asyncio.run(local.migrate_out(frozenset({"q1"}), "role switch"))
    assert (out.rids, out.rooms, out.persist_s, out.persisted_bytes, out.persisted_blocks, out.left_running) == (
        ["a0", "b0", "a1", "b1"], [10, 11], 1.5, 3000, 5, 1)
    assert r0.sent[-1] == r1.sent[-1] == MigrateOut(queued_rids=frozenset({"q1"}), reason="role switch")
    inv = asyncio.run(local.inventory())
    assert (inv.with_kv, [q.rid for q in inv.queued]) == (["kv0", "kv1"], ["q0", "q1"])
    assert asyncio.run(local.release([20, 21])) == (["x0", "x1"], [20, 21])
    assert local.counters["rooms_released"] == 2
    assert asyncio.run(local.expect([1])) == ["q1"]
    assert [r.rid for r in local.book.recent] == ["q1"]  # a record booked for the queued half it named
    lost = asyncio.run(local.peer_lost("h", 1, dead=True))
    assert (lost.rids, lost.rooms) == (["x0", "x1"], [20, 21])
    peer = Peer("p", "http://p", "prefill", "active", "h", 7000, 0)
    assert asyncio.run(local.forget_prefills([peer])) == 3
    assert r0.sent[-1] == r1.sent[-1] == ForgetPrefill(addresses=frozenset({("h", 7000)}))


def test_a_failing_rank_is_reported_with_what_the_others_answered():
    local = scheduler(Rank(0), Rank(1, fail=RuntimeError("scheduler gone")))
    with pytest.raises(dp.DPRankFailed) as exc:
        asyncio.run(local.migrate_out(frozenset(), "role switch"))
    assert "MigrateOut failed on 1 of 2 DP ranks: dp rank 1: RuntimeError: scheduler gone" in str(exc.value)
    assert list(exc.value.failures) == [1] and exc.value.answered[0].rids == ["a0", "b0"]
    local = scheduler(Rank(0, fail=TimeoutError("no answer")), Rank(1))
    with pytest.raises(TimeoutError, match="dp rank 0: TimeoutError: no answer") as exc:
        asyncio.run(local.status())
    assert isinstance(exc.value, dp.DPRankTimeout) and list(exc.value.answered) == [1]


def test_a_prefix_load_goes_to_one_rank_which_the_result_names():
    r0, r1 = Rank(0), Rank(1)
    local = scheduler(r0, r1)
    first = asyncio.run(local.load_prefix([1, 2, 3], ["k"], 16, "rid-a", layout="L|TP2"))
    second = asyncio.run(local.load_prefix([1, 2, 3], ["k"], 16, "rid-b", layout="L|TP2"))
    assert (first.dp_rank, first.dp_size, second.dp_rank, second.dp_size) == (0, 2, 1, 2)
    assert [m.hold_for_rid for m in r0.sent] == ["rid-a"] and [m.hold_for_rid for m in r1.sent] == ["rid-b"]
    assert r0.sent[0].layout == "L|TP2"


def test_one_rank_is_the_existing_path():
    r0 = Rank(0)
    local = scheduler(r0)
    result = asyncio.run(local.load_prefix([1], ["k"], 16, "rid"))
    assert (result.dp_rank, result.dp_size) == (None, 1)
    st = asyncio.run(local.status(since=0))
    assert [i.seq for i in st.busy_intervals] == [1]  # the scheduler's own numbering, untouched


def test_the_prefill_half_is_pinned_to_the_rank_that_loaded_its_prefix():
    body = {"input_ids": [1, 2], "rid": "c"}
    prefill, decode = cont.halves(body, 1)
    assert orjson.loads(prefill) == {**body, "routed_dp_rank": 1, "disagg_prefill_dp_rank": 1}
    assert orjson.loads(decode) == {**body, "disagg_prefill_dp_rank": 1}
    same, also = cont.halves(body, None)
    assert same is also and orjson.loads(same) == body


class Client:
    """A continuation's peer client: one pair; the prefix load answers ``answer``; the decode stream finishes."""

    def __init__(self, answer: dict) -> None:
        self.answer = answer
        self.counters: collections.Counter[str] = collections.Counter()
        self.bodies: dict[str, dict] = {}
        self.load_records: list[MigratedRequest] = []

        def pick_pair(exclude=frozenset(), prefer_prefill=None, decode_here=False):
            return (Peer("p0", "http://p0", "prefill", "active", "127.0.0.1", 7000, 0),
                    Peer("d0", "http://d0", "decode", "active", "127.0.0.1", None, 0))

        from types import SimpleNamespace
        self.peers = SimpleNamespace(pick_pair=pick_pair, acquire=lambda *p: None, release=lambda *p: None)

    async def load_prefix(self, prefill, tokens, record, rid):
        self.load_records.append(record)
        return dict(self.answer)

    async def post_raw(self, url, raw, headers):
        self.bodies["prefill"] = orjson.loads(raw)
        return 200, b"{}"

    async def stream(self, url, raw, headers):
        self.bodies["decode"] = orjson.loads(raw)
        yield {"output_ids": [9], "meta_info": {"cached_tokens": 4, "finish_reason": {"type": "length"}}}

    async def abort_on(self, peers, rid):
        pass


def run(client: Client) -> dict:

    from sglang.srt.managers.io_struct import GenerateReqInput

    stitcher = one_chunk_stitcher()
    record = MigratedRequest(rid="r0", role="decode", stage=Stage.RUNNING, input_ids=[5, 6, 7], output_ids=[1],
                             sampling_params={"max_new_tokens": 3}, kv_tokens=4, layout="m|float32|TP2")
    c = cont.Continuation(GenerateReqInput(sampling_params={"max_new_tokens": 4}), record, stitcher, {},
                          peers=client.peers, client=client, counters=client.counters, holder="holder")

    async def collect():
        return [out async for out in c.run()]

    assert len(asyncio.run(collect())) == 1
    assert client.load_records[0].layout == "m|float32|TP2"  # the source's layout goes with the load
    return stitcher.migrations[0]


def test_a_continuation_routes_its_prefill_half_to_the_loading_rank():
    client = Client({"load_status": 200, "loaded_tokens": 4, "refused": "", "dp_rank": 1, "dp_size": 2})
    move = run(client)
    assert (move["dp_rank"], "layout_refused" in move) == (1, False)
    assert (client.bodies["prefill"]["routed_dp_rank"], client.bodies["prefill"]["disagg_prefill_dp_rank"]) == (1, 1)
    assert "routed_dp_rank" not in client.bodies["decode"] and client.bodies["decode"]["disagg_prefill_dp_rank"] == 1


def test_a_layout_refusal_is_in_the_move_and_the_prefix_is_recomputed():
    client = Client({"load_status": 200, "loaded_tokens": 0, "refused": LAYOUT_REFUSED, "dp_rank": None,
                     "dp_size": 1})
    move = run(client)
    assert move["layout_refused"] is True and move["refused"] == LAYOUT_REFUSED
    assert client.counters["prefix_loads_layout_refused"] == 1 and client.counters["prefix_loads_failed"] == 0
    assert client.bodies["prefill"]["input_ids"] == [5, 6, 7, 1]  # sent whole: the prefill computes the prefix
    assert "routed_dp_rank" not in client.bodies["prefill"]


def test_records_from_every_dp_rank_reach_the_engine_side():
    addresses = ChannelAddresses.fresh()
    schedulers = [SchedulerChannel(addresses.for_dp_rank(r, 2), lambda m: None) for r in range(2)]
    channels = EngineChannels.connect(addresses, dp_size=2)
    assert [c.addresses.control for c in channels.ranks] == [addresses.control + "-dp0", addresses.control + "-dp1"]
    for r, s in enumerate(schedulers):
        s.push(MigratedRequest(rid=f"r{r}", role="decode", stage=Stage.QUEUED, input_ids=[r], output_ids=[],
                               sampling_params={}))
    got: list[str] = []
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        got += [r.rid for r in channels.drain()]
        time.sleep(0.01)
    assert sorted(got) == ["r0", "r1"]
