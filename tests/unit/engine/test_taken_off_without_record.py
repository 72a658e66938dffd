"""A request our scheduler took off is continued, never answered truncated (srt/engine/aborts.py, hooks.py,
continuation.py).

A CI run of the fast-switch test got one answer with status 200 and 27 of its 48 tokens: the only path that answers
a taken-off request with what it had is our own abort passed on as the final output. Two places guard it now: the
holder waits for a late record and else continues from the tokens it has; a continuation whose stream ends in our
own abort retries on another pair instead of finishing there."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace

import pytest

from sglang_prorsa.srt.common.messages import Code, MigratedRequest, Stage
from sglang_prorsa.srt.engine import aborts, hooks
from sglang_prorsa.srt.engine import continuation as cont
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.peers import Peer
from sglang_prorsa.srt.engine.stitch import Kept, Shape, Stitcher

OURS = {"type": "abort", "message": "prorsa: migrated", "err_type": Code.MIGRATED.value}


class Client:
    """The peer client (with its peer view and counters): pairs p0+d0, p1+d1, ...; decode stream k answers
    ``streams[k]`` (cumulative chunks of the continuation)."""

    def __init__(self, streams: list[list[dict]]) -> None:
        self.streams = list(streams)
        self.sent: list[dict] = []
        self.aborted: list[str] = []
        self.counters: collections.Counter[str] = collections.Counter()
        self.picks = 0
        self.peers = SimpleNamespace(pick_pair=self.pick_pair, acquire=lambda *p: None, release=lambda *p: None)

    def pick_pair(self, exclude=frozenset(), prefer_prefill=None, decode_here=False):
        k, self.picks = self.picks, self.picks + 1
        return (Peer(f"p{k}", f"http://p{k}", "prefill", "active", "127.0.0.1", 7000 + k, 0),
                Peer(f"d{k}", f"http://d{k}", "decode", "active", "127.0.0.1", None, 0))

    async def post_raw(self, url, raw, headers):
        return 200, b"{}"

    async def stream(self, url, raw, headers):
        import orjson

        self.sent.append(orjson.loads(raw))
        for chunk in self.streams.pop(0):
            yield chunk

    async def abort_on(self, peers, rid):
        self.aborted.append(rid)


def run(side: Client, max_new: int = 5) -> tuple[cont.Continuation, list[dict]]:
    record = MigratedRequest(rid="r0", role="decode", stage=Stage.RUNNING, input_ids=[5, 6, 7], output_ids=[1],
                             sampling_params={"max_new_tokens": max_new - 1})
    stitcher = Stitcher("r0", Kept(prompt_tokens=3, ids=[1]), Shape(stream=False, incremental=False),
                        decode=lambda ids: " ".join(map(str, ids)))
    from sglang.srt.managers.io_struct import GenerateReqInput  # SGLang's request, as the continuation gets it

    c = cont.Continuation(GenerateReqInput(sampling_params={"max_new_tokens": max_new}), record, stitcher, {},
                          peers=side.peers, client=side, counters=side.counters, holder="holder")

    async def collect():
        return [out async for out in c.run()]

    return c, asyncio.run(collect())


@pytest.fixture
def no_sleep(monkeypatch):
    async def sleep(s):
        pass

    monkeypatch.setattr(cont.asyncio, "sleep", sleep)


def test_a_continuation_ending_in_our_abort_is_retried_from_its_tokens(no_sleep):
    side = Client([
        [{"output_ids": [2, 3], "meta_info": {"finish_reason": OURS}}],  # taken off there, record lost
        [{"output_ids": [2, 3, 4, 5], "meta_info": {"finish_reason": {"type": "length", "length": 4}}}],
    ])
    c, outs = run(side)
    assert [o["output_ids"] for o in outs] == [[1, 2, 3, 4, 5]]  # the whole budget, not 3 tokens
    assert outs[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    first, second = c.stitcher.migrations
    assert "took the continuation off" in first["failed"] and "failed" not in second
    # the retry starts from what the caller has (the aborted chunk's tokens were never taken)
    assert side.sent[1]["input_ids"] == [5, 6, 7, 1] and side.sent[1]["sampling_params"]["max_new_tokens"] == 4
    assert side.counters["resume_attempts_failed"] == 1


def test_a_trainers_abort_still_ends_the_request(no_sleep):
    side = Client([[{"output_ids": [2], "meta_info": {"finish_reason": {"type": "abort", "message": "Aborted"}}}]])
    c, outs = run(side)
    assert len(outs) == 1 and outs[0]["output_ids"] == [1, 2]
    assert outs[0]["meta_info"]["finish_reason"]["type"] == "abort" and side.picks == 1


# -- the holder's side: a record that comes late, or never -------------------------------------------------------
class HolderSide:
    """The engine side holding the caller, as far as the abort path reaches: its ``AbortRecords`` over a book,
    counters and a tokenizer-manager view that knows the role and the prompt."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.user_aborts = 0
        self.book = RecordBook()
        self.counters: collections.Counter[str] = collections.Counter()
        self.tm_view = SimpleNamespace(role=lambda: role, prompt_ids=self.prompt_ids)
        self.aborts = aborts.AbortRecords(self.book, self.counters, self.tm_view, pairs=None,
                                          user_aborts=lambda: self.user_aborts)

    async def prompt_ids(self, obj):
        return [5, 6, 7]


