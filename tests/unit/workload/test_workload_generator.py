"""Synthetic workload: deterministic plans, a consistent event stream, and a replay that reports WAPE."""

import dataclasses

import pytest

from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.policy.lifecycle.events import EventKind
from sglang_prorsa.policy.lifecycle.tracker import TrajectoryTracker
from sglang_prorsa.workload import TASKS, RolloutSimulator, WorkloadGenerator, preset, replay_workload
from sglang_prorsa.workload.generator import TurnPlan, TurnPlans
from sglang_prorsa.workload.presets import with_injection


def test_presets_exist():
    assert {"coding_agent", "general_agent", "math"} <= set(TASKS)
    assert preset("math", "sync").rollout.injection.policy is InjectionPolicy.NONE
    assert preset("coding_agent").rollout.injection.policy is InjectionPolicy.GROUP
    with pytest.raises(KeyError):
        preset("poetry")


def test_plans_are_deterministic_and_order_independent():
    a = WorkloadGenerator(TASKS["coding_agent"], seed=7)
    b = WorkloadGenerator(TASKS["coding_agent"], seed=7)
    assert [a.plan(i) for i in range(5)] == [b.plan(i) for i in reversed(range(5))][::-1]
    assert a.plan(0) != WorkloadGenerator(TASKS["coding_agent"], seed=8).plan(0)
    plan = a.plan(3)
    assert plan.turns[-1].tool is None and all(t.tool for t in plan.turns[:-1])
    t0, t1 = plan.turns[0], plan.turns[1]
    assert plan.prompt_tokens_at(2) == plan.first_prompt_tokens + t0.output_tokens + t0.tool_result_tokens + \
        t1.output_tokens + t1.tool_result_tokens
    math_plan = WorkloadGenerator(TASKS["math"], seed=1).plan(0)
    assert len(math_plan.turns) == 1 and math_plan.sandbox_mode is None


def test_turns_are_stored_as_columns_and_read_back_as_the_turn_plans_given():
    turns = (TurnPlan(120, "bash", 2.5, 300, 0.25), TurnPlan(7, "python", 0.1, 0, 1.0), TurnPlan(40, None, 0.0, 0, 0.0))
    cols = TurnPlans(turns)
    assert len(cols) == 3 and cols[1] == turns[1] and cols[-1] == turns[2] and list(cols) == list(turns)
    assert cols == turns and turns == tuple(cols) and cols != turns[:2] and hash(cols) == hash(turns)
    assert cols[1:] == turns[1:] and isinstance(cols[1:], TurnPlans) and cols[::2] == turns[::2]
    assert cols.output_tokens(0) == 120 and cols.added_tokens() == [420, 7, 40]
    with pytest.raises(IndexError):
        cols[3]
    plan = WorkloadGenerator(TASKS["coding_agent"], seed=7).plan(0)
    again = dataclasses.replace(plan, turns=tuple(plan.turns))  # a tuple given is stored as columns, equal
    assert isinstance(again.turns, TurnPlans) and again == plan and again.turns[0] == plan.turns[0]
    # prompt lengths from the columns: the first prompt, then each earlier turn's output and tool result
    assert dataclasses.replace(plan, first_prompt_tokens=100, turns=turns).prompt_tokens_at(2) == 100 + 420 + 7


@pytest.mark.parametrize("name, mode", [("general_agent", "async"), ("coding_agent", "sync"), ("math", "sync")])
def test_event_stream_is_ordered_and_valid_for_the_state_machine(name, mode):
    sim = RolloutSimulator(preset(name, mode), seed=3, duration_s=400)
    events = list(sim.events())
    assert events and all(x.ts <= y.ts for x, y in zip(events, events[1:]))
    tracker = TrajectoryTracker()
    for event in events:
        tracker.apply(event)
    assert tracker.rejected_count == 0 and tracker.counts["duplicate"] == 0
    kinds = {e.kind for e in events}
    assert EventKind.REQUEST_ARRIVED in kinds and EventKind.PREFILL_END in kinds


def test_sync_steps_and_async_injection():
    spec = preset("general_agent", "sync")
    events = list(RolloutSimulator(spec, seed=1, duration_s=3000).events())
    sampled = [e.ts for e in events if e.kind is EventKind.SAMPLED]
    first_step_end = max(e.ts for e in events if e.kind is EventKind.REWARD_END and int(e.trajectory_id.rsplit("-", 1)[1]) < spec.rollout.concurrency)
    later = [t for t in sampled if t > 0]
    assert sampled.count(0.0) == spec.rollout.concurrency
    assert later and min(later) == pytest.approx(first_step_end + spec.rollout.train_gap_s)
    replace = with_injection(preset("general_agent"), InjectionConfig(InjectionPolicy.REPLACE_ON_REWARD))
    sim = RolloutSimulator(replace, seed=1, duration_s=600)
    events = list(sim.events())
    accepted_done = sum(1 for e in events if e.kind is EventKind.REWARD_END and e.accepted)
    assert sim.launched == replace.rollout.concurrency + accepted_done  # one new sample per admitted completion


def test_replay_reports_wape():
    report = replay_workload(preset("general_agent", "async"), seed=2, duration_s=300)
    assert report.wape.windows == 30 and len(report.windows) == 30
    assert report.rejected_events == 0
    assert report.wape.prefill is not None and 0 <= report.wape.prefill < 1.0
    assert report.wape.decode is not None and 0 <= report.wape.decode < 1.0
    assert "prefill WAPE" in report.line()
