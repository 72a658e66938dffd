"""The batch path's shortcut parser (events._parse_plain) accepts only what the full validator accepts, and builds
the same event; anything it declines goes to the full validator, whose error names the index and the field."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_prorsa.policy.lifecycle.events import (
    EventKind,
    EventValidationError,
    LifecycleEvent,
    SandboxMode,
    _parse_plain,
    parse_event,
    parse_payload,
)


def test_usual_events_take_the_shortcut_and_match_the_full_validator():
    objs = [
        {"trajectory_id": "t1", "event": "request_arrived", "prompt_tokens": 4096},
        {"trajectory_id": "t1", "event": "aborted"},
        {"trajectory_id": "t2", "event": "sandbox_start", "ts": 12.5, "group_id": "g", "task": "swe", "turn": 0,
         "prompt_tokens": 4096, "mode": "cold"},
        {"trajectory_id": "t3", "event": "prefill_start", "instance": 3, "ts": 7},
        {"trajectory_id": "t4", "event": "reward_end", "accepted": False, "task": None},
        {"trajectory_id": "t5", "event": "decode_end", "output_tokens": 17, "instance": "p0"},
        {"trajectory_id": "t6", "event": "tool_start", "tool": "bash", "turn": 3},
    ]
    for obj in objs:
        fast = _parse_plain(obj)
        assert fast is not None, obj
        assert fast == parse_event(obj)
    assert _parse_plain(objs[2]) == LifecycleEvent("t2", EventKind.SANDBOX_START, ts=12.5, group_id="g", task="swe",
                                                   turn=0, prompt_tokens=4096, mode=SandboxMode.COLD)
    assert _parse_plain(objs[3]).instance == "3" and _parse_plain(objs[3]).ts == 7.0


@pytest.mark.parametrize("obj, field", [
    ({"trajectory_id": "a", "event": "request_arrived"}, "prompt_tokens"),
    ({"trajectory_id": "a", "event": "request_arrived", "prompt_tokens": -1}, "prompt_tokens"),
    ({"trajectory_id": "a", "event": "request_arrived", "prompt_tokens": True}, "prompt_tokens"),
    ({"trajectory_id": "a", "event": "sampled", "ts": math.nan}, "ts"),
    ({"trajectory_id": "a", "event": "sampled", "ts": math.inf}, "ts"),
    ({"trajectory_id": "a", "event": "sampled", "ts": False}, "ts"),
    ({"trajectory_id": "a", "event": "sandbox_start"}, "mode"),
    ({"trajectory_id": "a", "event": "sandbox_start", "mode": "tepid"}, "mode"),
    ({"trajectory_id": "a", "event": "prefill_start", "instance": -2}, "instance"),
    ({"trajectory_id": "a", "event": "reward_end", "accepted": 1}, "accepted"),
    ({"trajectory_id": "", "event": "sampled"}, "trajectory_id"),
    ({"trajectory_id": "a" * 300, "event": "sampled"}, "trajectory_id"),
    ({"trajectory_id": "a", "event": "sampled", "task": ""}, "task"),
    ({"trajectory_id": "a", "event": "sampled", "trajectory_ids": ["a"]}, "trajectory_ids"),
    ({"trajectory_id": "a", "event": "sampled", "colour": 1}, "colour"),
])
def test_bad_events_are_declined_and_reported_by_the_full_validator(obj, field):
    assert _parse_plain(obj) is None
    good = {"trajectory_id": "ok", "event": "sampled"}
    with pytest.raises(EventValidationError) as err:
        parse_payload({"events": [good, obj]})
    assert err.value.index == 1 and err.value.field == field


values = st.one_of(st.none(), st.booleans(), st.integers(-3, 5000), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from(["", "x", "prewarm", "cold", "abort", "a" * 300]), st.lists(st.text(max_size=2),
                                                                                            max_size=2))
fields = st.sampled_from(["trajectory_id", "event", "ts", "group_id", "task", "turn", "prompt_tokens", "mode", "tool",
                          "accepted", "instance", "output_tokens", "trajectory_ids", "weight_version", "other"])
kinds = st.sampled_from([k.value for k in EventKind] + ["bogus", 3])


@settings(max_examples=400, deadline=None)
@given(kind=kinds, tid=st.one_of(st.just("t"), values), extra=st.dictionaries(fields, values, max_size=5))
def test_the_shortcut_never_disagrees_with_the_full_validator(kind, tid, extra):
    obj = {"trajectory_id": tid, "event": kind, **extra}
    fast = _parse_plain(obj)
    try:
        full = parse_event(obj)
    except EventValidationError:
        assert fast is None
    else:
        assert fast is None or fast == full
