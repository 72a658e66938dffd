"""Engine-wide control events (issue 13 item 4): pause / continue, abort, weight update; validation, tracker, forecast."""

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.lifecycle.events import EventKind as K
from sglang_prorsa.policy.lifecycle.events import EventValidationError, LifecycleEvent, PauseMode, parse_payload
from sglang_prorsa.policy.lifecycle.states import TrajState
from sglang_prorsa.policy.lifecycle.tracker import Outcome, Phase, TrackerObserver, TrajectoryTracker


def ev(tid, kind, ts, **kw):
    return LifecycleEvent(tid, kind, ts=float(ts), **kw)


class Phases(TrackerObserver):
    def __init__(self):
        self.seen = []
        self.boundaries = []

    def on_phase(self, phase, traj, duration, completed, ts):
        self.seen.append((phase, traj.trajectory_id, duration, completed))

    def on_paused(self, ts, mode):
        self.boundaries.append(("paused", ts, mode))

    def on_continued(self, ts, paused_s):
        self.boundaries.append(("continued", ts, paused_s))

    def on_weights_updated(self, ts, version):
        self.boundaries.append(("weights", ts, version))


def test_wire_format_of_the_control_events():
    events = parse_payload({"events": [
        {"event": "generation_paused", "mode": "retract", "ts": 5},
        {"event": "generation_continued"},
        {"event": "requests_aborted", "trajectory_ids": ["a", "b"]},
        {"event": "requests_aborted", "trajectory_id": "c"},
        {"event": "requests_aborted"},
        {"event": "weights_updated", "weight_version": 7},
    ]})
    assert events[0].pause_mode is PauseMode.RETRACT and events[0].trajectory_id == "" and events[0].mode is None
    assert events[2].trajectory_ids == ("a", "b") and events[3].trajectory_ids == ("c",)
    assert events[4].trajectory_ids is None  # abort-all
    assert events[5].weight_version == "7"
    assert events[0].to_dict() == {"event": "generation_paused", "ts": 5.0, "mode": "retract"}


@pytest.mark.parametrize("event, field, fragment", [
    ({"event": "generation_paused"}, "mode", "required on 'generation_paused'"),
    ({"event": "generation_paused", "mode": "prewarm"}, "mode", "'abort', 'retract' or 'in_place'"),
    ({"event": "generation_paused", "mode": "abort", "trajectory_id": "x"}, "trajectory_id", "whole engine"),
    ({"event": "weights_updated", "weight_version": ""}, "weight_version", "non-empty"),
    ({"event": "requests_aborted", "trajectory_ids": "a"}, "trajectory_ids", "list"),
    ({"event": "requests_aborted", "trajectory_ids": ["a", 3]}, "trajectory_ids", "non-empty string"),
    ({"trajectory_id": "a", "event": "sampled", "trajectory_ids": ["a"]}, "trajectory_ids", "only allowed"),
    ({"trajectory_id": "a", "event": "decode_end", "output_tokens": -1}, "output_tokens", ">= 0"),
])
def test_bad_control_events_name_the_field(event, field, fragment):
    with pytest.raises(EventValidationError) as err:
        parse_payload({"events": [event]})
    assert err.value.field == field and err.value.index == 0 and fragment in str(err.value)


def test_pause_in_retract_mode_freezes_engine_clocks():
    rec = Phases()
    tr = TrajectoryTracker([rec])
    tr.apply(ev("d", K.REQUEST_ARRIVED, 0, prompt_tokens=100))
    tr.apply(ev("d", K.PREFILL_END, 10))  # decoding since 10
    tr.apply(ev("t", K.TOOL_START, 11, tool="bash"))
    assert tr.apply(ev("", K.GENERATION_PAUSED, 12, pause_mode=PauseMode.RETRACT)) is Outcome.APPLIED
    assert tr.apply(ev("", K.GENERATION_PAUSED, 13, pause_mode=PauseMode.RETRACT)) is Outcome.DUPLICATE
    assert tr.paused and tr.get("d").state is TrajState.DECODE  # suspended, not dropped
    tr.apply(ev("r", K.REQUEST_ARRIVED, 15, prompt_tokens=50))  # queued while paused
    assert tr.apply(ev("", K.GENERATION_CONTINUED, 20)) is Outcome.APPLIED
    assert tr.apply(ev("", K.GENERATION_CONTINUED, 21)) is Outcome.DUPLICATE
    # the pause (12 -> 20) does not count as time in an engine state; the tool (trainer side) ran on
    assert tr.get("d").entered_at == 18.0 and tr.get("r").entered_at == 20.0 and tr.get("t").entered_at == 11.0
    tr.apply(ev("d", K.DECODE_END, 25))
    assert (Phase.DECODE, "d", 7.0, True) in rec.seen  # 2 s before the pause + 5 s after
    assert [b[0] for b in rec.boundaries] == ["paused", "continued"] and rec.boundaries[1][2] == 8.0


