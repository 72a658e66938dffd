"""A trainer framework's own client path against the live deployment, with a busy switch in the middle of the
episode. One GRPO group of 4 two-turn episodes with a tool call between the turns, each time: every answer equals
the same group run without a switch, the hints and the engine's own events reach the front's tracker.

- AReaL's rollout client and workflow, as stand-ins shaped exactly like AReaL 1.0.4's classes
  (``sglang_prorsa/testing/areal_shapes.py``: AReaL itself imports ``ray`` on import and is not installed here),
  wrapped by ``sglang_prorsa.integrations.areal``, over HTTP to the front.
- verl's in-process path: a fifth instance started as verl 0.9.1 starts one (``verl_engine.py``: our ``Engine`` in
  place of SGLang's, SGLang's app served by the caller's uvicorn), registered with the front's controller by itself;
  the group's model turns are in-process ``generate_request`` calls in that engine's process, and the switch is of
  that engine."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from tests_support import ENGINE_FLAGS, arrange

from sglang_prorsa.integrations.areal import ProrsaWorkflow
from sglang_prorsa.srt.utils import processes
from sglang_prorsa.testing.areal_shapes import RemoteSGLangEngine, TwoTurnWorkflow
from sglang_prorsa.testing.front_client import (
    busiest,
    distinct_prompts,
    instance_status,
    instances,
    switch,
    switch_under_load,
)

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


VERL_ID = "verl-0"


@pytest.fixture(scope="module")
def verl_engine(deployment, log_dir):
    """The fifth instance, a decode instance started as verl starts its engines; out of the front again (and
    stopped) when the module is done, so the package's other tests see their four."""
    here = str(Path(__file__).resolve().parents[1])

    def start(attempt: int) -> processes.ServerProcess:
        port, bport = processes.free_port(), processes.free_port()
        return processes.start(
            ["--front", deployment.url, "--kv-store-path", str(deployment.store), "--instance-id", VERL_ID,
             "--cpu-threads", "2", "--", "--disaggregation-mode", "decode", "--disaggregation-bootstrap-port",
             str(bport), "--disaggregation-transfer-backend", "mooncake", "--host", processes.LOOPBACK, "--port",
             str(port), *ENGINE_FLAGS],
            name=f"verl-engine-{attempt}", port=port, log_dir=log_dir, module="verl_engine", env={"PYTHONPATH": here})

    srv = start(0)
    try:
        srv, _ = processes.ready_or_restarted(srv, start, retries=2, timeout=900)
        deadline = time.monotonic() + 120  # it registers once its own /health answers (every 5 s after)
        while not any(i["instance"] == VERL_ID and i["status"] == "active" for i in instances(deployment.url)):
            assert time.monotonic() < deadline, instances(deployment.url)
            time.sleep(0.5)
        yield srv
    finally:
        srv.stop(grace_s=3)  # its HTTP server waits on the front's open connections; nothing to keep here
        requests.delete(f"{deployment.url}/workers/{VERL_ID}", timeout=120)


def verl_group(engine_url: str, prompt: list[int], task: int) -> list[list[list[int]]]:
    r = requests.post(engine_url + "/verl/group", json={"prompt": prompt, "turns": list(TURNS), "group": GROUP,
                                                       "tool_s": TOOL_S, "task": task}, timeout=900)
    assert r.status_code == 200, r.text
    assert len(set(r.json()["trajectories"])) == GROUP
    return r.json()["outputs"]


def test_a_verl_group_in_process_answers_exactly_through_a_busy_switch_of_its_engine(deployment, verl_engine):
    front = deployment
    roles = {i["instance"]: i["role"] for i in instances(front.url)}
    if roles[VERL_ID] != "decode":
        assert switch(front.url, VERL_ID, "decode").status_code == 200
    arrange(front, prefill=2, decode=3)
    assert {i["instance"]: i["role"] for i in instances(front.url)}[VERL_ID] == "decode"
    (prompt,) = distinct_prompts(1, lambda i: 48, seed=43)
    counters = instance_status(verl_engine.url)["engine_counters"]
    before_status = status(front.url)
    reference = verl_group(verl_engine.url, prompt, task=910)
    # the engine paired every turn itself: decode here, prefill on a prefill peer
    paired = instance_status(verl_engine.url)["engine_counters"]["in_process_paired"]
    assert paired - counters.get("in_process_paired", 0) == GROUP * len(TURNS)
    target = {"instance": VERL_ID, "url": verl_engine.url}
    sw, (switched,), before = switch_under_load(front.url, lambda task: verl_group(verl_engine.url, prompt, task),
                                                [911], target, "prefill", ready=lambda st: st["running"] >= 2,
                                                settle_s=0.3)
    assert sw.status_code == 200, sw.text
    assert before["running"] >= 2 and sw.json()["taken"] >= 2, (before, sw.json())
    assert switched == reference and [len(t) for t in switched[0]] == list(TURNS)
    after = instance_status(verl_engine.url)["engine_counters"]
    # the taken-off first turns were resumed from their KV for their in-process callers; the second turns, sent to
    # an engine that is prefill now, were continued on a pair of its peers
    assert after["resumed"] - counters.get("resumed", 0) >= 2, after
    assert {i["instance"]: i["role"] for i in instances(front.url)}[VERL_ID] == "prefill"
    # the loop's hints (tool start/end, reward start/end) and the in-process engine's own events (at least each
    # request's arrival, read from the id the loop carries in the sampling params) reached the front's tracker, and
    # every episode of both groups finished
    after_status = status(front.url)
    applied = after_status["events"]["applied"] - before_status["events"]["applied"]
    assert applied >= 2 * GROUP * (4 + len(TURNS)), applied
    assert after_status["finished_trajectories"] - before_status["finished_trajectories"] == 2 * GROUP
