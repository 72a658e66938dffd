"""Per-request prompt-work accounting: what a switch wastes, and what resumed requests still compute."""

from types import SimpleNamespace

from sglang_prorsa.srt.scheduler import counters as counters_mod
from sglang_prorsa.srt.scheduler.counters import InstanceCounters


def _req(rid: str) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, cached_tokens=0)


def test_a_request_taken_off_mid_prefill_counts_its_computed_chunks_as_discarded():
    c = InstanceCounters()
    a, b = _req("a"), _req("b")
    c.observe_extend(70, [a, b], [64, 6])  # b's first chunk: 6 tokens (the batch's budget ran out)
    c.observe_extend(64, [b], [64])
    assert c.discard("b") == 70
    assert c.discard("b") == 0  # counted once
    assert c.discard("never-seen") == 0
    snap = c.snapshot()
    assert snap["prompt_tokens_discarded"] == 70
    assert snap["prompt_tokens_computed"] == 134


def test_resumed_requests_count_what_their_prefill_still_computed():
    c = InstanceCounters()
    c.expect_resume("r-1")
    c.observe_extend(1 + 40, [_req("r-1"), _req("fresh")], [1, 40])
    assert c.snapshot()["resume_prompt_tokens_computed"] == 1


def test_per_request_maps_stay_bounded(monkeypatch):
    monkeypatch.setattr(counters_mod, "MAX_TRACKED_REQUESTS", 8)
    c = InstanceCounters()
    for i in range(100):
        c.expect_resume(f"r{i}")
        c.observe_extend(3, [_req(f"r{i}")], [3])
    assert len(c._computed) <= 8 and len(c._resumes) <= 8
    assert c.discard("r99") == 3  # the newest are kept
    assert c.snapshot()["resume_prompt_tokens_computed"] == 300


def test_the_test_crash_marker_is_found_in_tokenized_requests():
    """--prorsa-test-crash-on-tokens: SGLang hands the scheduler token ids as an array('l'), single or in a batch
    (``BatchTokenizedGenerateReqInput.batch``); SGLang's own message classes, other messages (an abort) ignored."""
    from array import array
    from types import SimpleNamespace

    import pytest
    from sglang.srt.managers.io_struct import AbortReq, BatchTokenizedGenerateReqInput, TokenizedGenerateReqInput

    from sglang_prorsa.srt.scheduler import extension

    def req(ids):
        return TokenizedGenerateReqInput(
            rid="r", input_text="", input_ids=array("l", ids), input_embeds=None, mm_inputs=None, token_type_ids=None,
            sampling_params=None, return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
            token_ids_logprob=None, stream=False)

    sched = SimpleNamespace(disaggregation_mode=SimpleNamespace(value="prefill"))
    old = extension.RUNTIME
    try:
        extension.RUNTIME = SimpleNamespace(crash_on_tokens=(7, 8, 9))
        extension.ProrsaSchedulerMixin.prorsa_test_crash(sched, [req([1, 7, 8, 2, 9]), AbortReq(rid="r")])
        with pytest.raises(RuntimeError, match="prorsa test crash"):
            extension.ProrsaSchedulerMixin.prorsa_test_crash(sched, [req([1, 7, 8, 9])])
        with pytest.raises(RuntimeError, match="prorsa test crash"):
            extension.ProrsaSchedulerMixin.prorsa_test_crash(sched, [BatchTokenizedGenerateReqInput(
                batch=[req([2]), req([7, 8, 9, 3])])])
        sched.disaggregation_mode.value = "decode"  # decode schedulers never raise: the prefill side dies
        extension.ProrsaSchedulerMixin.prorsa_test_crash(sched, [req([7, 8, 9])])
        extension.RUNTIME = SimpleNamespace(crash_on_tokens=())
        sched.disaggregation_mode.value = "null"
        extension.ProrsaSchedulerMixin.prorsa_test_crash(sched, [req([7, 8, 9])])  # no flag: never
    finally:
        extension.RUNTIME = old
