"""slime's hook points with hints (``integrations/slime.py``), against a loopback stand-in for the front: the exact
hints, in order, and the header on every ``/generate``, with a fake slime ``Sample`` (slime is not installed)."""

from __future__ import annotations

import asyncio
import enum
import inspect
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from unit_support import StandInFront, loopback_upstream

from sglang_prorsa.integrations.slime import (
    META_KEY,
    SlimeHints,
    current_trajectory,
    post_generate,
    trajectory_headers,
)


class Status(enum.Enum):  # slime.utils.types.Sample.Status
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


@dataclass
class Sample:  # the fields of slime's Sample the hooks read
    index: int
    group_index: int | None = 0
    session_id: str | None = None
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    status: Status = Status.PENDING
    reward: Any = None
    metadata: dict = field(default_factory=dict)


class Front(StandInFront):
    def seen(self) -> list[tuple]:
        return [(e["trajectory_id"], e["event"], e.get("turn"), e.get("prompt_tokens"), e.get("group_id"))
                for e in self.events]


def run(scenario) -> Front:
    """``scenario(args, hints)`` on a fresh loop with a stand-in front as slime's router; every hint delivered."""
    front = Front()

    async def main() -> None:
        async with loopback_upstream(front.routes()) as url:
            host, port = url.removeprefix("http://").split(":")
            args = SimpleNamespace(sglang_router_ip=host, sglang_router_port=int(port))
            hints = SlimeHints(task="swe")
            await scenario(args, hints)
            assert await hints.flush(10)
            assert hints.live == {}

    asyncio.run(main())
    return front


async def agent(args, sample, sampling_params, evaluation=False):
    """A two-turn agent with a tool between the turns, as a slime custom generate function is written."""
    for turn in range(2):
        out = await post_generate(args, {"input_ids": sample.tokens, "sampling_params": sampling_params})
        sample.tokens = sample.tokens + out["output_ids"]
        if turn == 0:
            with current_trajectory().tool("bash") as call:
                call.result_tokens = 5
            sample.tokens = sample.tokens + [7] * 5
    sample.status = Status.COMPLETED
    return sample


async def score(args, sample, **kwargs):
    return 1.0 if sample.status is Status.COMPLETED else 0.0


def test_a_multi_turn_sample_sends_its_lifecycle_and_the_header_on_every_generate():
    sample = Sample(index=0, group_index=3, session_id="s-1", tokens=[1, 2, 3, 4])

    async def scenario(args, hints):
        generate, reward = hints.generate(agent), hints.reward(score)
        assert "evaluation" in inspect.signature(generate).parameters  # slime inspects it to pass evaluation=
        assert await generate(args, sample, {"max_new_tokens": 2}, evaluation=False) is sample
        sample.reward = await reward(args, sample)

    front = run(scenario)
    assert front.generate_headers == ["s-1", "s-1"]
    assert front.seen() == [("s-1", "sampled", 0, 4, "3"), ("s-1", "tool_start", 1, None, "3"),
                            ("s-1", "tool_end", 1, 4 + 2 + 5, "3"), ("s-1", "reward_start", 2, None, "3"),
                            ("s-1", "reward_end", 2, None, "3")]
    assert {e["task"] for e in front.events} == {"swe"}
    assert (sample.reward, sample.metadata) == (1.0, {META_KEY: "s-1"})
    assert "slime" not in sys.modules


def test_cancelled_raising_or_aborted_samples_send_aborted_and_a_retried_sample_is_a_new_trajectory():
    cancelled, raising, aborted = (Sample(index=i, session_id=f"s-{i}", tokens=[1]) for i in range(3))

    async def stuck(args, sample, sampling_params):
        await asyncio.sleep(3600)

    async def broken(args, sample, sampling_params):
        raise RuntimeError("sandbox died")

    async def abort(args, sample, sampling_params):
        assert trajectory_headers() == {"X-Trajectory-Id": sample.metadata[META_KEY]}
        sample.status = Status.ABORTED  # what slime's generate does when the engine answers finish_reason abort
        return sample

    async def scenario(args, hints):
        task = asyncio.create_task(hints.generate(stuck)(args, cancelled, {}))
        await asyncio.sleep(0.05)
        task.cancel()  # slime's abort(): pending samples are cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(RuntimeError, match="sandbox died"):
            await hints.generate(broken)(args, raising, {})
        await hints.generate(abort)(args, aborted, {})
        aborted.status = Status.PENDING  # partial rollout: the aborted sample is generated again next rollout
        await hints.generate(agent)(args, aborted, {"max_new_tokens": 1})
        await hints.reward(score)(args, aborted)

    front = run(scenario)
    retry = aborted.metadata[META_KEY]
    assert retry.startswith("slime-") and retry != "s-2"
    assert [(t, e) for t, e, *_ in front.seen()] == [
        ("s-0", "sampled"), ("s-0", "aborted"), ("s-1", "sampled"), ("s-1", "aborted"), ("s-2", "sampled"),
        ("s-2", "aborted"), (retry, "sampled"), (retry, "tool_start"), (retry, "tool_end"), (retry, "reward_start"),
        (retry, "reward_end")]
    assert front.generate_headers == [retry, retry]


def test_a_group_reward_and_a_reward_set_inside_generate_end_every_trajectory():
    group = [Sample(index=i, group_index=9, session_id=f"g-{i}", tokens=[1, 2]) for i in range(2)]
    rewarded = Sample(index=5, session_id="r", tokens=[1])

    async def one_turn(args, sample, sampling_params):
        await post_generate(args, {"input_ids": sample.tokens, "sampling_params": sampling_params})
        sample.status = Status.COMPLETED
        return sample

    async def judged(args, sample, sampling_params):
        sample.reward = 0.5  # custom generate functions may fill the reward; slime then skips the reward function
        return sample

    async def group_rm(args, samples, **kwargs):  # --group-rm: the reward function gets the whole group
        return [float(s.index) for s in samples]

    async def scenario(args, hints):
        for s in group:
            await hints.generate(one_turn)(args, s, {"max_new_tokens": 3})
        assert await hints.reward(group_rm)(args, group) == [0.0, 1.0]
        await hints.generate(judged)(args, rewarded, {})

    front = run(scenario)
    assert [(t, e) for t, e, *_ in front.seen()] == [
        ("g-0", "sampled"), ("g-1", "sampled"), ("g-0", "reward_start"), ("g-1", "reward_start"), ("g-0", "reward_end"),
        ("g-1", "reward_end"), ("r", "sampled"), ("r", "reward_start"), ("r", "reward_end")]
    assert front.generate_headers == ["g-0", "g-1"]


def test_outside_a_wrapped_generate_there_is_no_trajectory():
    assert trajectory_headers() == {}
    with pytest.raises(LookupError, match="inside a SlimeHints.generate wrapper"):
        current_trajectory()
