"""The control plane's background refresher: windows close and the forecast is precomputed off the request path."""

import threading

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import PredictorConfig


def _wait(predicate, limit=20.0):
    done = threading.Event()
    for _ in range(int(limit / 0.01)):
        if predicate():
            return True
        done.wait(0.01)
    return False


def test_refresher_closes_windows_and_serves_the_cached_forecast():
    clock = ManualClock(100.0)
    cp = LifecycleControlPlane(clock, PredictorConfig(horizon_s=5.0))
    assert cp.cached_forecast() is None and not cp.running
    cp.start(interval_s=0.01)
    try:
        assert _wait(lambda: cp.cached_forecast() is not None)
        first = cp.forecast()
        assert first is cp.cached_forecast() and first.horizon_s == 5.0 and first.t == 100.0
        cp.engine.request_arrived("a", 700)
        clock.set(106.0)  # one horizon later: the refresher closes [100, 105) and opens the next window
        assert _wait(lambda: cp.predictor.accuracy.windows >= 1 and getattr(cp.cached_forecast(), "t", None) == 106.0)
        assert cp.cached_forecast().sources.ready == 700
        assert cp.forecast(at=107.0).t == 107.0  # an explicit time still computes
        assert cp.status()["refresher"]["running"]
    finally:
        cp.stop()
    assert not cp.running and cp.cached_forecast() is None
    cp.stop()  # idempotent
    assert cp.forecast().t == 106.0  # without a refresher: computed on demand
