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
