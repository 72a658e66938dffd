"""Validation of lifecycle events: every rejection names the event index and the field."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.lifecycle.events import (
    MAX_BATCH_EVENTS,
    EventKind,
    EventValidationError,
    LifecycleEvent,
    SandboxMode,
    parse_event,
    parse_payload,
)


def test_single_event_parses_all_fields():
    ev = parse_event(
        {"trajectory_id": "t1", "event": "sandbox_start", "ts": 12.5, "group_id": "g", "task": "swe", "turn": 0,
         "prompt_tokens": 4096.0, "mode": "cold"}
    )
    assert ev == LifecycleEvent("t1", EventKind.SANDBOX_START, ts=12.5, group_id="g", task="swe", turn=0,
                                prompt_tokens=4096, mode=SandboxMode.COLD)
    assert parse_event({"trajectory_id": "t", "event": "prefill_start", "instance": 3}).instance == "3"


@pytest.mark.parametrize(
    "event, field, fragment",
    [
        ({"event": "sampled"}, "trajectory_id", "required"),
        ({"trajectory_id": "", "event": "sampled"}, "trajectory_id", "non-empty"),
        ({"trajectory_id": "a"}, "event", "required"),
        ({"trajectory_id": "a", "event": "teleported"}, "event", "unknown event"),
        ({"trajectory_id": "a", "event": 7}, "event", "unknown event"),
        ({"trajectory_id": "a", "event": "sampled", "turn": "3"}, "turn", "integer"),
        ({"trajectory_id": "a", "event": "sampled", "turn": 1.5}, "turn", "integer"),
        ({"trajectory_id": "a", "event": "sampled", "prompt_tokens": True}, "prompt_tokens", "integer"),
        ({"trajectory_id": "a", "event": "request_arrived", "prompt_tokens": -5}, "prompt_tokens", ">= 0"),
        ({"trajectory_id": "a", "event": "request_arrived"}, "prompt_tokens", "required on 'request_arrived'"),
        ({"trajectory_id": "a", "event": "tool_start", "turn": 2**31}, "turn", "<= 2147483647"),  # an int32 column
        ({"trajectory_id": "a", "event": "request_arrived", "prompt_tokens": 1e300}, "prompt_tokens", "<= 2147483647"),
        ({"trajectory_id": "a", "event": "decode_end", "output_tokens": 2**64}, "output_tokens", "<= 2147483647"),
        ({"trajectory_id": "a", "event": "sandbox_start"}, "mode", "required"),
        ({"trajectory_id": "a", "event": "sandbox_start", "mode": "lukewarm"}, "mode", "prewarm"),
        ({"trajectory_id": "a", "event": "prefill_start"}, "instance", "required"),
        ({"trajectory_id": "a", "event": "reward_end", "accepted": "yes"}, "accepted", "boolean"),
        ({"trajectory_id": "a", "event": "sampled", "ts": -1}, "ts", ">= 0"),
        ({"trajectory_id": "a", "event": "sampled", "ts": "now"}, "ts", "unix seconds"),
        ({"trajectory_id": "a", "event": "sampled", "promt_tokens": 5}, "promt_tokens", "unknown field"),
    ],
)
def test_bad_events_name_index_and_field(event, field, fragment):
    good = {"trajectory_id": "ok", "event": "sampled"}
    with pytest.raises(EventValidationError) as err:
        parse_payload({"events": [good, good, event]})
    assert err.value.index == 2
    assert err.value.field == field
    assert fragment in str(err.value)
    assert str(err.value).startswith(f"event 2, field '{field}'")
    assert err.value.status == 422


def test_envelope_errors():
    with pytest.raises(EventValidationError) as err:
        parse_payload([1, 2])
    assert err.value.field == "body" and err.value.index is None
    with pytest.raises(EventValidationError) as err:
        parse_payload({"events": {"trajectory_id": "a"}})
    assert err.value.field == "events"
    with pytest.raises(EventValidationError) as err:
        parse_payload({"events": [], "extra": 1})
    assert err.value.field == "extra"


def test_batch_limit_is_413():
    events = [{"trajectory_id": str(i), "event": "sampled"} for i in range(MAX_BATCH_EVENTS + 1)]
    with pytest.raises(EventValidationError) as err:
        parse_payload({"events": events})
    assert err.value.status == 413 and err.value.field == "events"
    assert len(parse_payload({"events": events[:MAX_BATCH_EVENTS]})) == MAX_BATCH_EVENTS


def test_batch_is_all_or_none():
    cp = LifecycleControlPlane(ManualClock(100.0))
    batch = {"events": [
        {"trajectory_id": "a", "event": "sampled"},
        {"trajectory_id": "b", "event": "sampled"},
        {"trajectory_id": "c", "event": "request_arrived", "prompt_tokens": -1},
    ]}
    with pytest.raises(EventValidationError):
        cp.ingest_payload(batch)
    assert cp.tracker.live_count == 0
    result = cp.ingest_payload({"events": batch["events"][:2]})
    assert (result.applied, result.rejected) == (2, 0)
    assert cp.tracker.get("a").entered_at == 100.0  # stamped with the receiver's clock


_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.integers(2**31 - 3, 2**64), st.floats(allow_nan=True), st.text(max_size=5),
                    st.lists(st.integers(), max_size=2))
_keys = st.sampled_from(["trajectory_id", "event", "ts", "group_id", "task", "turn", "prompt_tokens", "mode", "tool",
                         "accepted", "instance", "bogus"])
_event_names = st.sampled_from([k.value for k in EventKind] + ["nope"])


@settings(max_examples=120, deadline=None)
@given(st.lists(st.dictionaries(_keys, st.one_of(_values, _event_names), max_size=8), max_size=6))
def test_fuzzed_batches_either_validate_or_raise_validation_error(objs):
    cp = LifecycleControlPlane(ManualClock(0.0))
    try:
        result = cp.ingest_payload({"events": objs})
    except EventValidationError as exc:
        assert exc.index is not None or exc.field is not None
        return
    assert result.received == len(objs)
    cp.forecast()  # whatever got applied, a forecast still computes


def test_the_largest_turn_and_token_counts_are_ingested_and_forecast():
    cp = LifecycleControlPlane(ManualClock(5.0))
    top = 2**31 - 1
    result = cp.ingest_payload({"events": [
        {"trajectory_id": "a", "event": "sampled", "turn": top},
        {"trajectory_id": "b", "event": "request_arrived", "prompt_tokens": top},
        {"trajectory_id": "b", "event": "prefill_start", "instance": "0"},
        {"trajectory_id": "b", "event": "prefill_end"},
        {"trajectory_id": "b", "event": "decode_end", "output_tokens": top},
        {"trajectory_id": "b", "event": "tool_start", "turn": top, "tool": "bash"}]})
    assert (result.applied, result.rejected) == (6, 0), result
    cp.forecast()
