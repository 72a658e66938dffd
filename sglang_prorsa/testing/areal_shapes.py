"""Stand-ins for AReaL 1.0.4's rollout client, shaped exactly like its classes, for tests (AReaL is not installed
here: its package imports ``ray`` on import, ``areal/utils/name_resolve.py``). Each class names the AReaL source it
mirrors; only what ``integrations/areal.py`` touches is reproduced: the backend that builds every ``/generate`` body
(``build_generation_request``) and reads every answer (``parse_generation_response``), the engine composition, and a
two-turn workflow with a tool call between its turns."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp

from sglang_prorsa.integrations.areal import current_trajectory

TOOL_RESULT = [7, 7, 7]  # the tool's answer appended to the context between the two turns


@dataclass
class ModelRequest:  # areal/api/io_struct.py ModelRequest: a fresh rid per request, no trajectory field
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    input_ids: list[int] = field(default_factory=list)
    max_new_tokens: int = 2
    metadata: dict = field(default_factory=dict)


@dataclass
class HttpRequest:  # areal/api/io_struct.py HttpRequest
    endpoint: str
    payload: dict
    method: str = "POST"


class SGLangBackend:  # areal/engine/sglang_remote.py SGLangBackend: the /generate body AReaL sends (greedy here)
    def build_generation_request(self, req: ModelRequest, with_lora: bool, version: int) -> HttpRequest:
        return HttpRequest("/generate", {"input_ids": req.input_ids.copy(), "image_data": None,
                                         "sampling_params": {"max_new_tokens": req.max_new_tokens, "temperature": 0.0,
                                                             "ignore_eos": True},
                                         "return_logprob": True, "stream": False})

    def parse_generation_response(self, response: dict) -> SimpleNamespace:
        return SimpleNamespace(output_tokens=response["output_ids"], stop_reason="length")


class RemoteInfEngine:  # areal/infra/remote_inf_engine.py: agenerate builds through self.backend, posts JSON only
    def __init__(self, addr: str) -> None:
        self.backend = SGLangBackend()
        self.addr = addr

    async def agenerate(self, req: ModelRequest) -> SimpleNamespace:
        http_req = self.backend.build_generation_request(req, with_lora=False, version=0)
        timeout = aiohttp.ClientTimeout(total=900)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.post(self.addr + http_req.endpoint,
                                                                       json=http_req.payload) as r:
            out = await r.json()
            if r.status != 200:
                raise RuntimeError(f"/generate answered {r.status}: {out}")
        self.backend.parse_generation_response(out)
        return SimpleNamespace(input_tokens=req.input_ids, output_tokens=out["output_ids"])


class RemoteSGLangEngine:  # areal/engine/sglang_remote.py: pure composition, self._engine = RemoteInfEngine(...)
    def __init__(self, addr: str) -> None:
        self._engine = RemoteInfEngine(addr)

    async def agenerate(self, req: ModelRequest) -> SimpleNamespace:
        return await self._engine.agenerate(req)


class TwoTurnWorkflow:  # a RolloutWorkflow (areal/api/workflow_api.py): arun_episode(engine, data)
    def __init__(self, max_new_tokens: tuple[int, int] = (2, 2), fail: bool = False, reject: bool = False,
                 tool_s: float = 0.0) -> None:
        self.max_new_tokens = max_new_tokens
        self.fail, self.reject = fail, reject
        self.tool_s = tool_s  # how long the tool runs

    async def arun_episode(self, engine: Any, data: dict) -> dict | None:
        ids = list(data["input_ids"])
        outputs = []
        for turn, n in enumerate(self.max_new_tokens):
            resp = await engine.agenerate(ModelRequest(input_ids=ids, max_new_tokens=n))
            outputs.append(resp.output_tokens)
            ids += resp.output_tokens
            if turn == 0:
                with current_trajectory().tool("bash") as call:
                    await asyncio.sleep(self.tool_s)
                    call.result_tokens = len(TOOL_RESULT)
                ids += TOOL_RESULT
        if self.fail:
            raise RuntimeError("sandbox died")
        return None if self.reject else {"input_ids": ids, "outputs": outputs, "rewards": 1.0}
