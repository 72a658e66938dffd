"""Which trajectory a request reports under, read on the engine (srt/engine/hooks.py): SGLang's own fields on the
request object (in-process callers have no HTTP request), then our header, then sglang-router's; single requests only.
The middleware moves a usable ``trajectory_id`` body field into the header and leaves an unusable one's header."""

from __future__ import annotations

import orjson
import pytest
from sglang.srt.managers.io_struct import GenerateReqInput
from starlette.datastructures import Headers

from sglang_prorsa.srt.engine.hooks import trajectory_of
from sglang_prorsa.srt.engine.middleware import _move_trajectory_id


class Request:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = Headers(headers=headers)


def single(**fields) -> GenerateReqInput:
    return GenerateReqInput(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 2}, **fields)


@pytest.mark.parametrize("fields,headers,want", [
    ({"session_id": "s"}, {}, "s"),
    ({"routing_key": "rk"}, {}, "rk"),
    ({"conversation_id": "c"}, {}, "c"),
    ({}, {"X-Trajectory-Id": "h"}, "h"),
    ({}, {"X-SMG-Routing-Key": "smg"}, "smg"),
    ({"session_id": "s", "routing_key": "rk", "conversation_id": "c"}, {"X-Trajectory-Id": "h"}, "s"),
    ({"routing_key": "rk"}, {"X-Trajectory-Id": "h", "X-SMG-Routing-Key": "smg"}, "rk"),
    # an OpenAI route: SGLang copied the router header into routing_key; our header still wins over it
    ({"routing_key": "smg"}, {"X-Trajectory-Id": "h", "X-SMG-Routing-Key": "smg"}, "h"),
    ({}, {}, None),
])
def test_a_single_requests_id_by_the_one_precedence(fields, headers, want):
    assert trajectory_of(single(**fields), Request(headers)) == want


def test_an_in_process_caller_without_an_http_request_is_read_from_the_object():
    assert trajectory_of(single(routing_key="rk"), None) == "rk"
    assert trajectory_of(GenerateReqInput(text="hi", session_id="s"), None) == "s"
    assert trajectory_of(single(), None) is None


@pytest.mark.parametrize("obj", [
    GenerateReqInput(text=["a", "b"], routing_key="rk"),
    GenerateReqInput(input_ids=[[1, 2], [3]], session_id="s"),
    GenerateReqInput(text="a", sampling_params={"n": 2}, routing_key="rk"),
    GenerateReqInput(input_embeds=[[0.1, 0.2]], routing_key="rk"),
])
def test_a_batch_carries_no_trajectory(obj):
    """A trajectory is one request at a time: several prompts or samples under one id would be concurrent arrivals of
    one trajectory, which the tracker rejects; the header does not make a batch one either."""
    assert trajectory_of(obj, Request({"X-Trajectory-Id": "h"})) is None


def test_a_mistyped_field_from_an_in_process_caller_is_skipped():
    obj = single()
    obj.session_id = 5  # no validation in-process
    obj.routing_key = ["a", "b"]
    assert trajectory_of(obj, Request({"X-SMG-Routing-Key": "smg"})) == "smg"


def scope(headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "headers": headers}


def test_the_middleware_moves_a_usable_body_id_into_the_header():
    body, sc = _move_trajectory_id(b'{"text": "a", "trajectory_id": "b"}', scope([(b"x-trajectory-id", b"h")]))
    assert orjson.loads(body) == {"text": "a"}
    assert sc["headers"] == [(b"x-trajectory-id", b"b"), (b"content-length", str(len(body)).encode())]


@pytest.mark.parametrize("bad", [5, "", "x" * 10_000, None])
def test_an_unusable_body_id_is_dropped_and_the_header_kept(bad):
    """As the front reads it (engine_api.trajectory_id_of skips it): the instance then reads the same id."""
    raw = orjson.dumps({"text": "a", "trajectory_id": bad})
    body, sc = _move_trajectory_id(raw, scope([(b"x-trajectory-id", b"h"), (b"content-length", b"99")]))
    assert orjson.loads(body) == {"text": "a"}
    assert sc["headers"] == [(b"x-trajectory-id", b"h"), (b"content-length", str(len(body)).encode())]


def test_an_id_carried_in_custom_params_is_read_and_taken_out_before_the_scheduler():
    """verl's agent loop can pass nothing but the sampling parameters to its in-process engine: the id rides in
    ``custom_params`` (after SGLang's own fields and our field in the precedence), and the scheduler then sees the
    caller's parameters exactly -- ``custom_params`` removed where only the id was in it, kept with its other keys."""
    alone = single()
    alone.sampling_params = {"max_new_tokens": 2, "custom_params": {"prorsa_trajectory_id": "verl-1"}}
    assert trajectory_of(alone, None) == "verl-1"
    assert alone.sampling_params == {"max_new_tokens": 2}
    shared = single()
    shared.sampling_params = {"custom_params": {"prorsa_trajectory_id": "verl-2", "bias": 3}}
    assert trajectory_of(shared, Request({"X-Trajectory-Id": "h"})) == "verl-2"  # before our header
    assert shared.sampling_params == {"custom_params": {"bias": 3}}
    named = single(routing_key="rk")
    named.sampling_params = {"custom_params": {"prorsa_trajectory_id": "verl-3"}}
    assert trajectory_of(named, None) == "rk" and named.sampling_params == {}
    batch = GenerateReqInput(input_ids=[[1, 2], [3]], sampling_params=[
        {"custom_params": {"prorsa_trajectory_id": "a"}}, {"custom_params": {"prorsa_trajectory_id": "b"}}])
    assert trajectory_of(batch, None) is None and batch.sampling_params == [{}, {}]  # stripped all the same
