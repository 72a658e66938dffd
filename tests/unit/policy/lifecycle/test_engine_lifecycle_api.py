"""The engine-side API the SGLang front calls, and trajectory-id extraction from requests."""

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.lifecycle.engine_api import trajectory_id_of
from sglang_prorsa.policy.lifecycle.states import TrajState


def test_trajectory_id_from_body_or_header():
    assert trajectory_id_of({"trajectory_id": "b"}, {"X-Trajectory-Id": "h"}) == "b"
    assert trajectory_id_of({"text": "hi"}, {"x-trajectory-id": "h"}) == "h"
    assert trajectory_id_of({}, {"X-Trajectory-Id": "h"}) == "h"
    assert trajectory_id_of({"trajectory_id": 5}, None) is None
    assert trajectory_id_of(None, None) is None


def test_engine_calls_drive_the_tracker_with_clock_stamps():
    clock = ManualClock(50.0)
    cp = LifecycleControlPlane(clock)
    eng = cp.engine
    eng.request_arrived("t", 1200, instance="p1")
    assert cp.tracker.get("t").state is TrajState.READY and cp.tracker.get("t").instance == "p1"
    clock.advance(1.0)
    eng.prefill_started("t", "p1")
    assert cp.tracker.get("t").state is TrajState.PREFILL and cp.tracker.get("t").entered_at == 51.0
    eng.prefill_finished("t", "p1", ts=52.5)
    assert cp.tracker.get("t").state is TrajState.DECODE and cp.tracker.get("t").entered_at == 52.5
    eng.decode_finished("t")
    assert cp.tracker.get("t").state is TrajState.DECODED
    eng.decode_finished("t")  # a resent completion is a duplicate, not an error
    assert cp.tracker.rejected_count == 0
    with pytest.raises(ValueError):
        eng.request_arrived("u", -1)