def request():
    from sglang.srt.managers.io_struct import GenerateReqInput  # the wrapper resumes generation requests only

    obj = GenerateReqInput(rid="r1", bootstrap_room=11, bootstrap_host="127.0.0.1", bootstrap_port=8998)
    state = SimpleNamespace(output_ids=[1, 2, 3])
    out = {"output_ids": [1, 2, 3], "meta_info": {"finish_reason": OURS, "weight_versions": [
        {"version": "v1", "start": 0, "end": 3}]}}
    return obj, state, out


def test_a_late_record_is_waited_for():
    side = HolderSide("decode")
    late = MigratedRequest(rid="r1", role="decode", stage=Stage.RUNNING, input_ids=[5, 6, 7], output_ids=[1, 2],
                           sampling_params={"max_new_tokens": 6}, kv_tokens=4)

    async def go():
        asyncio.get_running_loop().call_later(0.1, side.book.put, late)
        return await side.aborts.late_record("r1")

    assert asyncio.run(go()) is late
    assert side.counters["records_late"] == 1 and len(side.book) == 0


def test_a_record_that_never_comes_is_given_up_after_the_wait(monkeypatch):
    monkeypatch.setattr(aborts, "RECORD_WAIT_S", 0.03)
    side = HolderSide("prefill")
    assert asyncio.run(side.aborts.late_record("r1")) is None and side.counters["records_late"] == 0


def test_a_missing_record_continues_from_the_tokens_held():
    side = HolderSide("decode")
    obj, state, out = request()
    record = asyncio.run(side.aborts.record_from_state(obj, state, out))
    assert record.stage is Stage.RUNNING and record.kv_tokens == 0  # recomputed, not loaded
    assert record.input_ids == [5, 6, 7] and record.output_ids == [1, 2, 3]
    assert record.weight_versions == [("v1", 0, 3)] and record.bootstrap_room == 11
    assert side.counters["records_missing_continued"] == 1
    nothing_yet = asyncio.run(side.aborts.record_from_state(obj, SimpleNamespace(output_ids=[]),
                                                            {"output_ids": [], "meta_info": {}}))
    assert nothing_yet.stage is Stage.QUEUED and nothing_yet.output_ids == []  # a continuation: handed back


# -- the wiring: SGLang's response generator, wrapped --------------------------------------------------------------
class Lock:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._readers = 1

    async def release_reader(self) -> None:
        self._readers -= 1


class WrappedSide(HolderSide):
    """The engine side SGLang's wrapped response generator reaches: its resumer continues a record at once."""

    def __init__(self, role: str) -> None:
        super().__init__(role)
        self.events = SimpleNamespace(enabled=False)
        self.resumed: list[MigratedRequest] = []
        self.resumer = SimpleNamespace(resume=self.resume)

    async def resume(self, obj, state, record, last_out, delivered, headers, aborts_at_entry=None):
        self.resumed.append(record)
        yield {"output_ids": record.output_ids + [4, 5], "meta_info": {"finish_reason": {"type": "length"}}}


def answers(monkeypatch, side: WrappedSide, record_after_s: float | None) -> list[dict]:
    """What the caller of one non-streamed request gets when the scheduler aborted it with our code."""
    monkeypatch.setattr(hooks, "ENGINE", side)
    obj, state, out = request()
    obj.stream = False
    state.finished = True
    late = MigratedRequest(rid="r1", role=side.role, stage=Stage.RUNNING, input_ids=[5, 6, 7], output_ids=[1, 2, 3],
                           sampling_params={"max_new_tokens": 2}, kv_tokens=5)

    async def original(tm, obj, state, request=None):
        yield out

    tm = SimpleNamespace(incremental_streaming_output=False, model_update_lock=Lock())

    async def go():
        if record_after_s is not None:
            asyncio.get_running_loop().call_later(record_after_s, side.book.put, late)
        return [o async for o in hooks.wrap_stream_one_response(original)(tm, obj, state, None)]

    return asyncio.run(go())


def test_the_caller_gets_the_continuation_when_the_record_is_late(monkeypatch):
    side = WrappedSide("decode")
    outs = answers(monkeypatch, side, record_after_s=0.1)
    assert [o["output_ids"] for o in outs] == [[1, 2, 3, 4, 5]]  # not the abort's 3 tokens
    assert side.resumed[0].kv_tokens == 5  # the record's persisted KV, not a recompute
    assert side.counters["records_late"] == 1


def test_the_caller_gets_the_continuation_when_the_record_never_comes(monkeypatch):
    monkeypatch.setattr(aborts, "RECORD_WAIT_S", 0.05)
    side = WrappedSide("decode")
    outs = answers(monkeypatch, side, record_after_s=None)
    assert [o["output_ids"] for o in outs] == [[1, 2, 3, 4, 5]]
    assert side.resumed[0].kv_tokens == 0 and side.counters["records_missing_continued"] == 1


def test_a_prefill_half_without_record_is_answered(monkeypatch):
    monkeypatch.setattr(aborts, "RECORD_WAIT_S", 0.05)
    side = WrappedSide("prefill")
    outs = answers(monkeypatch, side, record_after_s=None)
    assert len(outs) == 1 and outs[0]["meta_info"]["finish_reason"]["err_type"] == Code.MIGRATED.value
    assert side.resumed == []
