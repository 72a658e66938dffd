"""The SDK's hints against the real standalone control plane (``python -m sglang_prorsa.control_plane``): a trainer's
dry run, with the engine's events posted over HTTP as the control plane allows for replay."""

from __future__ import annotations

import asyncio

from sglang_prorsa.client import AsyncProrsaClient, HintConfig, ProrsaClient


def engine_turn(client, tid: str, prompt: int) -> None:
    """What an engine reports for one request (no engine here)."""
    client.hint(tid, "request_arrived", prompt_tokens=prompt, instance="0")
    client.hint(tid, "prefill_start", instance="0")
    client.hint(tid, "prefill_end", instance="0")
    client.hint(tid, "decode_end")


def test_hints_arrive_and_the_forecast_sees_the_trajectories(control_plane):
    with ProrsaClient(control_plane.url) as client:
        before = client.lifecycle_status()
        trajs = [client.trajectory(task="swe", group_id="g0", prompt_tokens=100 + i) for i in range(6)]
        for t in trajs:
            t.__enter__()
            with t.sandbox("prewarm"):
                pass
            engine_turn(client, t.trajectory_id, t.context_tokens)
            t.tool_start("bash")
        assert client.flush_hints(10)
        mid = client.forecast()
        status = client.lifecycle_status()
        for t in trajs:
            t.tool_end(result_tokens=20)
            t.reward_start()
            t.reward_end(accepted=True)
        assert client.flush_hints(10)
        after = client.lifecycle_status()
        stats = client.hint_stats

    assert mid["live_trajectories"] == 6 and mid["states"]["tool"] == 6
    assert status["states"]["tool"] == 6 and status["live_trajectories"] == 6
    sent_per_traj = 4 + 4 + 3  # sampled, sandbox x2, tool_start; engine x4; tool_end, reward x2
    assert stats.sent == 6 * sent_per_traj and stats.failed == 0 and stats.rejected == 0
    applied = after["events"]["applied"] - before["events"]["applied"]
    assert applied == 6 * sent_per_traj
    assert after["rejected_events"] == before["rejected_events"]
    assert after["finished_trajectories"] - before["finished_trajectories"] == 6
    assert after["live_trajectories"] == 0


def test_async_client_hints_arrive(control_plane):
    async def main():
        async with AsyncProrsaClient(control_plane.url, hints=HintConfig(flush_interval_s=0.001)) as client:
            before = await client.lifecycle_status()

            async def member(t):
                with t.sandbox("cold"):
                    await asyncio.sleep(0.01)
                client.hint(t.trajectory_id, "request_arrived", prompt_tokens=50)
                return t.trajectory_id

            ids = await client.run_group(4, member, task="math", group_id="ga")
            await client.flush_hints(10)
            after = await client.lifecycle_status()
            return ids, before, after, client.hint_stats

    ids, before, after, stats = asyncio.run(main())
    assert ids == ["ga-0", "ga-1", "ga-2", "ga-3"]
    # sampled, sandbox_start, sandbox_ready, request_arrived, aborted (left without a reward)
    assert stats.sent == 4 * 5 and stats.failed == 0
    assert after["events"]["applied"] - before["events"]["applied"] == 20
    assert after["rejected_events"] == before["rejected_events"]


def test_a_bad_hint_fails_at_the_call_not_later(control_plane):
    import pytest

    from sglang_prorsa.client import HintError

    with ProrsaClient(control_plane.url) as client:
        with pytest.raises(HintError) as info:
            client.hint("t", "request_arrived")  # prompt_tokens is required on request_arrived
        assert info.value.field == "prompt_tokens"
        assert client.hint_stats.enqueued == 0
