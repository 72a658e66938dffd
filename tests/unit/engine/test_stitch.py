"""Stitching a resumed request's outputs (srt/engine/stitch.py): hand-built inputs, exact expected outputs."""

from __future__ import annotations

from sglang_prorsa.srt.engine.stitch import Kept, Shape, Stitcher, merge_spans


# A toy tokenizer: token t decodes to the character chr(ord('a') + t).
def decode(ids):
    return "".join(chr(ord("a") + t) for t in ids)


def lp(ids, base=-1.0):
    return [(base - i / 10, t, None) for i, t in enumerate(ids)]


def cont(ids, finish=None, logprobs=None, **meta):
    m = {"finish_reason": finish, "prompt_tokens": 99, "completion_tokens": len(ids), "weight_version": "v1", **meta}
    if logprobs is not None:
        m["output_token_logprobs"] = [list(x) for x in logprobs]
    return {"text": decode(ids), "output_ids": list(ids), "meta_info": m}


def test_non_streaming_gives_one_final_output_with_everything_stitched():
    kept = Kept(prompt_tokens=5, ids=[0, 1, 2], per_token={"output_token_logprobs": lp([0, 1, 2])},
                weight_spans=[("v1", 0, 3)], base_meta={"cached_tokens": 4})
    st = Stitcher("orig-rid", kept, Shape(stream=False, incremental=False), decode)
    assert st.update(cont([3], logprobs=lp([3], -5))) is None  # not finished: nothing for a non-streaming caller
    out = st.update(cont([3, 4], finish={"type": "length", "length": 2}, logprobs=lp([3, 4], -5)))
    assert out["output_ids"] == [0, 1, 2, 3, 4]
    assert out["text"] == "abcde"
    m = out["meta_info"]
    assert m["id"] == "orig-rid" and m["prompt_tokens"] == 5 and m["completion_tokens"] == 5
    assert m["cached_tokens"] == 4
    assert m["finish_reason"] == {"type": "length", "length": 5}  # the caller's whole budget
    assert m["output_token_logprobs"] == lp([0, 1, 2]) + [(-5.0, 3, None), (-5.1, 4, None)]
    assert m["output_token_logprobs_length"] == 5
    assert m["weight_versions"] == [{"version": "v1", "start": 0, "end": 5}] and m["weight_version"] == "v1"
    assert st.finished


def test_weight_versions_keep_the_version_of_each_token():
    kept = Kept(prompt_tokens=2, ids=[0, 1, 2], weight_spans=[("v1", 0, 3)])
    st = Stitcher("r", kept, Shape(False, False), decode)
    out = st.update(cont([5, 6], finish={"type": "length"}, weight_version="v2",
                         weight_versions=[{"version": "v2", "start": 0, "end": 2}]))
    assert out["meta_info"]["weight_versions"] == [{"version": "v1", "start": 0, "end": 3},
                                                   {"version": "v2", "start": 3, "end": 5}]
    assert out["meta_info"]["weight_version"] == "v2"
    assert merge_spans([("a", 0, 2), ("a", 2, 4), ("b", 4, 4), ("b", 4, 6)]) == [("a", 0, 4), ("b", 4, 6)]


def test_cumulative_stream_repeats_everything_and_incremental_stream_sends_only_what_is_new():
    kept = Kept(prompt_tokens=1, ids=[0, 1], delivered_ids=1, delivered_text=1)
    cum = Stitcher("r", kept, Shape(stream=True, incremental=False), decode)
    assert cum.update(cont([2]))["output_ids"] == [0, 1, 2]
    assert cum.update(cont([2, 3], finish={"type": "length"}))["text"] == "abcd"

    kept = Kept(prompt_tokens=1, ids=[0, 1], delivered_ids=1, delivered_text=1,
                per_token={"output_token_logprobs": lp([0, 1])})
    inc = Stitcher("r", kept, Shape(stream=True, incremental=True), decode)
    first = inc.update(cont([2], logprobs=lp([2], -3)))
    # The kept token the caller had not seen yet (1) comes first, then the new one.
    assert first["output_ids"] == [1, 2] and first["text"] == "bc"
    assert first["meta_info"]["output_token_logprobs"] == [lp([0, 1])[1], (-3.0, 2, None)]
    last = inc.update(cont([2, 3], finish={"type": "length"}, logprobs=lp([2, 3], -3)))
    assert last["output_ids"] == [3] and last["text"] == "d"


