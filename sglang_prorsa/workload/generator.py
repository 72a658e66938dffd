"""Trajectory plans: what one sampled trajectory will do, drawn deterministically from a seed.

A plan fixes everything the environment decides (turn count, output lengths, tools and their durations, tool-result
sizes, sandbox mode and startup, reward duration and outcome). Timing that depends on the engine (queueing, prefill
and decode time) is left to whoever executes the plan: the rollout simulator here, or the cluster simulator.

Each plan is drawn from its own ``random.Random(f"{seed}/{task}/{index}")``, so plan ``i`` is the same whatever order
or subset of plans a caller asks for.

A plan's turns are stored as columns (``TurnPlans``), not as one object per turn: a simulated hour at 1,024 GPUs
draws about 12,000 plans of 27 turns on average, and at about 190 bytes per turn object they were most of the
simulator's memory (peak resident 124 MB; 76 MB as columns, which take 40 bytes per turn). The columns hand out the
same ``TurnPlan`` values.
"""

from __future__ import annotations

import itertools
import random
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from sglang_prorsa.policy.lifecycle.events import SandboxMode
from sglang_prorsa.workload.presets import TaskProfile


@dataclass(frozen=True, slots=True)
class TurnPlan:
    output_tokens: int
    tool: str | None  # None on the last turn: the response stops and the trajectory goes to reward
    tool_s: float
    tool_result_tokens: int
    agent_overhead_s: float  # tool end -> next request


class TurnPlans(Sequence[TurnPlan]):
    """A plan's turns, immutable, as columns: the token counts in one array of 64-bit ints (two per turn), the
    seconds in one of doubles (two per turn), the tool names in a tuple. Indexing returns a ``TurnPlan`` equal to the
    one stored (doubles hold Python floats exactly); a slice returns ``TurnPlans``. Equal to any sequence of the same
    ``TurnPlan`` values, a tuple included."""

    __slots__ = ("_tokens", "_seconds", "_tools")

    def __init__(self, turns: Iterable[TurnPlan] = ()) -> None:
        tokens, seconds, tools = array("q"), array("d"), []
        for t in turns:
            tokens.append(t.output_tokens)
            tokens.append(t.tool_result_tokens)
            seconds.append(t.tool_s)
            seconds.append(t.agent_overhead_s)
            tools.append(t.tool)
        self._tokens, self._seconds, self._tools = tokens, seconds, tuple(tools)

    @classmethod
    def _columns(cls, tokens: array, seconds: array, tools: tuple[str | None, ...]) -> TurnPlans:
        new = cls.__new__(cls)
        new._tokens, new._seconds, new._tools = tokens, seconds, tools
        return new

    def __len__(self) -> int:
        return len(self._tools)

    @overload
    def __getitem__(self, k: int) -> TurnPlan: ...

    @overload
    def __getitem__(self, k: slice) -> TurnPlans: ...

    def __getitem__(self, k: int | slice) -> TurnPlan | TurnPlans:
        if isinstance(k, slice):
            start, stop, step = k.indices(len(self._tools))
            if step != 1:
                return TurnPlans(self[i] for i in range(start, stop, step))
            return TurnPlans._columns(self._tokens[2 * start:2 * stop], self._seconds[2 * start:2 * stop],
                                      self._tools[start:stop])
        n = len(self._tools)
        if not -n <= k < n:
            raise IndexError("turn index out of range")
        return self._turn(k if k >= 0 else k + n)

    def __iter__(self) -> Iterator[TurnPlan]:
        return map(self._turn, range(len(self._tools)))

    def _turn(self, k: int) -> TurnPlan:
        tokens, seconds = self._tokens, self._seconds
        return TurnPlan(tokens[2 * k], self._tools[k], seconds[2 * k], tokens[2 * k + 1], seconds[2 * k + 1])

    def output_tokens(self, k: int) -> int:
        """Turn ``k``'s output tokens without building its ``TurnPlan`` (the simulator's per-request path)."""
        return self._tokens[2 * k]

    def added_tokens(self) -> list[int]:
        """Tokens each turn adds to the context (its output plus its tool result), in turn order."""
        tokens = self._tokens
        return [tokens[i] + tokens[i + 1] for i in range(0, len(tokens), 2)]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TurnPlans):
            return (self._tokens, self._seconds, self._tools) == (other._tokens, other._seconds, other._tools)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"TurnPlans({list(self)!r})"


@dataclass(frozen=True, slots=True)
class TrajectoryPlan:
    index: int
    trajectory_id: str
    group_id: str | None
    task: str
    first_prompt_tokens: int
    turns: TurnPlans  # any sequence of TurnPlan given here is stored as TurnPlans
    sandbox_mode: SandboxMode | None  # None: no sandbox (math)
    dispatch_s: float
    startup_s: float
    first_request_s: float
    reward_s: float
    accepted: bool

    def __post_init__(self) -> None:
        if not isinstance(self.turns, TurnPlans):
            object.__setattr__(self, "turns", TurnPlans(self.turns))

    def prompt_tokens_at(self, turn: int) -> int:
        """Full prompt length of request ``turn``: first prompt + earlier outputs and tool results."""
        return self.first_prompt_tokens + sum(self.turns.added_tokens()[:turn])


class WorkloadGenerator:
    def __init__(self, task: TaskProfile, seed: int) -> None:
        self.task = task
        self.seed = seed
        # cumulative once: ``choices`` would accumulate the weights on every call (same floats, same draws)
        self._tool_cum_weights = list(itertools.accumulate(t.weight for t in task.tools))

    def plan(self, index: int, group_id: str | None = None) -> TrajectoryPlan:
        task = self.task
        rng = random.Random(f"{self.seed}/{task.name}/{index}")
        n_turns = max(1, round(task.turns.sample(rng)))
        turns = []
        tools, cum_weights = task.tools, self._tool_cum_weights
        output_tokens, overhead_s = task.output_tokens.sample, task.agent_overhead_s.sample
        for k in range(n_turns):
            out = max(1, round(output_tokens(rng)))
            last = k == n_turns - 1 or not tools
            if last:
                turns.append(TurnPlan(out, None, 0.0, 0, 0.0))
                continue
            tool = rng.choices(tools, cum_weights=cum_weights)[0]
            turns.append(
                TurnPlan(
                    out,
                    tool.name,
                    tool.duration_s.sample(rng),
                    max(0, round(tool.result_tokens.sample(rng))),
                    overhead_s(rng),
                )
            )
        mode = None
        startup = 0.0
        if task.uses_sandbox:
            mode = SandboxMode.PREWARM if rng.random() < task.prewarm_hit_rate else SandboxMode.COLD
            startup = (task.prewarm_start_s if mode is SandboxMode.PREWARM else task.cold_start_s).sample(rng)
        return TrajectoryPlan(
            index=index,
            trajectory_id=f"{task.name}-{self.seed}-{index}",
            group_id=group_id,
            task=task.name,
            first_prompt_tokens=max(1, round(task.first_prompt_tokens.sample(rng))),
            turns=TurnPlans(turns),
            sandbox_mode=mode,
            dispatch_s=task.dispatch_s.sample(rng),
            startup_s=startup,
            first_request_s=task.first_request_s.sample(rng) if task.uses_sandbox else 0.0,
            reward_s=task.reward_s.sample(rng),
            accepted=rng.random() < task.accept_rate,
        )
