"""Shrink a preset's trajectory plans to what a small deployment can run, the same way for servers and simulator.

The presets (presets.py) describe agentic RL on 128-GPU clusters: minutes of tool time, contexts of tens of thousands
of tokens. A rollout on a tiny CPU model (benchmarks/bench_rollout.py) runs the same plans with every duration
multiplied by ``time_scale`` and every token count by ``token_scale``, each clipped to a range. The simulator applies
the same ``PlanScale`` (``RolloutConfig.scale``) to predict that run, so "the same workload" is one function, not two
copies that could drift apart.

Beyond the plan itself, a scaled GRPO group shares one prompt (its first member's, as GRPO samples a group from one
prompt): ``apply_group``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sglang_prorsa.workload.generator import TrajectoryPlan, TurnPlan


def clip(x: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(x))))


@dataclass(frozen=True)
class PlanScale:
    time_scale: float = 1.0  # multiplies every duration (dispatch, sandbox start, tools, overheads, reward)
    token_scale: float = 1.0  # multiplies every token count (first prompt, outputs, tool results)
    max_wait_s: float = math.inf  # cap on any one scaled duration
    min_prompt: int = 1
    max_prompt: int = 1 << 30
    min_new: int = 1
    max_new: int = 1 << 30
    min_tool_tokens: int = 4
    max_tool_tokens: int = 1 << 30
    max_turns: int = 1 << 30  # later turns are cut; the last kept turn ends the episode (no tool after it)

    def __post_init__(self) -> None:
        if not (self.time_scale >= 0 and self.token_scale > 0 and self.max_wait_s >= 0):
            raise ValueError("time_scale >= 0, token_scale > 0 and max_wait_s >= 0 required")
        if not (1 <= self.min_prompt <= self.max_prompt and 1 <= self.min_new <= self.max_new
                and 0 <= self.min_tool_tokens <= self.max_tool_tokens and self.max_turns >= 1):
            raise ValueError("every min must be >= 1 (tool tokens >= 0) and <= its max; max_turns >= 1")

    def seconds(self, s: float) -> float:
        return min(s * self.time_scale, self.max_wait_s)

    def prompt_tokens(self, tokens: float) -> int:
        """A first prompt of ``tokens`` at the preset's scale, scaled and clipped."""
        return clip(tokens * self.token_scale, self.min_prompt, self.max_prompt)

    def apply_group(self, plans: list[TrajectoryPlan]) -> list[TrajectoryPlan]:
        """A GRPO group's plans, scaled, all with the first member's (scaled) prompt."""
        shared = self.prompt_tokens(plans[0].first_prompt_tokens) if plans else 0
        return [self.apply(p, first_prompt_tokens=shared) for p in plans]

    def apply(self, plan: TrajectoryPlan, first_prompt_tokens: int | None = None) -> TrajectoryPlan:
        """The scaled plan; ``first_prompt_tokens`` (already scaled) overrides the plan's own, e.g. a group's."""
        kept = plan.turns[: self.max_turns]
        turns = []
        for k, turn in enumerate(kept):
            if k == len(kept) - 1 or turn.tool is None:
                turns.append(TurnPlan(clip(turn.output_tokens * self.token_scale, self.min_new, self.max_new),
                                      None, 0.0, 0, 0.0))
                break
            turns.append(TurnPlan(
                output_tokens=clip(turn.output_tokens * self.token_scale, self.min_new, self.max_new),
                tool=turn.tool, tool_s=self.seconds(turn.tool_s),
                tool_result_tokens=clip(turn.tool_result_tokens * self.token_scale, self.min_tool_tokens,
                                        self.max_tool_tokens),
                agent_overhead_s=self.seconds(turn.agent_overhead_s)))
        return replace(
            plan, turns=tuple(turns),
            first_prompt_tokens=self.prompt_tokens(plan.first_prompt_tokens) if first_prompt_tokens is None else first_prompt_tokens,
            dispatch_s=self.seconds(plan.dispatch_s), startup_s=self.seconds(plan.startup_s),
            first_request_s=self.seconds(plan.first_request_s), reward_s=self.seconds(plan.reward_s))
