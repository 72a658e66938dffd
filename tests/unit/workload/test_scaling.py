"""PlanScale: a preset's plans shrunk for a small deployment, one function for the servers' run and the simulator."""

import math

import pytest

from sglang_prorsa.workload.generator import WorkloadGenerator
from sglang_prorsa.workload.presets import TASKS
from sglang_prorsa.workload.scaling import PlanScale

SCALE = PlanScale(time_scale=0.25, token_scale=0.1, max_wait_s=6.0, min_prompt=64, max_prompt=1024, min_new=8,
                  max_new=64, max_tool_tokens=256, max_turns=3)


def test_apply_scales_clips_and_cuts():
    gen = WorkloadGenerator(TASKS["coding_agent"], 0)
    for index in range(40):
        plan = gen.plan(index, "g")
        scaled = SCALE.apply(plan)
        assert len(scaled.turns) == min(3, len(plan.turns))
        assert scaled.turns[-1].tool is None and scaled.turns[-1].tool_s == 0 and scaled.turns[-1].tool_result_tokens == 0
        assert all(t.tool is not None for t in scaled.turns[:-1])
        for raw, t in zip(plan.turns, scaled.turns[:-1]):
            assert t.tool == raw.tool
            assert t.tool_s == min(raw.tool_s * 0.25, 6.0)
            assert t.agent_overhead_s == min(raw.agent_overhead_s * 0.25, 6.0)
            assert 4 <= t.tool_result_tokens <= 256
            assert t.tool_result_tokens == min(256, max(4, round(raw.tool_result_tokens * 0.1)))
        assert all(8 <= t.output_tokens <= 64 for t in scaled.turns)
        assert scaled.first_prompt_tokens == min(1024, max(64, round(plan.first_prompt_tokens * 0.1)))
        assert scaled.startup_s == min(plan.startup_s * 0.25, 6.0)
        assert scaled.reward_s == min(plan.reward_s * 0.25, 6.0)
        assert (scaled.trajectory_id, scaled.sandbox_mode, scaled.accepted) == \
            (plan.trajectory_id, plan.sandbox_mode, plan.accepted)


def test_group_prompt_override_and_identity():
    plan = WorkloadGenerator(TASKS["general_agent"], 1).plan(5, "g")
    assert SCALE.apply(plan, first_prompt_tokens=77).first_prompt_tokens == 77
    same = PlanScale().apply(plan)
    assert same.turns == plan.turns and same.first_prompt_tokens == plan.first_prompt_tokens
    assert same.reward_s == plan.reward_s and not math.isinf(same.reward_s)


@pytest.mark.parametrize("bad", [dict(token_scale=0), dict(min_new=10, max_new=5), dict(max_turns=0),
                                 dict(time_scale=-1), dict(min_prompt=0)])
def test_invalid_scales_are_refused(bad):
    with pytest.raises(ValueError):
        PlanScale(**bad)
