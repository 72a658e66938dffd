"""Error bodies of every server we talk to become one message and the field it names."""

from __future__ import annotations

import pytest

from sglang_prorsa.client.errors import GroupError, ProrsaHTTPError, error_message


@pytest.mark.parametrize("body,message,field", [
    ('{"error": "event 3, field \'mode\': bad", "index": 3, "field": "mode"}', "event 3, field 'mode': bad", "mode"),
    ({"error": {"message": "Input length exceeds", "code": 400}}, "Input length exceeds", None),
    ({"object": "error", "message": "model not found"}, "model not found", None),
    ({"detail": [{"loc": ["body", "sampling_params", "n"], "msg": "must be int"}]},
     "field 'sampling_params.n': must be int", "sampling_params.n"),
    ({"detail": "Not Found"}, "Not Found", None),
    ("Internal Server Error", "Internal Server Error", None),
    ("", "(empty body)", None),
])
def test_error_message(body, message, field):
    assert error_message(body) == (message, field)


def test_http_error_says_status_route_and_message():
    e = ProrsaHTTPError("POST", "http://h/generate", 422, '{"error": "field \'x\': nope", "field": "x"}')
    assert (e.status, e.field, e.message) == (422, "x", "field 'x': nope")
    assert str(e) == "POST http://h/generate -> HTTP 422: field 'x': nope"


def test_group_error_reports_the_first_failed_member():
    e = GroupError("g1", {2: ValueError("b"), 1: KeyError("a")}, [1, None, None])
    assert "2 of 3 members failed; member 1: KeyError" in str(e)