def test_a_stop_string_straddling_the_move_is_honoured():
    # Kept "abc", stop "cd": the continuation only sees "d..." and cannot match it.
    kept = Kept(prompt_tokens=1, ids=[0, 1, 2])
    st = Stitcher("r", kept, Shape(False, False), decode, stop=["cd"])
    out = st.update(cont([3, 4, 5]))
    assert st.finished and st.straddle_stop == "cd"
    assert out["output_ids"] == [0, 1, 2, 3]  # up to the token that completes the stop string
    assert out["text"] == "ab"  # trimmed before the stop string, as SGLang does
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "cd"}


def test_no_stop_trim_keeps_the_stop_string_and_a_match_inside_new_tokens_is_the_continuations():
    kept = Kept(prompt_tokens=1, ids=[0, 1, 2])
    st = Stitcher("r", kept, Shape(False, False), decode, stop=["cd"], no_stop_trim=True)
    assert st.update(cont([3]))["text"] == "abcd"
    # "ef" lies wholly in the new tokens: the continuation reports it; we do not cut on our own.
    st = Stitcher("r", Kept(prompt_tokens=1, ids=[0, 1]), Shape(False, False), decode, stop=["ef"])
    assert st.update(cont([2, 3, 4, 5, 6])) is None and st.straddle_stop is None
    out = st.update(cont([2, 3, 4, 5], finish={"type": "stop", "matched": "ef"}))
    assert out["text"] == "abcd"


def test_rebase_continues_from_what_a_failed_continuation_produced():
    kept = Kept(prompt_tokens=1, ids=[0], per_token={"output_token_logprobs": lp([0])})
    st = Stitcher("r", kept, Shape(stream=True, incremental=True), decode)
    assert st.update(cont([1, 2], logprobs=lp([1, 2], -2)))["output_ids"] == [0, 1, 2]
    st.rebase()  # that continuation died; the next one starts after token 2
    assert st.kept.ids == [0, 1, 2] and st.kept.delivered_ids == 3
    out = st.update(cont([3], finish={"type": "length"}, logprobs=lp([3], -7)))
    assert out["output_ids"] == [3]
    assert out["meta_info"]["output_token_logprobs"] == [(-7.0, 3, None)]


def test_budget_exhausted_at_the_move_finishes_without_a_continuation():
    st = Stitcher("r", Kept(prompt_tokens=3, ids=[0, 1]), Shape(False, False), decode)
    out = st.final_without_continuation({"type": "length", "length": 2})
    assert out["output_ids"] == [0, 1] and out["meta_info"]["completion_tokens"] == 2 and st.finished


def test_moves_of_an_attempt_that_moved_again_are_listed_after_it_in_order():
    first = {"from_instance": "2", "rid": "a1", "kv_tokens": 10}
    second = {"from_instance": "2", "rid": "a2", "kv_tokens": 10}
    st = Stitcher("orig", Kept(prompt_tokens=5, ids=[0]), Shape(stream=False, incremental=False), decode,
                  migrations=[first, second])
    # The second attempt's decode instance switched too and continued it (twice): it reports those moves, flat.
    nested = [{"from_instance": "3", "rid": "b1"}, {"from_instance": "1", "rid": "b2"}]
    second["then"] = nested
    out = st.update(cont([1], finish={"type": "stop"}, prorsa={"migrations": nested}))
    moves = out["meta_info"]["prorsa"]["migrations"]
    assert [m["rid"] for m in moves] == ["a1", "a2", "b1", "b2"]
    assert all("then" not in m for m in moves)
