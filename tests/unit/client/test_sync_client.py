"""ProrsaClient against a scriptable local server: generation, hint batching, retries, bounds and outages."""

from __future__ import annotations

import threading
import time

import pytest

from sglang_prorsa.client import (
    GroupError,
    HintConfig,
    HintError,
    InvalidArgument,
    ProrsaClient,
    ProrsaConnectionError,
    ProrsaHTTPError,
)


def wait_for(predicate, what: str, limit_s: float = 20.0) -> None:
    """Wait for a condition (not a timing assertion: the limit only keeps a broken test from hanging)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def kinds(events):
    return [e["event"] for e in events]


def test_generate_carries_the_trajectory_header_and_returns_ids_and_logprobs(fake):
    with ProrsaClient(fake.url) as client:
        with client.trajectory(task="swe", trajectory_id="traj-1") as t:
            g = t.generate([5, 6, 7], max_new_tokens=3, temperature=0)
    assert g.output_ids == [8, 9, 10] and g.output_logprobs == [-0.125, -0.25, -0.375]
    assert g.trajectory_id == "traj-1" and g.text == "8 9 10" and g.cached_tokens == 1
    assert fake.state.generate_headers[0]["X-Trajectory-Id"] == "traj-1"
    body = fake.state.generate_bodies[0]
    assert "trajectory_id" not in body and body["return_logprob"] is True
    assert body["sampling_params"] == {"max_new_tokens": 3, "temperature": 0.0}


def test_generate_without_trajectory_sends_no_header(fake):
    with ProrsaClient(fake.url) as client:
        client.generate(text="hello", max_new_tokens=1, return_logprob=False)
    assert "X-Trajectory-Id" not in fake.state.generate_headers[0]
    assert fake.state.batches == []


def test_server_error_keeps_status_message_and_field(fake):
    with ProrsaClient(fake.url) as client, pytest.raises(ProrsaHTTPError) as info:
        client.generate([1], max_new_tokens=999)
    assert info.value.status == 422 and info.value.field == "sampling_params.max_new_tokens"
    assert "too many for this test" in str(info.value) and "/generate" in str(info.value)


def test_no_server_is_a_connection_error(dead_url):
    with ProrsaClient(dead_url) as client, pytest.raises(ProrsaConnectionError, match="no answer"):
        client.generate([1], max_new_tokens=1)


def test_bad_url_names_the_field():
    with pytest.raises(InvalidArgument, match="'url'"):
        ProrsaClient("127.0.0.1:30000")


def test_trajectory_sends_each_hint_once_in_order_with_turns_and_prompt_estimates(fake):
    with ProrsaClient(fake.url) as client:
        with client.trajectory(task="swe", group_id="g", prompt_tokens=3, trajectory_id="t1") as t:
            with t.sandbox("cold"):
                pass
            t.generate([1, 2, 3], max_new_tokens=4)
            with t.tool("bash") as call:
                call.result_tokens = 5
            with t.reward() as r:
                r.accepted = True
        assert client.flush_hints(10)
        stats = client.hint_stats
    events = fake.state.events
    assert kinds(events) == ["sampled", "sandbox_start", "sandbox_ready", "tool_start", "tool_end", "reward_start",
                             "reward_end"]
    assert all(e["trajectory_id"] == "t1" and e["task"] == "swe" and e["group_id"] == "g" for e in events)
    assert [e["turn"] for e in events] == [0, 0, 0, 1, 1, 1, 1]
    assert events[0]["prompt_tokens"] == 3 and events[1]["mode"] == "cold" and events[3]["tool"] == "bash"
    assert events[4]["prompt_tokens"] == 3 + 4 + 5  # prompt + output + tool result
    assert events[6]["accepted"] is True
    assert all(isinstance(e["ts"], float) for e in events)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    assert (stats.enqueued, stats.sent, stats.failed, stats.pending) == (7, 7, 0, 0)


def test_exception_in_the_block_sends_aborted_and_propagates(fake):
    with ProrsaClient(fake.url) as client:
        with pytest.raises(RuntimeError, match="tool crashed"):
            with client.trajectory(trajectory_id="t2") as t:
                with t.tool("bash"):
                    raise RuntimeError("tool crashed")
        client.flush_hints(10)
    assert kinds(fake.state.events) == ["sampled", "tool_start", "tool_end", "aborted"]


def test_leaving_without_reward_aborts_and_later_hints_are_refused(fake):
    with ProrsaClient(fake.url) as client:
        with client.trajectory(trajectory_id="t3") as t:
            pass
        with pytest.raises(HintError, match="has finished"):
            t.tool_start("bash")
        client.flush_hints(10)
    assert kinds(fake.state.events) == ["sampled", "aborted"]


def test_transient_errors_are_retried_and_every_hint_arrives_once(fake):
    fake.state.lifecycle_statuses = [503, 500]
    cfg = HintConfig(flush_interval_s=60, backoff_base_s=0.001)
    with ProrsaClient(fake.url, hints=cfg) as client:
        for i in range(10):
            client.hint(f"t{i}", "sampled")
        assert client.flush_hints(10)  # one batch: the window is long, flush sends it at once
        stats = client.hint_stats
    assert sorted(e["trajectory_id"] for e in fake.state.events) == sorted(f"t{i}" for i in range(10))
    assert fake.state.lifecycle_calls == 3
    assert (stats.retries, stats.sent, stats.batches, stats.failed) == (2, 10, 1, 0)


def test_retries_are_bounded_then_the_batch_is_dropped_and_counted(fake):
    fake.state.lifecycle_statuses = [503] * 10
    cfg = HintConfig(flush_interval_s=60, max_attempts=3, backoff_base_s=0.001)
    with ProrsaClient(fake.url, hints=cfg) as client:
        for i in range(4):
            client.hint(f"t{i}", "sampled")
        assert client.flush_hints(10)
        stats = client.hint_stats
    assert fake.state.lifecycle_calls == 3
    assert (stats.retries, stats.failed, stats.sent) == (2, 4, 0)
    assert "HTTP 503" in stats.last_error and "scripted 503" in stats.last_error


def test_validation_rejection_is_not_retried(fake):
    fake.state.lifecycle_statuses = [422]
    cfg = HintConfig(flush_interval_s=60)
    with ProrsaClient(fake.url, hints=cfg) as client:
        client.hint("t", "sampled")
        client.flush_hints(10)
        stats = client.hint_stats
    assert fake.state.lifecycle_calls == 1 and (stats.rejected, stats.retries) == (1, 0)


def test_missing_lifecycle_route_disables_hints_but_not_generation(fake):
    fake.state.lifecycle_statuses = [404]
    with ProrsaClient(fake.url) as client:
        with client.trajectory() as t:
            client.flush_hints(10)
            g = t.generate([1], max_new_tokens=2)
        client.flush_hints(10)
        stats = client.hint_stats
    assert g.output_ids == [2, 3]
    assert fake.state.lifecycle_calls == 1 and (stats.unsupported, stats.enqueued, stats.sent) == (2, 2, 0)


def test_a_hung_hint_endpoint_does_not_hold_generation(fake):
    fake.state.lifecycle_gate = threading.Event()
    with ProrsaClient(fake.url) as client:
        with client.trajectory() as t:
            wait_for(lambda: fake.state.lifecycle_calls == 1, "the sampled hint reached the server")
            g = t.generate([10], max_new_tokens=2)
            with t.tool("bash"):
                pass
            g2 = t.generate([11], max_new_tokens=1)
            assert fake.state.lifecycle_answered == 0  # the hint POST is still hanging
            fake.state.lifecycle_gate.set()
        assert client.flush_hints(10)
    assert g.output_ids == [11, 12] and g2.output_ids == [12]
    assert kinds(fake.state.events) == ["sampled", "tool_start", "tool_end", "aborted"]


def test_a_dead_hint_endpoint_does_not_stop_generation(fake, dead_url):
    cfg = HintConfig(max_attempts=2, backoff_base_s=0.001, close_timeout_s=10)
    with ProrsaClient(fake.url, hints_url=dead_url, hints=cfg) as client:
        with client.trajectory() as t:
            outs = [t.generate([i], max_new_tokens=1).output_ids for i in range(3)]
        client.flush_hints(10)
        stats = client.hint_stats
    assert outs == [[1], [2], [3]]
    assert stats.failed == 2 and stats.sent == 0 and "ConnectionError" in stats.last_error


def test_buffer_bound_while_the_endpoint_hangs(fake):
    fake.state.lifecycle_gate = threading.Event()
    cfg = HintConfig(capacity=5, flush_interval_s=0)
    with ProrsaClient(fake.url, hints=cfg) as client:
        client.hint("first", "sampled")
        wait_for(lambda: fake.state.lifecycle_calls == 1, "the first batch is in flight")
        for i in range(20):
            client.hint(f"t{i}", "sampled")  # never blocks, never raises
        stats = client.hint_stats
        assert (stats.dropped_overflow, stats.pending) == (15, 6)
        fake.state.lifecycle_gate.set()
        assert client.flush_hints(10)
    assert [e["trajectory_id"] for e in fake.state.events] == ["first"] + [f"t{i}" for i in range(15, 20)]


def test_error_policy_refuses_when_full(fake):
    fake.state.lifecycle_gate = threading.Event()
    cfg = HintConfig(capacity=2, overflow="error", flush_interval_s=0)
    from sglang_prorsa.client import HintBufferFull

    with ProrsaClient(fake.url, hints=cfg) as client:
        client.hint("first", "sampled")
        wait_for(lambda: fake.state.lifecycle_calls == 1, "the first batch is in flight")
        client.hint("a", "sampled")
        client.hint("b", "sampled")
        with pytest.raises(HintBufferFull):
            client.hint("c", "sampled")
        fake.state.lifecycle_gate.set()


def test_run_group_runs_members_concurrently_with_one_group_id(fake):
    barrier = threading.Barrier(4, timeout=20)

    def member(t):
        barrier.wait()  # all four are inside their trajectories at once
        return t.generate([len(t.trajectory_id)], max_new_tokens=1).output_ids

    with ProrsaClient(fake.url) as client:
        out = client.run_group(4, member, task="math", group_id="G")
        client.flush_hints(10)
    assert out == [[4]] * 4
    sampled = [e for e in fake.state.events if e["event"] == "sampled"]
    assert sorted(e["trajectory_id"] for e in sampled) == ["G-0", "G-1", "G-2", "G-3"]
    assert {e["group_id"] for e in sampled} == {"G"}


def test_run_group_reports_failed_members(fake):
    def member(t):
        if t.trajectory_id.endswith("-2"):
            raise ValueError("bad sandbox")
        return 1

    with ProrsaClient(fake.url) as client:
        with pytest.raises(GroupError) as info:
            client.run_group(3, member, group_id="G")
        assert client.run_group(3, member, group_id="H", return_exceptions=True)[:2] == [1, 1]
        client.flush_hints(10)
    assert list(info.value.errors) == [2] and info.value.results == [1, 1, None]
    aborted = sorted(e["trajectory_id"] for e in fake.state.events if e["event"] == "aborted")
    assert aborted == ["G-0", "G-1", "G-2", "H-0", "H-1", "H-2"]


def test_control_routes(fake):
    with ProrsaClient(fake.url) as client:
        assert client.update_weights_from_disk("/m", weight_version="v2")["success"] is True
        assert "prorsa_busy_seconds_total" in client.metrics()
    assert fake.state.weights == [{"model_path": "/m", "weight_version": "v2"}]


def test_report_requests_adds_the_engine_side_of_each_request(fake):
    with ProrsaClient(fake.url, hints=HintConfig(report_requests=True)) as client:
        with client.trajectory(trajectory_id="r1") as t:
            t.generate([1, 2, 3], max_new_tokens=2)
            t.generate(text="twelve bytes", max_new_tokens=2)
        client.flush_hints(10)
    events = fake.state.events
    assert kinds(events) == ["sampled", "request_arrived", "prefill_end", "decode_end",
                             "request_arrived", "prefill_end", "decode_end", "aborted"]
    assert events[1]["prompt_tokens"] == 3 and events[4]["prompt_tokens"] == 3  # 12 bytes / 4


def test_http_sessions_are_pooled_across_threads(fake):
    with ProrsaClient(fake.url) as client:
        for _ in range(3):  # each run_group uses fresh threads
            client.run_group(4, lambda t: t.generate([1], max_new_tokens=1))
        assert 1 <= len(client._idle) <= 4  # bounded by the peak concurrency, not by the threads ever seen


def test_hints_after_close_are_refused(fake):
    from sglang_prorsa.client import ProrsaClientError

    client = ProrsaClient(fake.url)
    client.close()
    with pytest.raises(ProrsaClientError, match="closed"):
        client.hint("t", "sampled")


def test_order_timeout_delivers_earlier_hints_before_the_request(fake):
    cfg = HintConfig(order_timeout_s=10, flush_interval_s=60)  # a long window: only the ordering wait sends early
    with ProrsaClient(fake.url, hints=cfg) as client:
        with client.trajectory(trajectory_id="o1") as t:
            t.generate([1], max_new_tokens=1)
            with t.tool("bash"):
                pass
            t.generate([2], max_new_tokens=1)
    assert fake.state.events_seen_by_generate == [1, 3]  # sampled; then tool_start and tool_end too


def test_order_timeout_is_bounded_when_the_endpoint_hangs(fake):
    fake.state.lifecycle_gate = threading.Event()
    cfg = HintConfig(order_timeout_s=0.05)
    with ProrsaClient(fake.url, hints=cfg) as client:
        with client.trajectory() as t:
            g = t.generate([5], max_new_tokens=1)
            assert fake.state.lifecycle_answered == 0
            fake.state.lifecycle_gate.set()
    assert g.output_ids == [6]
