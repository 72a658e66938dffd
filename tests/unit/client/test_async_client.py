"""AsyncProrsaClient against a scriptable local server: the same guarantees on an event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sglang_prorsa.client import AsyncProrsaClient, GroupError, HintConfig, ProrsaClientError, ProrsaHTTPError


async def wait_for(predicate, what: str, limit_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not predicate():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.005)


def kinds(events):
    return [e["event"] for e in events]


def test_trajectory_generate_and_hints(fake):
    async def main():
        async with AsyncProrsaClient(fake.url) as client:
            async with client.trajectory(task="swe", prompt_tokens=2, trajectory_id="a1") as t:
                with t.sandbox("prewarm"):
                    await asyncio.sleep(0)
                g = await t.generate([4, 5], max_new_tokens=2)
                with t.tool("search") as call:
                    call.result_tokens = 10
                with t.reward():
                    pass
            await client.flush_hints(10)
            return g, client.hint_stats

    g, stats = asyncio.run(main())
    assert g.output_ids == [6, 7] and g.output_logprobs == [-0.125, -0.25]
    assert fake.state.generate_headers[0]["X-Trajectory-Id"] == "a1"
    events = fake.state.events
    assert kinds(events) == ["sampled", "sandbox_start", "sandbox_ready", "tool_start", "tool_end", "reward_start",
                             "reward_end"]
    assert events[4]["prompt_tokens"] == 2 + 2 + 10
    assert (stats.sent, stats.failed) == (7, 0)


def test_cancellation_and_exceptions_abort(fake):
    async def main():
        async with AsyncProrsaClient(fake.url) as client:
            with pytest.raises(KeyError):
                async with client.trajectory(trajectory_id="x"):
                    raise KeyError("boom")

            async def forever():
                async with client.trajectory(trajectory_id="y"):
                    await asyncio.sleep(3600)

            task = asyncio.create_task(forever())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.flush_hints(10)

    asyncio.run(main())
    by_id = {}
    for e in fake.state.events:
        by_id.setdefault(e["trajectory_id"], []).append(e["event"])
    assert by_id == {"x": ["sampled", "aborted"], "y": ["sampled", "aborted"]}


def test_http_error(fake):
    async def main():
        async with AsyncProrsaClient(fake.url) as client:
            await client.generate([1], max_new_tokens=999)

    with pytest.raises(ProrsaHTTPError) as info:
        asyncio.run(main())
    assert info.value.status == 422 and info.value.field == "sampling_params.max_new_tokens"


def test_a_hung_hint_endpoint_does_not_hold_generation(fake):
    fake.state.lifecycle_gate = threading.Event()

    async def main():
        async with AsyncProrsaClient(fake.url) as client:
            async with client.trajectory() as t:
                await wait_for(lambda: fake.state.lifecycle_calls == 1, "the sampled hint reached the server")
                outs = [(await t.generate([i], max_new_tokens=1)).output_ids for i in range(3)]
                assert fake.state.lifecycle_answered == 0
                fake.state.lifecycle_gate.set()
            return outs

    assert asyncio.run(main()) == [[1], [2], [3]]


def test_retries_then_delivery_and_bounded_drop(fake, dead_url):
    fake.state.lifecycle_statuses = [503, 503]

    async def main():
        cfg = HintConfig(flush_interval_s=60, backoff_base_s=0.001)
        async with AsyncProrsaClient(fake.url, hints=cfg) as client:
            for i in range(5):
                client.hint(f"t{i}", "sampled")
            assert await client.flush_hints(10)
            ok = client.hint_stats
        cfg = HintConfig(max_attempts=2, backoff_base_s=0.001)
        async with AsyncProrsaClient(fake.url, hints_url=dead_url, hints=cfg) as client:
            g = await client.generate([1], max_new_tokens=1)
            client.hint("z", "sampled")
            await client.flush_hints(10)
            dead = client.hint_stats
        return ok, g, dead

    ok, g, dead = asyncio.run(main())
    assert (ok.retries, ok.sent, ok.batches) == (2, 5, 1)
    assert g.output_ids == [2] and (dead.failed, dead.retries, dead.sent) == (1, 1, 0)


def test_buffer_bound(fake):
    fake.state.lifecycle_gate = threading.Event()

    async def main():
        async with AsyncProrsaClient(fake.url, hints=HintConfig(capacity=4, flush_interval_s=0)) as client:
            client.hint("first", "sampled")
            await wait_for(lambda: fake.state.lifecycle_calls == 1, "first batch in flight")
            for i in range(10):
                client.hint(f"t{i}", "sampled")
            stats = client.hint_stats
            fake.state.lifecycle_gate.set()
            await client.flush_hints(10)
            return stats

    stats = asyncio.run(main())
    assert (stats.dropped_overflow, stats.pending) == (6, 5)
    assert [e["trajectory_id"] for e in fake.state.events] == ["first", "t6", "t7", "t8", "t9"]


def test_run_group(fake):
    async def member(t):
        return (await t.generate([len(t.trajectory_id)], max_new_tokens=1)).output_ids[0]

    async def failing(t):
        raise RuntimeError(t.trajectory_id)

    async def main():
        async with AsyncProrsaClient(fake.url) as client:
            out = await client.run_group(3, member, group_id="AB")
            with pytest.raises(GroupError) as info:
                await client.run_group(2, failing, group_id="C")
            await client.flush_hints(10)
            return out, info.value

    out, err = asyncio.run(main())
    assert out == [5, 5, 5] and sorted(err.errors) == [0, 1]


def test_hint_outside_a_running_loop_is_a_clear_error(fake):
    client = AsyncProrsaClient(fake.url)
    with pytest.raises(ProrsaClientError, match="running event loop"):
        client.hint("t", "sampled")


def test_order_timeout_delivers_earlier_hints_before_the_request(fake):
    async def main():
        cfg = HintConfig(order_timeout_s=10, flush_interval_s=60)
        async with AsyncProrsaClient(fake.url, hints=cfg) as client:
            async with client.trajectory() as t:
                await t.generate([1], max_new_tokens=1)
                with t.tool("bash"):
                    pass
                await t.generate([2], max_new_tokens=1)

    asyncio.run(main())
    assert fake.state.events_seen_by_generate == [1, 3]
