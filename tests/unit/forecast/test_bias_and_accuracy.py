"""Multiplicative bias correction (B.8) and per-window WAPE (§5.5)."""

import pytest

from sglang_prorsa.srt.forecast.accuracy import AccuracyTracker, wape_of
from sglang_prorsa.srt.forecast.bias import MultiplicativeBias


def test_bias_is_a_ratio_of_smoothed_sums():
    b = MultiplicativeBias(beta=0.5, lo=0.5, hi=2.0)
    assert b.factor == 1.0
    b.update(0.0, 0.0)  # empty window: no information
    assert b.factor == 1.0
    b.update(100.0, 120.0)  # first window initialises: 120 / 100
    assert b.factor == pytest.approx(1.2)
    b.update(100.0, 80.0)  # F = 0.5*100 + 0.5*100 = 100, R = 0.5*120 + 0.5*80 = 100
    assert b.factor == pytest.approx(1.0)
    b.update(100.0, 1000.0)  # R = 550, F = 100 -> 5.5, clipped to 2
    assert b.factor == 2.0 and b.apply(10.0) == 20.0


def _window(acc, start, forecast_arrivals, arrived, forecast_decode, admitted, backlog=0.0):
    acc.open(start, start + 10, forecast_arrivals=forecast_arrivals, raw_arrivals=forecast_arrivals, backlog=backlog,
             forecast_decode=forecast_decode, raw_decode=forecast_decode)
    acc.on_prefill_arrival(None, start + 1, arrived, None)
    acc.on_decode_admission(None, start + 2, admitted)
    return acc.close()


def test_wape_since_start_and_recent():
    acc = AccuracyTracker(recent_windows=2)
    assert acc.summary().prefill is None
    _window(acc, 0, 100, 80, 50, 50, backlog=20)
    _window(acc, 10, 100, 100, 50, 40)
    rec = _window(acc, 20, 0, 20, 10, 10)
    assert (rec.realised_arrivals, rec.realised_decode) == (20, 10)
    s = acc.summary()
    assert s.windows == 3
    assert s.prefill == pytest.approx((20 + 0 + 20) / 200)
    assert s.decode == pytest.approx((0 + 10 + 0) / 100)
    assert s.prefill_recent == pytest.approx(20 / 120)  # last two windows only
    assert s.decode_recent == pytest.approx(10 / 50)
    assert s.prefill_demand == pytest.approx(40 / 220)  # backlog 20 counted on both sides of window 1
    assert wape_of([(1, 0)]) is None
    assert acc.close() is None
