"""AReaL's workflow with hints (``integrations/areal.py``), against a loopback stand-in for the front: the exact
hints, in order, and the trajectory id on every ``/generate`` body, with fakes shaped like AReaL 1.0.4's classes
(AReaL is not installed)."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest
from unit_support import StandInFront, loopback_upstream

from sglang_prorsa.integrations.areal import ProrsaWorkflow, current_trajectory, tag_engine
from sglang_prorsa.testing.areal_shapes import RemoteInfEngine, RemoteSGLangEngine, SGLangBackend, TwoTurnWorkflow


class Front(StandInFront):
    def seen(self, tid: str) -> list[tuple]:
        return [(e["event"], e.get("turn"), e.get("prompt_tokens"), e.get("accepted"))
                for e in self.events if e["trajectory_id"] == tid]


def run(scenario) -> Front:
    front = Front()

    async def main() -> None:
        async with loopback_upstream(front.routes()) as url:
            await scenario(url)

    asyncio.run(main())
    return front


def grouped(workflow, engine, data, n):  # areal/infra/remote_inf_engine.py GroupedRolloutWorkflow.arun_episode
    return asyncio.gather(*[workflow.arun_episode(engine, data) for _ in range(n)], return_exceptions=True)


def test_a_group_under_an_areal_task_id_sends_its_lifecycle_and_the_id_on_every_generate(monkeypatch):
    # areal/infra/workflow_executor.py sets workflow_context (areal/infra/workflow_context.py) before arun_episode
    ctx = SimpleNamespace(get=lambda: SimpleNamespace(is_eval=False, task_id=17))
    monkeypatch.setitem(sys.modules, "areal.infra.workflow_context", ctx)
    wf: list[ProrsaWorkflow] = []

    async def scenario(url):
        w = ProrsaWorkflow(TwoTurnWorkflow(), url, task="math")
        wf.append(w)
        engine = RemoteSGLangEngine(url)
        results = await grouped(w, engine, {"input_ids": [1, 2, 3, 4]}, 4)
        assert all(r["rewards"] == 1.0 for r in results)
        assert isinstance(engine._engine.backend.build_generation_request, object) and tag_engine(engine)
        assert await w.flush(10)
        await w.aclose()

    front = run(scenario)
    tids = sorted({e["trajectory_id"] for e in front.events})
    prefix = tids[0].rsplit("-", 1)[0]
    assert prefix.startswith("areal-") and prefix.endswith("-17")
    assert tids == [f"{prefix}-{i}" for i in range(4)]
    assert {e["group_id"] for e in front.events} == {prefix} and {e["task"] for e in front.events} == {"math"}
    for tid in tids:
        assert front.seen(tid) == [("sampled", 0, 4, None), ("tool_start", 1, None, None),
                                   ("tool_end", 1, 4 + 2 + 3, None), ("reward_start", 2, None, None),
                                   ("reward_end", 2, None, True)]
    assert len(front.bodies) == 8 and sorted(b["session_id"] for b in front.bodies) == sorted(tids * 2)
    assert "areal" not in {m.split(".")[0] for m in sys.modules if m != "areal.infra.workflow_context"}


def test_without_areal_the_query_id_names_the_group_and_a_rejected_episode_is_not_accepted():
    async def scenario(url):
        w = ProrsaWorkflow(TwoTurnWorkflow(reject=True), url)
        assert await w.arun_episode(RemoteInfEngine(url), {"input_ids": [1], "query_id": "q9"}) is None
        assert await w.flush(10)
        await w.aclose()

    front = run(scenario)
    (tid,) = {e["trajectory_id"] for e in front.events}
    assert tid.endswith("-q9-0") and [b["session_id"] for b in front.bodies] == [tid, tid]
    assert front.seen(tid)[-2:] == [("reward_start", 2, None, None), ("reward_end", 2, None, False)]


def test_a_raising_or_cancelled_episode_sends_aborted():
    async def scenario(url):
        w = ProrsaWorkflow(TwoTurnWorkflow(fail=True), url)
        with pytest.raises(RuntimeError):
            await w.arun_episode(RemoteInfEngine(url), {"input_ids": [1], "query_id": "a"})

        class Stuck:
            async def arun_episode(self, engine, data):
                await asyncio.sleep(60)

        w2 = ProrsaWorkflow(Stuck(), url)
        task = asyncio.ensure_future(w2.arun_episode(RemoteInfEngine(url), {"query_id": "b"}))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await w.flush(10) and await w2.flush(10)
        await w.aclose()
        await w2.aclose()

    front = run(scenario)
    by_tid: dict[str, list[str]] = {}
    for e in front.events:
        by_tid.setdefault(e["trajectory_id"], []).append(e["event"])
    assert sorted(by_tid.values()) == [["sampled", "aborted"],
                                       ["sampled", "tool_start", "tool_end", "aborted"]]


def test_the_wrapper_keeps_the_workflows_attributes_and_tags_an_engine_once():
    inner = TwoTurnWorkflow()
    w = ProrsaWorkflow(inner, "http://127.0.0.1:9")
    assert w.fail is False and w.workflow is inner
    engine = RemoteSGLangEngine("http://127.0.0.1:9")
    assert tag_engine(engine) and tag_engine(engine)
    assert engine._engine.backend._prorsa_backend.__class__ is SGLangBackend
    assert tag_engine(SimpleNamespace()) is False
    with pytest.raises(LookupError):
        current_trajectory()
