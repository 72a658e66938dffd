"""θ^P estimator: busy intervals, shared time, idle gaps, interruptions, profiles, fallback."""

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.role_switch.throughput import ThroughputConfig, ThroughputEstimator, WorkloadProfile

SHORT_NO_HITS = WorkloadProfile(prompt_bucket=0, cache_hit_bucket=0)


def make(**overrides) -> tuple[ThroughputEstimator, ManualClock]:
    clock = ManualClock()
    return ThroughputEstimator(ThroughputConfig(profiled_theta=777.0, **overrides), clock), clock


def test_profiled_value_before_any_interval():
    est, _ = make(profiled_by_profile={WorkloadProfile(1, 0): 300.0})
    assert est.estimate(SHORT_NO_HITS) == 777.0
    assert est.estimate(WorkloadProfile(1, 0)) == 300.0
    assert not est.is_measured(SHORT_NO_HITS)


def test_overlapping_requests_share_instance_time():
    # r1 runs [0, 4), r2 runs [1, 5): one busy interval of 5 s holding 2000 tokens -> 400 tok/s,
    # not 2000 / (4 + 4) = 250 (each charged its own latency).
    est, clock = make()
    est.start("p0", "r1", 1000)
    clock.set(1.0)
    est.start("p0", "r2", 1000)
    clock.set(4.0)
    est.finish("p0", "r1")
    clock.set(5.0)
    est.finish("p0", "r2")
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(400.0)


def test_idle_gap_is_excluded():
    # Busy [0, 2) and [10, 12) with 1000 tokens each: 2000 / 4 s = 500 tok/s; idle 8 s never counts.
    est, clock = make()
    est.start("p0", "r1", 1000)
    clock.set(2.0)
    est.finish("p0", "r1")
    clock.set(10.0)
    est.start("p0", "r2", 1000)
    clock.set(12.0)
    est.finish("p0", "r2")
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(500.0)


def test_instances_are_separate_intervals():
    # Two instances busy at the same wall time: instance-seconds add up (2 s + 2 s), tokens too.
    est, clock = make()
    est.start("p0", "a", 600)
    est.start("p1", "b", 1400)
    clock.set(2.0)
    est.finish("p0", "a")
    est.finish("p1", "b")
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(2000 / 4.0)


def test_aborted_request_discards_whole_interval():
    est, clock = make()
    est.start("p0", "r1", 1000)
    clock.set(1.0)
    est.start("p0", "r2", 1000)
    clock.set(2.0)
    est.abort("p0", "r1")
    clock.set(3.0)
    est.finish("p0", "r2")  # r2 completed, but its interval lost r1's share of time: not comparable
    assert est.estimate(SHORT_NO_HITS) == 777.0
    assert est.discarded_intervals == 1


def test_interrupted_instance_discards_and_ignores_late_finishes():
    est, clock = make()
    est.start("p0", "r1", 1000)
    clock.set(1.0)
    est.interrupt("p0")  # role switch starts
    clock.set(2.0)
    est.finish("p0", "r1")  # late event from before the switch
    assert est.estimate(SHORT_NO_HITS) == 777.0
    # A fresh interval after the interruption counts normally.
    est.start("p0", "r3", 900)
    clock.set(5.0)
    est.finish("p0", "r3")
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(300.0)


def test_open_interval_does_not_count_and_idle_keeps_last_estimate():
    est, clock = make()
    est.start("p0", "r1", 1000)
    clock.set(2.0)
    est.finish("p0", "r1")
    est.start("p0", "r2", 5000)  # still running: contributes nothing yet
    clock.set(100.0)
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(500.0)
    est.interrupt("p0")
    clock.set(1000.0)  # long idle: never read as zero speed
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(500.0)


def test_each_request_counted_once():
    est, clock = make()
    est.start("p0", "r1", 1000)
    clock.set(2.0)
    est.finish("p0", "r1")
    est.finish("p0", "r1")  # duplicate completion event
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(500.0)


def test_profiles_are_kept_apart():
    # Long prompts with 80 % prefix hits land in their own bucket and leave the short/no-hit estimate alone.
    est, clock = make(prompt_bucket_edges=(2048,), cache_hit_bucket_edges=(0.5,))
    est.start("p0", "long", 10_000, cached_tokens=8_000)
    clock.set(1.0)
    est.finish("p0", "long")
    long_hits = WorkloadProfile(prompt_bucket=1, cache_hit_bucket=1)
    assert est.profile_of(10_000, 8_000) == long_hits
    assert est.estimate(long_hits) == pytest.approx(10_000.0)  # full prompt length counted, cache hits included
    assert est.estimate(SHORT_NO_HITS) == 777.0


def test_window_keeps_recent_intervals_only():
    est, clock = make(window_intervals=2)
    for tokens in (100, 1000, 1000):  # three 1 s intervals: the 100-token one falls out of the window
        est.start("p0", "r", tokens)
        clock.advance(1.0)
        est.finish("p0", "r")
    assert est.estimate(SHORT_NO_HITS) == pytest.approx(1000.0)


def test_snapshot_is_plain():
    est, clock = make()
    est.start("p0", "r1", 1000)
    clock.set(2.0)
    est.finish("p0", "r1")
    assert est.snapshot()["profiles"]["0/0"] == {"theta_p": 500.0, "intervals": 1}
