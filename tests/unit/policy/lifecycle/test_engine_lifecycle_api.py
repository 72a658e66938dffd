"""The engine-side API the SGLang front calls, and trajectory-id extraction from requests."""

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.lifecycle.engine_api import carried_id, strip_carried_id, trajectory_id_of, valid_id
from sglang_prorsa.policy.lifecycle.events import MAX_ID_CHARS
from sglang_prorsa.policy.lifecycle.states import TrajState


def test_trajectory_id_from_body_or_header():
    assert trajectory_id_of({"trajectory_id": "b"}, {"X-Trajectory-Id": "h"}) == "b"
    assert trajectory_id_of({"text": "hi"}, {"x-trajectory-id": "h"}) == "h"
    assert trajectory_id_of({}, {"X-Trajectory-Id": "h"}) == "h"
    assert trajectory_id_of({"trajectory_id": 5}, None) is None
    assert trajectory_id_of(None, None) is None


ALL_FIELDS = {"session_id": "s", "routing_key": "rk", "conversation_id": "c", "trajectory_id": "b"}
ALL_HEADERS = {"X-Trajectory-Id": "h", "X-SMG-Routing-Key": "smg"}
CARRIED = {"sampling_params": {"temperature": 0, "custom_params": {"prorsa_trajectory_id": "v"}}}


@pytest.mark.parametrize("fields,headers,want", [
    ({"session_id": "s"}, None, "s"),
    ({"routing_key": "rk"}, None, "rk"),
    ({"conversation_id": "c"}, None, "c"),
    ({"trajectory_id": "b"}, None, "b"),
    ({}, {"X-Trajectory-Id": "h"}, "h"),
    ({}, {"x-smg-routing-key": "smg"}, "smg"),
    # all together, then each source removed in precedence order
    (ALL_FIELDS, ALL_HEADERS, "s"),
    ({**ALL_FIELDS, "session_id": None}, ALL_HEADERS, "rk"),
    ({"conversation_id": "c", "trajectory_id": "b"}, ALL_HEADERS, "c"),
    ({"trajectory_id": "b"}, ALL_HEADERS, "b"),
    ({"trajectory_id": "b", **CARRIED}, ALL_HEADERS, "b"),
    (CARRIED, ALL_HEADERS, "v"),
    ({}, ALL_HEADERS, "h"),
])
def test_one_precedence_sglang_fields_then_ours_then_the_router_key(fields, headers, want):
    assert trajectory_id_of(fields, headers) == want


def test_a_routing_key_copied_from_the_router_header_ranks_as_that_header():
    """SGLang's OpenAI routes fill ``routing_key`` from ``X-SMG-Routing-Key``: the engine sees the field, the front the
    header; both must still prefer ``X-Trajectory-Id``."""
    assert trajectory_id_of({"routing_key": "smg"}, ALL_HEADERS) == "h"
    assert trajectory_id_of({"routing_key": "smg"}, {"X-SMG-Routing-Key": "smg"}) == "smg"
    assert trajectory_id_of({"routing_key": "rk"}, ALL_HEADERS) == "rk"


@pytest.mark.parametrize("bad", [5, 5.0, True, ["a", "b"], {"id": "a"}, "", "x" * (MAX_ID_CHARS + 1)])
def test_an_unusable_value_is_skipped_for_the_next_source(bad):
    """Wrong types (a list: a batch's per-prompt ids, which SGLang's fields do not take) and over-long ids are not
    ids: the next source is read, and nothing raises (over HTTP, SGLang answers a mistyped field itself)."""
    for name in ("session_id", "routing_key", "conversation_id", "trajectory_id"):
        assert trajectory_id_of({name: bad}, None) is None
        assert trajectory_id_of({name: bad}, {"X-SMG-Routing-Key": "smg"}) == "smg"
    assert trajectory_id_of({}, {"X-Trajectory-Id": "x" * (MAX_ID_CHARS + 1), "X-SMG-Routing-Key": "smg"}) == "smg"
    assert trajectory_id_of({"session_id": "x" * MAX_ID_CHARS}, None) == "x" * MAX_ID_CHARS
    assert not valid_id(bad) and valid_id("t")


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


@pytest.mark.parametrize("params,want", [
    ({"custom_params": {"prorsa_trajectory_id": "v"}}, "v"),
    ({"custom_params": {"other": 1}}, None),
    ({"custom_params": ["prorsa_trajectory_id"]}, None),
    ({"custom_params": None}, None),
    ([{"custom_params": {"prorsa_trajectory_id": "v"}}], None),  # a batch's list of parameters: no one id
    (None, None),
])
def test_the_id_carried_in_custom_params_is_read_only_where_it_can_be(params, want):
    assert carried_id(params) == want
    assert trajectory_id_of({"sampling_params": params}, None) == want


def test_stripping_the_carried_id_leaves_the_callers_parameters_exactly():
    alone = {"temperature": 0, "custom_params": {"prorsa_trajectory_id": "v"}}
    strip_carried_id(alone)
    assert alone == {"temperature": 0}
    shared = {"custom_params": {"prorsa_trajectory_id": "v", "bias": [1, 2]}}
    strip_carried_id(shared)
    assert shared == {"custom_params": {"bias": [1, 2]}}
    untouched = {"custom_params": {"bias": 1}, "top_k": 5}
    strip_carried_id(untouched)
    assert untouched == {"custom_params": {"bias": 1}, "top_k": 5}
    strip_carried_id(None)  # nothing to strip: no error
