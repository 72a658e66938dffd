"""The per-instance serial recurrence (B.7 Eq. 13-14) over two prefill instances, hand-computed."""

import pytest

from sglang_prorsa.policy.forecast.decode_admissions import PrefillJob, forecast_decode_admissions
from sglang_prorsa.policy.forecast.profile import KVFootprint, PrefillTimeProfile


def g(x):  # 1000 tokens per second
    return x / 1000.0


def test_recurrence_over_two_instances():
    now, S = 0.5, 10.0
    inflight = [PrefillJob(1000, 0.0, instance="p0", finish_at=1.0)]  # v_p0 = 1.0; p1 idle: v_p1 = 0.5
    queued = [
        PrefillJob(2000, now, instance="p0"),  # b = max(0.5, 1.0) + 2 = 3.0
        PrefillJob(500, now, instance="p1"),  # b = 0.5 + 0.5 = 1.0
        PrefillJob(4000, now, instance="p1"),  # b = 1.0 + 4 = 5.0
        PrefillJob(8000, now, instance="p0"),  # b = 3 + 8 = 11.0 >= 10.5: not admitted in the horizon
    ]
    predicted = [
        PrefillJob(1000, 9.0, instance=None),  # routed to p1 (free at 5 < 11): b = max(9, 5) + 1 = 10.0 < 10.5
        PrefillJob(1000, 2.0, weight=0.5),  # sorted first: p1 free at 5.0 -> b = 5 + 0.5 = 5.5; then the one above 10.0
    ]
    fc = forecast_decode_admissions(now, S, ["p0", "p1"], inflight, queued, predicted, g, KVFootprint(64))
    assert fc.instance_free_at == pytest.approx({"p0": 11.0, "p1": 10.0})
    assert fc.tokens == pytest.approx(1000 + 2000 + 500 + 4000 + 0.5 * 1000 + 1000)
    # kappa rounds up to 64-token pages: 1024 + 2048 + 512 + 4032 + 0.5 * 1024 + 1024
    assert fc.kv_tokens == pytest.approx(1024 + 2048 + 512 + 4032 + 512 + 1024)


def test_in_flight_progress_is_honoured_and_overdue_work_finishes_now():
    fc = forecast_decode_admissions(
        10.0, 1.0, ["p0"], [PrefillJob(50_000, 0.0, instance="p0", finish_at=9.0)], [PrefillJob(100, 10.0)], [], g,
        KVFootprint(1))
    # the in-flight job was due at 9.0: it finishes "now" (10.0), then the queued one 10.0 + 0.1
    assert fc.tokens == 50_100 and fc.instance_free_at["p0"] == pytest.approx(10.1)


def test_profile_interpolation_and_kv_pages():
    prof = PrefillTimeProfile(points=((1000, 0.1), (3000, 0.5)))
    assert prof(2000) == pytest.approx(0.3)
    assert prof(5000) == pytest.approx(0.9)  # last segment's slope
    assert prof(0) == pytest.approx(0.0)  # first segment extended: 0.1 - 0.2 * 1 = -0.1 -> clipped at 0
    assert PrefillTimeProfile(base_s=0.01, per_token_s=0.001)(1000) == pytest.approx(1.01)
    assert KVFootprint(16)(17) == 32.0 and KVFootprint(16)(0) == 0.0
    with pytest.raises(ValueError):
        PrefillTimeProfile(points=((1, 0.1), (1, 0.2)))
