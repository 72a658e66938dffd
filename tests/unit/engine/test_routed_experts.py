"""Routed experts of a moved request (srt/engine/routed_experts.py, stitch.py, continuation.py): the continuation asks
for them as the original did, and the caller gets one array, each position from the part that computed it, equal to
what an unmoved run reports. Parts are hand-built in SGLang's format: base64 of int32 [positions, layers, top_k],
rows from ``routed_experts_start_len`` to prompt + outputs - 1, in the final output only."""

from __future__ import annotations

import asyncio
import base64
import collections
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_prorsa.srt.common.messages import MigratedRequest, Stage
from sglang_prorsa.srt.engine import continuation as cont
from sglang_prorsa.srt.engine.peers import Peer
from sglang_prorsa.srt.engine.routed_experts import decoded, stitched
from sglang_prorsa.srt.engine.stitch import Kept, Shape, Stitcher

LAYERS, TOPK = 2, 2
ROW = 4 * LAYERS * TOPK  # bytes of one position
PROMPT = 4


def truth(positions: range) -> np.ndarray:
    """The experts an unmoved run computes at each position: distinct values per position, layer and slot."""
    return np.array([[[100 * p + 10 * layer + k for k in range(TOPK)] for layer in range(LAYERS)] for p in positions],
                    dtype=np.int32).reshape(len(positions), LAYERS, TOPK)


def b64(rows: np.ndarray) -> str:
    return base64.b64encode(rows.astype(np.int32).tobytes()).decode()


def rows_of(value: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(value), dtype=np.int32).reshape(-1, LAYERS, TOPK)


def uncaptured(n: int) -> np.ndarray:
    """Rows an instance reports for positions it did not compute (KV received or loaded): its host buffer's content."""
    return np.full((n, LAYERS, TOPK), -7, dtype=np.int32)


# The request: a 4-token prompt; 3 tokens kept when it moved; the continuation adds 2 (5 in all). An unmoved run
# reports positions [0, 4 + 5 - 1) = [0, 8). Taken off with ``to_finish``, the first part ran one more forward pass
# (the last kept token's, position 6): its abort output has rows [0, 7). The continuation (prompt 7 tokens, 2 new)
# reports rows [0, 8), of which its decode instance computed position 7 only.
FIRST = b64(truth(range(0, 7)))
CONT = b64(np.concatenate([uncaptured(7), truth(range(7, 8))]))


def test_each_position_comes_from_the_part_that_computed_it():
    out = stitched(decoded(FIRST), CONT, row_bytes=ROW, start=0, kept_end=PROMPT + 3, end=PROMPT + 5 - 1)
    assert rows_of(out).tolist() == truth(range(0, 8)).tolist()


def test_rows_past_the_kept_tokens_are_the_continuations():
    """A first part that computed past what the record kept (2 tokens kept here): those tokens are generated again,
    so their positions are the continuation's."""
    cont_rows = np.concatenate([uncaptured(6), truth(range(6, 8))])
    out = stitched(decoded(FIRST), b64(cont_rows), row_bytes=ROW, start=0, kept_end=PROMPT + 2, end=PROMPT + 5 - 1)
    assert rows_of(out).tolist() == truth(range(0, 8)).tolist()


def test_a_start_offset_shifts_both_parts_alike():
    first = b64(truth(range(3, 7)))
    cont_rows = np.concatenate([uncaptured(4), truth(range(7, 8))])  # rows from position 3 too (start carried)
    out = stitched(decoded(first), b64(cont_rows), row_bytes=ROW, start=3, kept_end=PROMPT + 3, end=PROMPT + 5 - 1)
    assert rows_of(out).tolist() == truth(range(3, 8)).tolist()


def test_without_a_first_part_or_a_row_size_the_continuation_is_passed_on():
    assert stitched(None, CONT, row_bytes=ROW, start=0, kept_end=7, end=8) == CONT
    assert stitched(decoded(FIRST), CONT, row_bytes=0, start=0, kept_end=7, end=8) == CONT
    assert stitched(decoded(FIRST), None, row_bytes=0, start=0, kept_end=7, end=8) == FIRST
    assert stitched(None, None, row_bytes=ROW, start=0, kept_end=7, end=8) is None
    assert decoded("not base64!") is None and decoded(None) is None and decoded(5) is None


def stitcher(stream: bool = False) -> Stitcher:
    kept = Kept(prompt_tokens=PROMPT, ids=[11, 12, 13], routed_experts=decoded(FIRST), routed_row_bytes=ROW)
    return Stitcher("r", kept, Shape(stream=stream, incremental=False), lambda ids: "".join(chr(97 + i % 26)
                                                                                           for i in ids))


def test_the_stitched_final_output_reports_what_an_unmoved_run_reports():
    st = stitcher()
    out = st.update({"output_ids": [14, 15], "meta_info": {"finish_reason": {"type": "length", "length": 2},
                                                            "routed_experts": CONT}})
    assert out["output_ids"] == [11, 12, 13, 14, 15]
    assert rows_of(out["meta_info"]["routed_experts"]).tolist() == truth(range(0, 8)).tolist()


