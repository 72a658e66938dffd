"""Decode admissions: Eq. 13 over observed requests (vectorised), and the admission horizon of predicted arrivals."""

import numpy as np
import pytest

from sglang_prorsa.policy.forecast.admissions import admission_horizon, observed_admissions
from sglang_prorsa.policy.forecast.profile import KVFootprint


def arr(*x):
    return np.array(x, dtype=np.float64)


def test_per_instance_recurrence_matches_the_serial_one():
    # 1000 tokens/s. In flight on p0 (id 0) since 0 for 1000 tokens: ends at 1. Queued (u = t = 0.5, FIFO):
    # p0: 2000 -> 1 + 2 = 3, 8000 -> 3 + 8 = 11 (>= 10.5: not admitted); p1: 500 -> 1.0, 4000 -> 5.0
    kv = KVFootprint(64).many
    obs = observed_admissions(0.5, 10.0, 2, arr(1000), arr(1.0), arr(0.0), np.array([0]),
                              arr(2000, 500, 4000, 8000), arr(2, 0.5, 4, 8), arr(0.1, 0.2, 0.3, 0.4),
                              np.array([0, 1, 1, 0]), kv)
    assert obs.finish_at == pytest.approx([3.0, 1.0, 5.0, 11.0])
    assert obs.tokens == 1000 + 2000 + 500 + 4000
    assert obs.kv_tokens == 1024 + 2048 + 512 + 4032
    # backlog V0: mean over the two instances of (free - t): (11 - 0.5 + 5 - 0.5) / 2
    assert obs.backlog_s == pytest.approx(7.5)


def test_overdue_in_flight_ends_now_and_unknown_instances_are_pooled():
    obs = observed_admissions(10.0, 1.0, 2, arr(50_000), arr(50.0), arr(0.0), np.array([0]),
                              arr(100, 300), arr(0.1, 0.3), arr(9.0, 9.5), np.array([-1, -1]), KVFootprint(1).many)
    # in flight was due at 50 s after 0: it ends at 50 (not before now); pool of 2: 40 s backlog
    assert obs.inflight_finish_at == pytest.approx([50.0])
    # pooled, in arrival order: 10 + (40 + 0.1) / 2 = 30.05; 10 + (40.1 + 0.3) / 2 = 30.2
    assert obs.finish_at == pytest.approx([30.05, 30.2])
    assert obs.tokens == 0.0


def test_admission_horizon():
    assert admission_horizon(10.0, 0.0, 0.5, 0.25) == 9.75  # no backlog: only the request's own prefill
    assert admission_horizon(10.0, 2.0, 0.5, 0.25) == 9.75  # drains at 4 s < 9.75
    # backlog 6 s at load 0.5 drains at 12 > 9.75: arrivals before (9.75 - 6) / 0.5 = 7.5 make it
    assert admission_horizon(10.0, 6.0, 0.5, 0.25) == pytest.approx(7.5)
    assert admission_horizon(10.0, 12.0, 0.5, 0.25) == 0.0  # the backlog alone fills the horizon
    assert admission_horizon(10.0, 5.0, 0.0, 0.25) == 9.75  # idle afterwards: the backlog drains first
    assert admission_horizon(1.0, 0.0, 0.1, 2.0) == 0.0
