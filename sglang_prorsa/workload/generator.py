"""Trajectory plans: what one sampled trajectory will do, drawn deterministically from a seed.

A plan fixes everything the environment decides (turn count, output lengths, tools and their durations, tool-result
sizes, sandbox mode and startup, reward duration and outcome). Timing that depends on the engine (queueing, prefill
and decode time) is left to whoever executes the plan: the rollout simulator here, or the cluster simulator.

Each plan is drawn from its own ``random.Random(f"{seed}/{task}/{index}")``, so plan ``i`` is the same whatever order
or subset of plans a caller asks for.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from sglang_prorsa.policy.lifecycle.events import SandboxMode
from sglang_prorsa.workload.presets import TaskProfile


@dataclass(frozen=True, slots=True)
class TurnPlan:
    output_tokens: int
    tool: str | None  # None on the last turn: the response stops and the trajectory goes to reward
    tool_s: float
    tool_result_tokens: int
    agent_overhead_s: float  # tool end -> next request


@dataclass(frozen=True, slots=True)
class TrajectoryPlan:
    index: int
    trajectory_id: str
    group_id: str | None
    task: str
    first_prompt_tokens: int
    turns: tuple[TurnPlan, ...]
    sandbox_mode: SandboxMode | None  # None: no sandbox (math)
    dispatch_s: float
    startup_s: float
    first_request_s: float
    reward_s: float
    accepted: bool

    def prompt_tokens_at(self, turn: int) -> int:
        """Full prompt length of request ``turn``: first prompt + earlier outputs and tool results."""
        return self.first_prompt_tokens + sum(t.output_tokens + t.tool_result_tokens for t in self.turns[:turn])


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
            turns=tuple(turns),
            sandbox_mode=mode,
            dispatch_s=task.dispatch_s.sample(rng),
            startup_s=startup,
            first_request_s=task.first_request_s.sample(rng) if task.uses_sandbox else 0.0,
            reward_s=task.reward_s.sample(rng),
            accepted=rng.random() < task.accept_rate,
        )
