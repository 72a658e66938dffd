"""Trace replay on the control plane's clock (``--clock trace``, policy/clock.TraceClock): time is the trace's, each
window closes at its scheduled end however the events are batched, and a reset starts a new replay."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sglang_prorsa.control_plane import build_app
from sglang_prorsa.policy.clock import ManualClock, TraceClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import PredictorConfig


def turn(tid: str, t: float, prompt: int = 1000) -> list[dict]:
    return [{"trajectory_id": tid, "event": "request_arrived", "ts": t, "prompt_tokens": prompt},
            {"trajectory_id": tid, "event": "prefill_start", "ts": t + 0.1, "instance": "p0"},
            {"trajectory_id": tid, "event": "prefill_end", "ts": t + 0.2},
            {"trajectory_id": tid, "event": "decode_end", "ts": t + 0.5}]


def trace() -> list[dict]:
    return [e for k, t in enumerate((3.0, 14.0, 15.0, 27.0, 33.0)) for e in turn(f"t{k}", t, 1000 * (k + 1))]


def windows(cp: LifecycleControlPlane) -> list[tuple[float, float, float]]:
    return [(w.start, w.end, w.realised_arrivals) for w in cp.predictor.accuracy.recent]


def test_one_batch_closes_every_window_at_its_end():
    cp = LifecycleControlPlane(TraceClock(), PredictorConfig(horizon_s=10.0))
    cp.ingest_payload({"events": trace()})
    assert cp.clock.now() == 33.5  # the last event's ts
    # the first event (ts 3) started the trace; windows [3, 13), [13, 23), [23, 33) closed where they end
    assert windows(cp) == [(3.0, 13.0, 1000.0), (13.0, 23.0, 5000.0), (23.0, 33.0, 4000.0)]
    cp.forecast(at=53.0)  # a forecast later in the trace closes the windows it passes
    assert [w[:2] for w in windows(cp)][3:] == [(33.0, 43.0), (43.0, 53.0)] and cp.clock.now() == 53.0


def test_the_same_trace_in_any_batching_scores_the_same_as_a_manual_clock():
    batched = LifecycleControlPlane(TraceClock(), PredictorConfig(horizon_s=10.0))
    for e in trace():  # one event per post
        batched.ingest_payload({"events": [e]})
    batched.forecast(at=43.0)
    manual_clock = ManualClock(3.0)
    manual = LifecycleControlPlane(manual_clock, PredictorConfig(horizon_s=10.0))
    events = trace()
    for t_end in (13.0, 23.0, 33.0, 43.0):  # the replayer's way: events of a window, then the boundary
        manual.ingest_payload({"events": [e for e in events if t_end - 10.0 <= e["ts"] < t_end]})
        manual_clock.set(t_end)
        manual.tick()
    assert windows(batched) == windows(manual)
    assert batched.forecast(at=43.0).wape == manual.forecast(at=43.0).wape


def test_reset_starts_a_new_replay_keeping_the_configuration():
    cp = LifecycleControlPlane(TraceClock(), PredictorConfig(horizon_s=5.0))
    cp.ingest_payload({"events": trace()})
    cp.reset()
    assert cp.clock.now() == 0.0 and not cp.clock.started and cp.tracker.live_count == 0
    assert cp.config.horizon_s == 5.0 and windows(cp) == []
    cp.ingest_payload({"events": turn("again", 1000.0)})  # a trace starting anywhere
    assert cp.clock.now() == 1000.5
    with pytest.raises(RuntimeError, match="trace replay"):
        LifecycleControlPlane(ManualClock()).reset()


def test_the_standalone_app_replays_over_http_on_a_trace_clock():
    with TestClient(build_app(LifecycleControlPlane(TraceClock(), PredictorConfig(horizon_s=10.0)))) as client:
        assert client.post("/lifecycle", json={"events": trace()}).status_code == 200
        fc = client.get("/prorsa/forecast", params={"at": 43.0}).json()
        assert fc["t"] == 43.0 and fc["wape"]["windows"] == 4
        assert client.post("/lifecycle/reset").json() == {"ok": True, "horizon_s": 10.0}
        assert client.get("/lifecycle/status").json()["live_trajectories"] == 0
    with TestClient(build_app(LifecycleControlPlane(ManualClock()))) as client:  # no reset on a live control plane
        assert client.post("/lifecycle/reset").status_code in (404, 405)
