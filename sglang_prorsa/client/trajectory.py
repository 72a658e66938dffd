"""The trajectory context: one agentic episode, its lifecycle hints and its generations.

    with client.trajectory(task="swe", group_id="g1", prompt_tokens=1200) as t:   # sampled
        with t.sandbox("prewarm"):                                               # sandbox_start / sandbox_ready
            start_container()
        g = t.generate(input_ids=ids, max_new_tokens=256)                        # X-Trajectory-Id: t.trajectory_id
        with t.tool("bash") as call:                                             # tool_start / tool_end
            out = run(g.text)
            call.result_tokens = len(out_ids)     # tool_end carries the next prompt's length estimate
        with t.reward() as r:                                                    # reward_start / reward_end
            r.accepted = score(...) > 0

The hints are the trainer's side of the paper's trajectory state machine (§4.1.1); the engine reports request arrival,
prefill and decode itself from the ``X-Trajectory-Id`` header. Leaving the block on an exception sends ``aborted``;
leaving it normally before ``reward_end`` also sends ``aborted`` (the trajectory ended without a reward, so the server
stops forecasting it). Every hint is queued, never awaited (see ``hints.py``).

``turn`` on a hint is the number of generations the trajectory has made so far; ``prompt_tokens`` on ``sampled`` is
the trainer's estimate of the first prompt, on ``tool_end`` the estimate of the next prompt (context so far plus the
tool's result), which the forecast uses for the next prefill (paper Appendix B.3, B.5).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from sglang_prorsa.client.errors import HintError
from sglang_prorsa.client.generation import Generation

if TYPE_CHECKING:
    from sglang_prorsa.client.async_client import AsyncProrsaClient
    from sglang_prorsa.client.sync_client import ProrsaClient


def new_trajectory_id(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@dataclass
class ToolCall:
    """Handle of a ``with t.tool(...)`` block: set ``result_tokens`` to the tool output's length in tokens."""

    tool: str | None
    result_tokens: int | None = None


@dataclass
class RewardOutcome:
    """Handle of a ``with t.reward()`` block: set ``accepted`` (admitted to training) if you know it."""

    accepted: bool | None = None


class _TrajectoryHints:
    """The hint side shared by the sync and asyncio trajectories."""

    def __init__(self, client: Any, *, trajectory_id: str | None, task: str | None, group_id: str | None,
                 prompt_tokens: int | None) -> None:
        self._client = client
        self.trajectory_id = trajectory_id or new_trajectory_id()
        self.task = task
        self.group_id = group_id
        self.turn = 0
        self.context_tokens = prompt_tokens  # tokens of context so far, as far as the trainer knows
        self.generations: list[Generation] = []
        self.started = False
        self.finished = False

    # ----- explicit hints -----
    def sampled(self) -> None:
        self._send("sampled", prompt_tokens=self.context_tokens)
        self.started = True

    def sandbox_start(self, mode: str = "prewarm") -> None:
        self._send("sandbox_start", mode=mode)

    def sandbox_ready(self) -> None:
        self._send("sandbox_ready", prompt_tokens=self.context_tokens)

    def tool_start(self, tool: str | None = None) -> None:
        self._send("tool_start", tool=tool)

    def tool_end(self, result_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        """``prompt_tokens`` (the next prompt's length) defaults to the context so far plus ``result_tokens``."""
        if result_tokens is not None and self.context_tokens is not None:
            self.context_tokens += int(result_tokens)
        self._send("tool_end", prompt_tokens=self.context_tokens if prompt_tokens is None else prompt_tokens)

    def reward_start(self) -> None:
        self._send("reward_start")

    def reward_end(self, accepted: bool | None = None) -> None:
        self._send("reward_end", accepted=accepted)
        self.finished = True

    def abort(self) -> None:
        """End the trajectory without a reward (no-op once it has finished)."""
        if not self.finished:
            self._send("aborted")
            self.finished = True

    # ----- context helpers -----
    @contextlib.contextmanager
    def sandbox(self, mode: str = "prewarm") -> Iterator[None]:
        """``sandbox_start`` now, ``sandbox_ready`` when the block ends without an exception."""
        self.sandbox_start(mode)
        yield
        self.sandbox_ready()

    @contextlib.contextmanager
    def tool(self, name: str | None = None) -> Iterator[ToolCall]:
        """``tool_start`` now, ``tool_end`` when the block ends (also on an exception: the tool did end)."""
        call = ToolCall(name)
        self.tool_start(name)
        try:
            yield call
        finally:
            self.tool_end(result_tokens=call.result_tokens)

    @contextlib.contextmanager
    def reward(self) -> Iterator[RewardOutcome]:
        """``reward_start`` now, ``reward_end`` when the block ends without an exception."""
        outcome = RewardOutcome()
        self.reward_start()
        yield outcome
        self.reward_end(outcome.accepted)

    # ----- internals -----
    def _send(self, event: str, **fields: Any) -> None:
        if self.finished:
            raise HintError(f"trajectory {self.trajectory_id} has finished; no '{event}' after its end",
                            field="event")
        fields.setdefault("turn", self.turn)
        self._client.hint(self.trajectory_id, event, task=self.task, group_id=self.group_id, **fields)

    def _record(self, gen: Generation) -> Generation:
        self.turn += 1
        self.context_tokens = gen.context_tokens
        self.generations.append(gen)
        return gen

    def _enter(self) -> None:
        if self.started:
            raise HintError(f"trajectory {self.trajectory_id} was already entered", field="trajectory_id")
        self.sampled()

    def _exit(self) -> None:
        self.abort()


class Trajectory(_TrajectoryHints):
    """A trajectory of the synchronous ``ProrsaClient``."""

    _client: "ProrsaClient"

    def __enter__(self) -> "Trajectory":
        self._enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit()

    def generate(self, input_ids: Sequence[int] | None = None, *, text: str | None = None,
                 sampling_params: Mapping[str, Any] | None = None, **kwargs: Any) -> Generation:
        """``ProrsaClient.generate`` carrying this trajectory's id; the turn counter and context length follow."""
        return self._record(self._client.generate(input_ids, text=text, sampling_params=sampling_params,
                                                  trajectory_id=self.trajectory_id, **kwargs))


class AsyncTrajectory(_TrajectoryHints):
    """A trajectory of ``AsyncProrsaClient``; hints are queued without awaiting, so plain ``with`` blocks work for
    sandbox / tool / reward inside ``async with client.trajectory(...)``."""

    _client: "AsyncProrsaClient"

    async def __aenter__(self) -> "AsyncTrajectory":
        self._enter()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._exit()

    async def generate(self, input_ids: Sequence[int] | None = None, *, text: str | None = None,
                       sampling_params: Mapping[str, Any] | None = None, **kwargs: Any) -> Generation:
        return self._record(await self._client.generate(input_ids, text=text, sampling_params=sampling_params,
                                                        trajectory_id=self.trajectory_id, **kwargs))
