"""The hint buffer, its configuration and the delivery rules (pure; no server)."""

from __future__ import annotations

import pytest

from sglang_prorsa.client.errors import HintBufferFull, HintError, InvalidArgument
from sglang_prorsa.client.hints import HintBuffer, HintConfig, HintStats, classify, make_event


def _buffer(capacity: int, overflow: str = "drop_oldest") -> HintBuffer:
    return HintBuffer(HintConfig(capacity=capacity, overflow=overflow), HintStats())


def _event(i: int) -> dict:
    return make_event(f"t{i}", "sampled", {}, ts=100.0 + i)


def test_drop_oldest_keeps_the_newest_and_counts_the_rest():
    buf = _buffer(5)
    for i in range(20):
        buf.put(_event(i))
    assert len(buf) == 5
    assert buf.stats.dropped_overflow == 15
    assert buf.stats.enqueued == 20
    assert [e["trajectory_id"] for e in buf.take(100)] == ["t15", "t16", "t17", "t18", "t19"]


def test_error_policy_refuses_the_new_hint_and_keeps_the_old():
    buf = _buffer(3, overflow="error")
    for i in range(3):
        buf.put(_event(i))
    with pytest.raises(HintBufferFull, match="3 events waiting"):
        buf.put(_event(3))
    assert buf.stats.enqueued == 3 and buf.stats.dropped_overflow == 0
    assert [e["trajectory_id"] for e in buf.take(10)] == ["t0", "t1", "t2"]


def test_pending_counts_waiting_and_in_flight_until_settled():
    buf = _buffer(10)
    for i in range(4):
        buf.put(_event(i))
    batch = buf.take(3)
    assert len(batch) == 3 and buf.stats.pending == 4 and not buf.drained
    buf.settle(3, "ok")
    assert buf.stats.pending == 1 and buf.stats.sent == 3 and buf.stats.batches == 1
    buf.take(10)
    buf.settle(1, "failed", "boom")
    assert buf.drained and buf.stats.failed == 1 and buf.stats.last_error == "boom"


def test_unsupported_disables_the_buffer_and_counts_everything_after():
    buf = _buffer(10)
    for i in range(3):
        buf.put(_event(i))
    buf.take(1)
    buf.settle(1, "unsupported", "404")
    assert buf.stats.unsupported == 3 and len(buf) == 0
    buf.put(_event(9))
    assert buf.stats.unsupported == 4 and buf.stats.enqueued == 4 and len(buf) == 0


def test_abandon_counts_waiting_events_as_failed():
    buf = _buffer(10)
    for i in range(6):
        buf.put(_event(i))
    assert buf.abandon("closing") == 6
    assert buf.stats.failed == 6 and buf.stats.pending == 0


@pytest.mark.parametrize("status,outcome", [(200, "ok"), (204, "ok"), (408, "retry"), (429, "retry"),
                                            (500, "retry"), (503, "retry"), (404, "unsupported"),
                                            (400, "rejected"), (413, "rejected"), (422, "rejected")])
def test_classify(status, outcome):
    assert classify(status) == outcome


def test_backoff_doubles_up_to_the_cap():
    cfg = HintConfig(backoff_base_s=0.1, backoff_max_s=0.5)
    assert [cfg.backoff_s(k) for k in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]


@pytest.mark.parametrize("kwargs,field", [({"capacity": 0}, "capacity"), ({"max_batch": 10_001}, "max_batch"),
                                          ({"overflow": "block"}, "overflow"), ({"max_attempts": True}, "max_attempts"),
                                          ({"flush_interval_s": -1}, "flush_interval_s"),
                                          ({"request_timeout_s": 0}, "request_timeout_s"),
                                          ({"order_timeout_s": -0.1}, "order_timeout_s"),
                                          ({"report_requests": 1}, "report_requests")])
def test_config_names_the_bad_field(kwargs, field):
    with pytest.raises(InvalidArgument) as info:
        HintConfig(**kwargs)
    assert info.value.field == field and f"'{field}'" in str(info.value)


def test_make_event_stamps_ts_and_drops_none_fields():
    e = make_event("t1", "tool_start", {"tool": "bash", "turn": 2, "task": None}, ts=5.0)
    assert e == {"trajectory_id": "t1", "event": "tool_start", "ts": 5.0, "tool": "bash", "turn": 2}


@pytest.mark.parametrize("event,fields,field", [("sandbox_start", {"mode": "warm"}, "mode"),
                                                ("sandbox_start", {}, "mode"),
                                                ("teleport", {}, "event"),
                                                ("tool_end", {"prompt_tokens": -3}, "prompt_tokens"),
                                                ("tool_start", {"colour": "red"}, "colour")])
def test_make_event_rejects_what_the_server_would(event, fields, field):
    with pytest.raises(HintError) as info:
        make_event("t1", event, fields)
    assert info.value.field == field
    assert str(info.value).startswith(f"field '{field}'")
