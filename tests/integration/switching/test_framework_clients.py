"""A trainer framework's own client path against the live deployment, with a busy switch in the middle of the
episode: AReaL's rollout client and workflow, as stand-ins shaped exactly like AReaL 1.0.4's classes
(``sglang_prorsa/testing/areal_shapes.py``: AReaL itself imports ``ray`` on import and is not installed here),
wrapped by ``sglang_prorsa.integrations.areal``. One GRPO group of 4 two-turn episodes with a tool call between the
turns: every answer equals the same group run without a switch, the hints and the engine's own events reach the
front's tracker under the trajectory ids AReaL's task id gives."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import requests
from tests_support import arrange

from sglang_prorsa.integrations.areal import ProrsaWorkflow
from sglang_prorsa.testing.areal_shapes import RemoteSGLangEngine, TwoTurnWorkflow
from sglang_prorsa.testing.front_client import busiest, distinct_prompts, switch_under_load

GROUP = 4
TURNS = (160, 24)  # the first turn is still decoding when the switch comes
TOOL_S = 0.5  # a tool call takes time: the trainer's tool hints reach the front before the next request's events


def run_group(url: str, prompt: list[int], task_id: int) -> list[list[list[int]]]:
    """AReaL's GroupedRolloutWorkflow: ``GROUP`` episodes of one task gathered on one loop, under the task id its
    workflow executor sets (areal/infra/workflow_context.py). Each episode's outputs, per turn."""

    async def group() -> list:
        workflow = ProrsaWorkflow(TwoTurnWorkflow(TURNS, tool_s=TOOL_S), url, task="agent")
        engine = RemoteSGLangEngine(url)
        results = await asyncio.gather(*[workflow.arun_episode(engine, {"input_ids": prompt})
                                         for _ in range(GROUP)])
        assert await workflow.flush(30)
        await workflow.aclose()
        return results

    context = SimpleNamespace(get=lambda: SimpleNamespace(is_eval=False, task_id=task_id))
    previous = sys.modules.get("areal.infra.workflow_context")
    sys.modules["areal.infra.workflow_context"] = context  # type: ignore[assignment]
    try:
        return [r["outputs"] for r in asyncio.run(group())]
    finally:
        if previous is None:
            sys.modules.pop("areal.infra.workflow_context", None)
        else:
            sys.modules["areal.infra.workflow_context"] = previous


def status(url: str) -> dict:
    return requests.get(url + "/lifecycle/status", timeout=30).json()


def test_an_areal_group_with_tool_turns_answers_exactly_through_a_busy_switch(deployment):
    front = deployment
    arrange(front, prefill=2, decode=2)
    (prompt,) = distinct_prompts(1, lambda i: 48, seed=41)
    before = status(front.url)
    reference = run_group(front.url, prompt, task_id=900)
    switch, (switched,), moved_from = switch_under_load(
        front.url, lambda task: run_group(front.url, prompt, task), [901], lambda: busiest(front.url, "decode"),
        "prefill", ready=lambda st: st["running"] >= 2, settle_s=0.3)
    assert switch.status_code == 200, switch.text
    assert moved_from["running"] >= 2 and switch.json()["taken"] >= 2, (moved_from, switch.json())
    # greedy: every episode of the group has the same answers, and the switched group the unswitched one's
    assert switched == reference and all(len(turns) == 2 for turns in switched)
    assert [len(t) for t in switched[0]] == list(TURNS)
    # the trainer's hints (5 an episode) and the engine's own events (at least each request's arrival) under AReaL's
    # ids were applied by the front's tracker, both groups' (the reference one included), and every episode finished
    after = status(front.url)
    applied = after["events"]["applied"] - before["events"]["applied"]
    assert applied >= 2 * GROUP * (5 + len(TURNS)), applied
    assert after["finished_trajectories"] - before["finished_trajectories"] == 2 * GROUP
    # The one race left between the channels: the last response's engine events (prefill_end, decode_end), batched by
    # the engine every 50 ms, can reach the tracker after the trainer's reward_end ended the trajectory; they are
    # refused (after_finish). No trainer hint is refused, and no engine event for any other reason (docs/failures.md:
    # events that overtake the hints before them).
    refused = [r for r in after["recent_rejections"] if r["trajectory_id"].startswith("areal-")]
    assert {(r["event"], r["reason"]) for r in refused} <= {("prefill_end", "after_finish"),
                                                          ("decode_end", "after_finish")}, refused
