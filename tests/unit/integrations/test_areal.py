"""AReaL's workflow with hints (``integrations/areal.py``), against a loopback stand-in for the front: the exact
hints, in order, and the trajectory id on every ``/generate`` body, with fakes shaped like AReaL 1.0.4's classes
(AReaL is not installed)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from unit_support import loopback_upstream

from sglang_prorsa.integrations.areal import ProrsaWorkflow, current_trajectory, tag_engine


@dataclass
class ModelRequest:  # areal/api/io_struct.py ModelRequest: a fresh rid per request, no trajectory field
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    input_ids: list[int] = field(default_factory=list)
    gconfig: Any = None
    metadata: dict = field(default_factory=dict)


@dataclass
class HttpRequest:  # areal/api/io_struct.py HttpRequest
    endpoint: str
    payload: dict
    method: str = "POST"


class SGLangBackend:  # areal/engine/sglang_remote.py SGLangBackend.build_generation_request's payload
    def build_generation_request(self, req: ModelRequest, with_lora: bool, version: int) -> HttpRequest:
        return HttpRequest("/generate", {"input_ids": req.input_ids.copy(), "image_data": None,
                                         "sampling_params": {"max_new_tokens": 2, "temperature": 0.0},
                                         "return_logprob": True, "stream": False})

    def parse_generation_response(self, response: dict) -> SimpleNamespace:
        return SimpleNamespace(output_tokens=response["output_ids"], stop_reason="length")


class RemoteInfEngine:  # areal/infra/remote_inf_engine.py: agenerate builds through self.backend, posts JSON only
    def __init__(self, addr: str) -> None:
        self.backend = SGLangBackend()
        self.addr = addr

    async def agenerate(self, req: ModelRequest) -> SimpleNamespace:
        http_req = self.backend.build_generation_request(req, with_lora=False, version=0)
        async with aiohttp.ClientSession() as s, s.post(self.addr + http_req.endpoint, json=http_req.payload) as r:
            out = await r.json()
        self.backend.parse_generation_response(out)
        return SimpleNamespace(input_tokens=req.input_ids, output_tokens=out["output_ids"])


class RemoteSGLangEngine:  # areal/engine/sglang_remote.py: pure composition, self._engine = RemoteInfEngine(...)
    def __init__(self, addr: str) -> None:
        self._engine = RemoteInfEngine(addr)

    async def agenerate(self, req: ModelRequest) -> SimpleNamespace:
        return await self._engine.agenerate(req)


class TwoTurnWorkflow:  # a RolloutWorkflow (areal/api/workflow_api.py): arun_episode(engine, data)
    def __init__(self, fail: bool = False, reject: bool = False) -> None:
        self.fail, self.reject = fail, reject

    async def arun_episode(self, engine, data):
        ids = list(data["input_ids"])
        for turn in range(2):
            resp = await engine.agenerate(ModelRequest(input_ids=ids))
            ids += resp.output_tokens
            if turn == 0:
                with current_trajectory().tool("bash") as call:
                    call.result_tokens = 3
                ids += [7, 7, 7]
        if self.fail:
            raise RuntimeError("sandbox died")
        return None if self.reject else {"input_ids": ids, "rewards": 1.0}


class Front:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.bodies: list[dict] = []

    def routes(self):
        async def lifecycle(request: web.Request) -> web.Response:
            events = (await request.json())["events"]
            self.events += events
            return web.json_response({"received": len(events), "applied": len(events), "duplicates": 0,
                                      "rejected": 0, "rejections": []})

        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            self.bodies.append(body)
            n = body["sampling_params"]["max_new_tokens"]
            return web.json_response({"text": "x" * n, "output_ids": [5] * n, "meta_info": {
                "prompt_tokens": len(body["input_ids"]), "completion_tokens": n, "finish_reason": {"type": "length"}}})

        return [("POST", "/lifecycle", lifecycle), ("POST", "/generate", generate)]

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
