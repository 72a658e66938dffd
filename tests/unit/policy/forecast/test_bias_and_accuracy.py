"""Multiplicative bias correction (B.8) and per-window WAPE (§5.5)."""

import pytest

from sglang_prorsa.policy.forecast.accuracy import AccuracyTracker, wape_of
from sglang_prorsa.policy.forecast.bias import MultiplicativeBias


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


def test_gate_turns_a_helpful_correction_on():
    from sglang_prorsa.policy.forecast.bias import GatedBias

    gate = GatedBias(beta=0.5, gate_windows=12, min_windows=4)
    factors = []
    for _ in range(4):  # a steady 50 % under-forecast
        factors.append(gate.candidate)
        assert gate.factor == 1.0  # not enough evidence yet
        gate.observe(100.0, factors[-1], 150.0)
    # candidates at the window starts: 1 (none yet), then 1.5 each time (R/F of the smoothed sums)
    assert factors == pytest.approx([1.0, 1.5, 1.5, 1.5])
    # corrected |b F - R| = 50 + 0 + 0 + 0 < raw 4 * 50: the gate opens
    assert gate.enabled and gate.factor == pytest.approx(1.5)


def test_gate_keeps_a_harmful_correction_off():
    from sglang_prorsa.policy.forecast.bias import GatedBias

    gate = GatedBias(beta=0.5, gate_windows=12, min_windows=4)
    for realised in (50.0, 150.0, 50.0, 150.0):  # noise around a correct forecast of 100
        gate.observe(100.0, gate.candidate, realised)
    # candidates at the starts: 1, 0.5 (50/100), 1.0 (100/100), 0.75 (75/100); corrected error
    # |100-50| + |50-150| + |100-50| + |75-150| = 275 > raw 4 * 50 = 200: the correction would hurt, so it is off
    assert not gate.enabled and gate.factor == 1.0
    assert gate.candidate == pytest.approx(112.5 / 100)  # R = 0.5 * 75 + 0.5 * 150, F = 100


def test_total_gate_over_sources():
    from sglang_prorsa.policy.forecast.bias import SourceBiases

    biases = SourceBiases(("a", "b"), beta=1.0, lo=0.5, hi=2.0, gate_windows=8, min_windows=2)
    for _ in range(3):  # a: always 2x under, b: exact
        biases.observe({"a": 100.0, "b": 100.0}, {"a": 200.0, "b": 100.0}, biases.candidates(), biases.gated())
    assert biases.gated() == {"a": 2.0, "b": 1.0}
    # totals (raw 200 vs 300): corrected (gated factors at the starts) 200, 300, 300 -> 100 < raw 300
    assert biases.total_enabled and biases.factors() == {"a": 2.0, "b": 1.0}


def test_persistence_baseline_and_paused_windows():
    acc = AccuracyTracker(recent_windows=10)
    _window(acc, 0, 100, 80, 50, 50)  # no previous window: persistence not scored
    _window(acc, 10, 100, 120, 50, 40)  # persistence 80 vs 120, 50 vs 40
    acc.open(20, 30, forecast_arrivals=100, raw_arrivals=100, backlog=0, forecast_decode=50, raw_decode=50)
    acc.on_paused(22.0, None)
    acc.on_prefill_arrival(None, 23, 5, None)
    rec = acc.close()
    assert rec.paused and rec.boundary  # held generation: neither scored nor used for the bias
    _window(acc, 30, 100, 90, 50, 60)  # after a pause persistence restarts: not scored
    _window(acc, 40, 100, 100, 50, 50)  # persistence 90 vs 100, 60 vs 50
    s, b = acc.summary(), acc.baseline()
    assert s.windows == 4 and s.excluded_windows == 1
    assert s.prefill == pytest.approx((20 + 20 + 10 + 0) / (80 + 120 + 90 + 100))
    assert b.windows == 2
    assert b.prefill == pytest.approx((40 + 10) / (120 + 100))
    assert b.decode == pytest.approx((10 + 10) / (40 + 50))
    assert b.forecast_prefill == pytest.approx((20 + 0) / (120 + 100))  # ours on the same two windows
    assert (b.prefill_arrival_tokens, b.decode_admission_tokens) == (100, 50)  # what it forecasts next
    d = b.to_dict()
    assert d["ratio"]["prefill"] == pytest.approx((20 / 220) / (50 / 220))


def test_gate_margin_keeps_a_marginal_correction_off():
    from sglang_prorsa.policy.forecast.bias import GatedBias

    gate = GatedBias(beta=1.0, gate_windows=12, min_windows=2, margin=0.05)
    for f, r in ((100.0, 104.0), (100.0, 96.0), (100.0, 104.0)):  # noise around a good forecast
        gate.observe(f, gate.candidate, r)
    # candidates at the starts: 1, 1.04, 0.96: corrected 4 + 8 + 8 = 20 vs raw 12: off either way
    assert not gate.enabled
    strong = GatedBias(beta=1.0, gate_windows=12, min_windows=2, margin=0.05)
    for _ in range(3):
        strong.observe(100.0, strong.candidate, 130.0)
    # corrected 30 + 0 + 0 = 30 < 0.95 * 90: on
    assert strong.enabled and strong.factor == pytest.approx(1.3)