def test_pause_in_abort_mode_interrupts_in_flight_trajectories():
    rec = Phases()
    tr = TrajectoryTracker([rec])
    tr.apply(ev("q", K.REQUEST_ARRIVED, 0, prompt_tokens=100, turn=3))
    tr.apply(ev("d", K.REQUEST_ARRIVED, 0, prompt_tokens=100))
    tr.apply(ev("d", K.PREFILL_END, 1))
    tr.apply(ev("t", K.TOOL_START, 1, tool="bash"))
    tr.apply(ev("", K.GENERATION_PAUSED, 4, pause_mode=PauseMode.ABORT))
    assert tr.get("q").state is TrajState.INTERRUPTED and tr.get("d").state is TrajState.INTERRUPTED
    assert tr.get("t").state is TrajState.TOOL
    assert (Phase.DECODE, "d", 3.0, False) in rec.seen  # the cut decode is censored, not completed
    tr.apply(ev("", K.GENERATION_CONTINUED, 6))
    assert tr.apply(ev("q", K.REQUEST_ARRIVED, 9, prompt_tokens=100)) is Outcome.APPLIED  # the trainer resends
    assert tr.get("q").state is TrajState.READY and tr.get("q").turn == 3  # the same turn
    assert (Phase.RESEND, "q", 5.0, True) in rec.seen
    assert tr.apply(ev("d", K.REWARD_START, 9)) is Outcome.APPLIED  # or takes the partial response as final
    assert tr.state_counts()["interrupted"] == 0


def test_requests_aborted_by_id_or_all():
    tr = TrajectoryTracker()
    for tid in ("a", "b", "c"):
        tr.apply(ev(tid, K.REQUEST_ARRIVED, 0, prompt_tokens=10))
    tr.apply(ev("c", K.PREFILL_END, 1))
    tr.apply(ev("x", K.TOOL_START, 1))
    tr.apply(ev("", K.REQUESTS_ABORTED, 2, trajectory_ids=("a", "x", "ghost")))
    assert [tr.get(t).state.value for t in "abcx"] == ["interrupted", "ready", "decode", "tool"]
    tr.apply(ev("", K.REQUESTS_ABORTED, 3))  # abort-all: every in-flight request
    assert [tr.get(t).state.value for t in "abcx"] == ["interrupted"] * 3 + ["tool"]
    assert tr.rejected_count == 0 and tr.live_count == 4


def test_weights_updated_version_and_duplicates():
    rec = Phases()
    tr = TrajectoryTracker([rec])
    assert tr.apply(ev("", K.WEIGHTS_UPDATED, 1, weight_version="3")) is Outcome.APPLIED
    assert tr.apply(ev("", K.WEIGHTS_UPDATED, 2, weight_version="3")) is Outcome.DUPLICATE
    assert tr.apply(ev("", K.WEIGHTS_UPDATED, 5, weight_version="4")) is Outcome.APPLIED
    assert (tr.weight_version, tr.weights_updated_at) == ("4", 5.0)
    assert rec.boundaries == [("weights", 1.0, "3"), ("weights", 5.0, "4")]


def test_engine_api_reports_the_control_surface():
    clock = ManualClock(10.0)
    cp = LifecycleControlPlane(clock)
    cp.engine.request_arrived("a", 100)
    cp.engine.generation_paused("in_place")
    assert cp.tracker.paused and cp.tracker.pause_mode is PauseMode.IN_PLACE
    assert cp.forecast().paused and cp.forecast().to_dict()["paused"] is True
    clock.advance(5)
    cp.engine.generation_continued()
    cp.engine.requests_aborted(["a"])
    assert cp.tracker.get("a").state is TrajState.INTERRUPTED and cp.tracker.get("a").interrupted_at == 15.0
    cp.engine.weights_updated(9)
    assert cp.forecast().weight_version == "9" and cp.status()["weight_version"] == "9"
    cp.engine.decode_finished("a", output_tokens=12)  # an abort that raced the last token: the response is done
    assert cp.tracker.get("a").state is TrajState.DECODED
    with pytest.raises(ValueError):
        cp.engine.generation_paused("sideways")


def test_paused_windows_are_not_scored_nor_fed_to_the_correction():
    clock = ManualClock(0.0)
    cp = LifecycleControlPlane(clock, PredictorConfig(default_prompt_tokens=1000, bias_gate_min_windows=1))
    cp.tick()
    clock.set(5.0)
    cp.ingest([ev("a", K.TOOL_START, 5)])
    clock.set(10.0)
    cp.tick()  # [10, 20) forecasts a's return
    cp.engine.generation_paused("retract", ts=12.0)
    clock.set(20.0)
    cp.tick()  # [10, 20) overlapped the pause: excluded; [20, 30) opens while paused
    fc = cp.forecast()
    assert fc.paused and fc.wape.excluded_windows == 1 and fc.wape.windows == 1  # only [0, 10) (0 vs 0) scored
    assert not cp.predictor.bias_prefill.by_source["tool"]._recent  # nothing learned from the held window
    assert cp.predictor.accuracy.recent[-1].paused
