"""Busy intervals for θ: idle to idle, and a busy period longer than ``theta.MAX_SAMPLE_S`` in slices, each counting
the work of its own passes and every request once (a request that spans two slices counts in the first)."""

from types import SimpleNamespace

from sglang_prorsa.policy.role_switch.theta import MAX_SAMPLE_S
from sglang_prorsa.srt.scheduler.counters import InstanceCounters


def _req(rid: str, cached: int = 0) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, cached_tokens=cached)


def test_an_idle_to_idle_interval_is_one_sample():
    c = InstanceCounters()
    c.observe_busy(True, "prefill", now=100.0)
    c.observe_extend(300, [_req("a", 100), _req("b", 0)], [200, 100])
    c.observe_busy(True, "prefill", now=103.0)
    c.observe_busy(False, "prefill", now=104.0)
    (one,) = c.intervals_since(-1)
    assert (one.seconds, one.new_tokens, one.cached_tokens, one.requests) == (4.0, 300, 100, 2)


def test_a_saturated_instance_reports_slices_and_counts_each_request_once():
    c = InstanceCounters()
    c.observe_busy(True, "prefill", now=0.0)
    c.observe_extend(1000, [_req("a", 4000), _req("b", 0)], [600, 400])  # b's first chunk
    c.observe_busy(True, "prefill", now=MAX_SAMPLE_S - 1)  # not yet a slice
    assert c.intervals_since(-1) == []
    c.observe_busy(True, "prefill", now=MAX_SAMPLE_S + 2)  # past it, with work seen: slice 1 closes here
    c.observe_extend(500, [_req("b", 0), _req("c", 1000)], [100, 400])  # b's last chunk: counted, b not again
    c.observe_busy(True, "prefill", now=MAX_SAMPLE_S + 5)
    c.observe_busy(False, "prefill", now=MAX_SAMPLE_S + 6)  # idle: slice 2 closes
    first, second = c.intervals_since(-1)
    assert (first.seconds, first.new_tokens, first.cached_tokens, first.requests) == (MAX_SAMPLE_S + 2, 1000, 4000, 2)
    assert (second.seconds, second.new_tokens, second.cached_tokens, second.requests) == (4.0, 500, 1000, 1)
    snap = c.snapshot()
    assert snap["busy_intervals"] == 2 and snap["busy_seconds"] == MAX_SAMPLE_S + 6


def test_a_long_busy_period_without_a_request_seen_is_not_sliced():
    c = InstanceCounters()
    c.observe_busy(True, "decode", now=0.0)
    c.observe_busy(True, "decode", now=3 * MAX_SAMPLE_S)  # decode work only: nothing for θ to learn from
    assert c.intervals_since(-1) == []
    c.observe_busy(False, "decode", now=3 * MAX_SAMPLE_S + 1)
    (one,) = c.intervals_since(-1)
    assert one.seconds == 3 * MAX_SAMPLE_S + 1 and one.requests == 0