def test_streamed_chunks_carry_them_in_the_final_output_only():
    st = stitcher(stream=True)
    first = st.update({"output_ids": [14], "meta_info": {"finish_reason": None}})
    assert "routed_experts" not in first["meta_info"]
    last = st.update({"output_ids": [14, 15], "meta_info": {"finish_reason": {"type": "length"},
                                                            "routed_experts": CONT}})
    assert rows_of(last["meta_info"]["routed_experts"]).tolist() == truth(range(0, 8)).tolist()


def test_a_budget_spent_at_the_move_reports_the_first_parts_rows():
    """Nothing left to generate: an unmoved run of 3 tokens reports positions [0, 6)."""
    out = stitcher().final_without_continuation({"type": "length", "length": 3})
    assert rows_of(out["meta_info"]["routed_experts"]).tolist() == truth(range(0, 6)).tolist()


def test_a_failed_attempt_keeps_the_first_parts_rows():
    st = stitcher(stream=True)
    st.update({"output_ids": [14], "meta_info": {"finish_reason": None}})
    st.rebase()  # that attempt failed after one token: the next continues from 4 kept tokens
    assert st.kept.routed_experts == decoded(FIRST) and st.kept.routed_row_bytes == ROW
    cont_rows = np.concatenate([uncaptured(8), truth(range(8, 9))])  # prompt 8, 2 new: position 8 computed there
    last = st.update({"output_ids": [15, 16], "meta_info": {"finish_reason": {"type": "length"},
                                                            "routed_experts": b64(cont_rows)}})
    # Position 7 (the failed attempt's token) was computed by neither reporting part: the continuation's row.
    want = np.concatenate([truth(range(0, 7)), uncaptured(1), truth(range(8, 9))])
    assert rows_of(last["meta_info"]["routed_experts"]).tolist() == want.tolist()


def test_kept_from_takes_the_taken_off_requests_rows_and_start():
    obj = GenerateReqInput(input_ids=[1, 2, 3, 4], return_routed_experts=True, routed_experts_start_len=2)
    state = SimpleNamespace(obj=obj, output_token_logprobs=(), output_top_logprobs=(), output_token_ids_logprobs=())
    record = MigratedRequest(rid="r", role="decode", stage=Stage.RUNNING, input_ids=[1, 2, 3, 4],
                             output_ids=[11, 12, 13], sampling_params={})
    last = {"meta_info": {"finish_reason": {"type": "abort"}, "routed_experts": FIRST}}
    kept = cont.kept_from(record, state, last, (3, 3), routed_row_bytes=ROW)
    assert (kept.routed_experts, kept.routed_row_bytes, kept.routed_start) == (decoded(FIRST), ROW, 2)
    assert cont.kept_from(record, state, None, (0, 0)).routed_experts is None


class Client:
    """A pair that continues the request: its decode half streams the final output with its routed experts."""

    def __init__(self, routed: str) -> None:
        self.routed = routed
        self.counters: collections.Counter[str] = collections.Counter()
        self.bodies: list[dict] = []
        self.peers = SimpleNamespace(pick_pair=self.pick_pair, acquire=lambda *p: None, release=lambda *p: None)

    def pick_pair(self, exclude=frozenset(), prefer_prefill=None, decode_here=False):
        return (Peer("p1", "http://p1", "prefill", "active", "127.0.0.1", 7001, 0),
                Peer("d1", "http://d1", "decode", "active", "127.0.0.1", None, 0))

    async def post_raw(self, url, raw, headers):
        return 200, b"{}"

    async def stream(self, url, raw, headers):
        self.bodies.append(orjson.loads(raw))
        yield {"output_ids": [14, 15], "meta_info": {"finish_reason": {"type": "length"},
                                                     "routed_experts": self.routed}}

    async def abort_on(self, peers, rid):
        pass


@pytest.mark.parametrize("start", [0, 3])
def test_a_continuation_asks_for_them_as_the_original_did_and_the_caller_gets_one_array(start):
    obj = GenerateReqInput(input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 5}, return_routed_experts=True,
                           routed_experts_start_len=start, routing_key="rk", session_id="s")
    record = MigratedRequest(rid="r", role="decode", stage=Stage.RUNNING, input_ids=[1, 2, 3, 4],
                             output_ids=[11, 12, 13], sampling_params={})
    first = FIRST if start == 0 else b64(truth(range(start, 7)))
    cont_rows = CONT if start == 0 else b64(np.concatenate([uncaptured(7 - start), truth(range(7, 8))]))
    kept = Kept(prompt_tokens=PROMPT, ids=[11, 12, 13], routed_experts=decoded(first), routed_row_bytes=ROW,
                routed_start=start)
    client = Client(cont_rows)
    c = cont.Continuation(obj, record, Stitcher("r", kept, Shape(False, False), lambda ids: ""), {},
                          peers=client.peers, client=client, counters=client.counters, holder="h")

    async def collect():
        return [out async for out in c.run()]

    (out,) = asyncio.run(collect())
    (body,) = client.bodies
    assert (body["return_routed_experts"], body["routed_experts_start_len"], body["routing_key"]) == (True, start, "rk")
    assert "session_id" not in body and body["input_ids"] == [1, 2, 3, 4, 11, 12, 13]
    assert rows_of(out["meta_info"]["routed_experts"]).tolist() == truth(range(start, 8)).tolist()
