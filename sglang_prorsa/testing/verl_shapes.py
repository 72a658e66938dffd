"""Drivers that run verl 0.9.1's agent-loop classes (``verl_copies``, re-exported here) the way verl runs them, for
tests and for running a verl-shaped rollout against a live engine (verl is not importable here: its package imports
``ray`` on import).

- ``InProcessServerManager``: verl's ``LLMServerClient.generate`` and ``SGLangHttpServer.generate`` in one process: it
  builds the ``GenerateReqInput`` as verl builds it and awaits ``tokenizer_manager.generate_request(req, None)
  .__anext__()`` on the tokenizer manager it was given. ``HttpServerManager`` posts the same request as a
  ``/generate`` body (to run standalone against a URL); ``EchoTokenizerManager`` answers in place of an engine. Both
  send verl's request exactly: a trajectory id a ``ProrsaAgentLoop`` put in the sampling params stays there, for the
  engine to read.
- ``EchoToolAgentLoop``: ``ToolAgentLoop``'s state machine (pending, generating, processing tools) with one tool that
  answers fixed tokens after a sleep, and its exact ``server_manager.generate`` call.
- ``run_group``: one GRPO group of ``n`` episodes run the way verl's ``AgentLoopWorker`` runs them (one loop built per
  sample with verl's constructor arguments, ``run``, then the reward assigned to the output), concurrently, on the
  running event loop.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from sglang_prorsa.integrations.verl import OUTPUT_KEY, ProrsaAgentLoop, flush, reward_mode
from sglang_prorsa.testing.verl_copies import (
    AgentData,
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    FunctionCall,
    MultiTurnConfig,
    RolloutConfig,
    TokenOutput,
    ToolListWrap,
    register,
    sglang_request,
    token_output,
    trainer_config,
    verl_sampling_params,
)

__all__ = [
    # verl's classes (verl_copies)
    "AgentData", "AgentLoopBase", "AgentLoopMetrics", "AgentLoopOutput", "DictConfigWrap", "FunctionCall",
    "MultiTurnConfig", "RolloutConfig", "TokenOutput", "ToolListWrap", "register", "sglang_request", "token_output",
    "trainer_config", "verl_sampling_params",
    # the drivers
    "TOOL_RESULT", "InProcessServerManager", "HttpServerManager", "EchoTokenizerManager", "EchoToolAgentLoop",
    "Episode", "model_turns", "run_group",
]

logger = logging.getLogger(__name__)

TOOL_RESULT = (7, 7, 7)  # the tool's answer, appended to the context between two model turns


# ----- verl's generation path: LLMServerClient.generate -> SGLangHttpServer.generate -----

_SERVER_KWARGS = ("image_data", "video_data", "bootstrap_host", "bootstrap_port", "bootstrap_room")


class _VerlServerPath:
    """``LLMServerClient.generate`` (verl/workers/rollout/llm_server.py) in front of an SGLang server's
    ``generate``. The request is verl's exactly: a trajectory id a ``ProrsaAgentLoop`` put in its sampling params is
    sent there, and the engine reads it (``engine_api.carried_id``)."""

    def __init__(self, rollout: RolloutConfig | None = None, *, global_steps: Any = None,
                 hf_config: Any = None) -> None:
        self.rollout = rollout or RolloutConfig()
        self.global_steps = global_steps
        self.hf_config = hf_config
        self.requests: list[dict[str, Any]] = []  # a copy of each request as sent, oldest first
        self.keep_requests = 1024  # how many of them are kept

    async def generate(self, request_id: Any, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Optional[list[Any]] = None, video_data: Optional[list[Any]] = None,
                       audio_data: Optional[list[Any]] = None, mm_processor_kwargs: Optional[dict[str, Any]] = None,
                       **kwargs: Any) -> TokenOutput:
        multimodal_kwargs: dict[str, Any] = {}
        if audio_data is not None:
            multimodal_kwargs["audio_data"] = audio_data
        if mm_processor_kwargs:
            multimodal_kwargs["mm_processor_kwargs"] = mm_processor_kwargs
        mm_processor_output = kwargs.pop("mm_processor_output", None)
        if self.rollout.name == "sglang":
            video_data = mm_processor_output
        kwargs.pop("priority", 0)  # vLLM only
        unexpected = sorted(k for k in (*multimodal_kwargs, *kwargs) if k not in _SERVER_KWARGS)
        if unexpected:  # SGLangHttpServer.generate takes no other keyword
            raise TypeError(f"SGLangHttpServer.generate() got unexpected keyword arguments {unexpected}")
        rid = request_id if self.rollout.full_determinism else uuid.uuid4().hex  # LLMServerClient._vllm_request_id
        # Ray hands the server a copy of every argument: verl's server pops from its sampling params, never the
        # agent loop's.
        output = await self.server_generate(list(prompt_ids), copy.deepcopy(sampling_params), rid,
                                            image_data=image_data, video_data=video_data)
        global_steps = output.extra_fields.get("global_steps")
        output.extra_fields.setdefault("min_global_steps", global_steps)
        output.extra_fields.setdefault("max_global_steps", global_steps)
        return output

    async def server_generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                              image_data: Optional[list[Any]] = None,
                              video_data: Optional[list[Any]] = None) -> TokenOutput:
        """``SGLangHttpServer.generate`` outside PD."""
        request, return_logprob, _ = sglang_request(prompt_ids, sampling_params, request_id, self.rollout)
        request["image_data"], request["video_data"] = image_data, video_data
        output = await self._send(request)
        return token_output(output, return_logprob, self.rollout, self.global_steps, self.hf_config)

    async def _send(self, request: dict[str, Any]) -> Mapping[str, Any]:
        raise NotImplementedError

    def _keep(self, request: dict[str, Any]) -> None:
        self.requests.append(copy.deepcopy(request))  # as sent: our engine strips the carried id in place
        del self.requests[: max(0, len(self.requests) - self.keep_requests)]


class InProcessServerManager(_VerlServerPath):
    """verl's generation path with the tokenizer manager of this process: ``GenerateReqInput(**request)`` as verl
    builds it, then ``await tokenizer_manager.generate_request(req, None).__anext__()``. Call it from the event loop
    that runs the tokenizer manager."""

    def __init__(self, tokenizer_manager: Any, rollout: RolloutConfig | None = None, *, global_steps: Any = None,
                 hf_config: Any = None) -> None:
        super().__init__(rollout, global_steps=global_steps, hf_config=hf_config)
        self.tokenizer_manager = tokenizer_manager

    async def _send(self, request: dict[str, Any]) -> Mapping[str, Any]:
        from sglang.srt.managers.io_struct import GenerateReqInput

        req = GenerateReqInput(**request)
        self._keep(request)
        output: Mapping[str, Any] = await self.tokenizer_manager.generate_request(req, None).__anext__()
        return output


class HttpServerManager(_VerlServerPath):
    """verl's generation path with the request posted to ``{url}/generate`` as a JSON body (for running standalone
    against a server; verl itself calls its SGLang in process)."""

    def __init__(self, url: str, rollout: RolloutConfig | None = None, *, timeout_s: float = 600.0) -> None:
        super().__init__(rollout)
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session: Any = None

    async def _send(self, request: dict[str, Any]) -> Mapping[str, Any]:
        import aiohttp

        self._keep(request)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        async with self._session.post(self.url + "/generate", json=request) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"/generate answered {r.status}: {text[:300]}")
        answer = json.loads(text)
        return answer[0] if isinstance(answer, list) else answer

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class EchoTokenizerManager:
    """In place of SGLang's tokenizer manager: keeps every request object and answers ``max_new_tokens`` tokens
    ``first, first + 1, ...`` with log-probability -0.5 each, finish reason ``length``."""

    def __init__(self, first: int = 100) -> None:
        self.first = first
        self.requests: list[Any] = []

    async def generate_request(self, obj: Any, request: Any = None) -> Any:
        self.requests.append(obj)
        n = int(obj.sampling_params["max_new_tokens"])
        ids = list(range(self.first, self.first + n))
        meta: dict[str, Any] = {"prompt_tokens": len(obj.input_ids), "completion_tokens": n,
                                "finish_reason": {"type": "length"}}
        if obj.return_logprob:
            meta["output_token_logprobs"] = [(-0.5, i, None) for i in ids]
        yield {"text": "", "output_ids": ids, "meta_info": meta}


class EchoToolAgentLoop(AgentLoopBase):
    """``ToolAgentLoop``'s states (pending -> generating -> processing tools -> generating ...) and its exact
    ``server_manager.generate`` call; every model turn but the last is followed by one call of the ``echo`` tool,
    which sleeps ``tool_s`` and answers ``tool_result``. Turns: ``multi_turn.max_assistant_turns`` of the rollout
    config. ``turn_tokens`` (an int, or one per turn) adds verl's ``max_tokens`` to a turn's sampling params (verl's
    SGLang server takes it as ``max_new_tokens``); ``fail`` makes the tool raise. The prompt is ``prompt_ids`` if
    given, else ``raw_prompt`` (chat messages) through the tokenizer's chat template."""

    def __init__(self, *args: Any, tools: Any = None, tool_s: float = 0.0,
                 tool_result: Sequence[int] = TOOL_RESULT, turn_tokens: int | Sequence[int] | None = None,
                 fail: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        multi_turn = self.rollout_config.multi_turn
        self.max_user_turns = multi_turn.max_user_turns
        self.max_assistant_turns = multi_turn.max_assistant_turns
        self.max_parallel_calls = multi_turn.max_parallel_calls
        self.response_length = self.rollout_config.response_length
        self.tool_s = tool_s
        self.tool_result = list(tool_result)
        self.turn_tokens = turn_tokens
        self.fail = fail

    @staticmethod
    def _make_request_id(priority: int, full_determinism: bool) -> str:  # ToolAgentLoop._make_request_id
        return f"det-{priority}" if full_determinism else uuid.uuid4().hex

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        metrics: dict[str, Any] = {}
        request_id = self._make_request_id(priority, self.rollout_config.full_determinism)
        agent_data = AgentData(kwargs.get("raw_prompt"), request_id, metrics)
        await self._handle_pending_state(agent_data, kwargs.get("prompt_ids"))
        state = "generating"
        while state != "terminated":
            if state == "generating":
                state = await self._handle_generating_state(agent_data, sampling_params)
            else:
                state = await self._handle_processing_tools_state(agent_data)
        n = len(agent_data.response_mask)
        response_ids = agent_data.prompt_ids[-n:] if n else []
        prompt_ids = agent_data.prompt_ids[: len(agent_data.prompt_ids) - n]
        output = AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids[: self.response_length],
            response_mask=agent_data.response_mask[: self.response_length], multi_modal_data={},
            mm_processor_kwargs=agent_data.mm_processor_kwargs, mm_processor_output=agent_data.mm_processor_output,
            response_logprobs=agent_data.response_logprobs[: self.response_length]
            if agent_data.response_logprobs else None,
            num_turns=agent_data.user_turns + agent_data.assistant_turns + 1,
            metrics=agent_data.metrics, extra_fields=agent_data.extra_fields)
        output.extra_fields.update({"turn_scores": [], "tool_rewards": []})
        return output

    async def _handle_pending_state(self, agent_data: AgentData, prompt_ids: Any = None) -> str:
        if prompt_ids is None:
            messages = list(agent_data.messages)
            prompt_ids = await self.loop.run_in_executor(None, lambda: self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs))
            if not isinstance(prompt_ids, list):  # a BatchEncoding
                prompt_ids = list(prompt_ids["input_ids"])
        agent_data.prompt_ids = self._cap_text_prompt_length([int(i) for i in prompt_ids])
        return "generating"

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> str:
        tokens = self.turn_tokens
        if isinstance(tokens, Sequence):
            tokens = tokens[min(agent_data.assistant_turns, len(tokens) - 1)]
        if tokens is not None:
            sampling_params = {**sampling_params, "max_tokens": int(tokens)}
        output: TokenOutput = await self.server_manager.generate(  # exactly ToolAgentLoop's call
            request_id=agent_data.request_id,
            prompt_ids=agent_data.prompt_ids,
            sampling_params=sampling_params,
            image_data=agent_data.image_data,
            video_data=agent_data.video_data,
            mm_processor_output=agent_data.mm_processor_output,
            audio_data=agent_data.audio_data,
            mm_processor_kwargs=agent_data.mm_processor_kwargs,
        )
        if not agent_data.extra_fields:
            agent_data.extra_fields.update(output.extra_fields)
        agent_data.assistant_turns += 1
        agent_data.response_ids = output.token_ids
        agent_data.prompt_ids = agent_data.prompt_ids + output.token_ids
        agent_data.response_mask += [1] * len(output.token_ids)
        if output.log_probs or agent_data.response_logprobs:
            agent_data.response_logprobs += output.log_probs or [0.0] * len(output.token_ids)
        if len(agent_data.response_mask) >= self.response_length:
            return "terminated"
        if self.max_assistant_turns and agent_data.assistant_turns >= self.max_assistant_turns:
            return "terminated"
        if self.max_user_turns and agent_data.user_turns >= self.max_user_turns:
            return "terminated"
        agent_data.tool_calls = [FunctionCall(arguments="{}", name="echo")]
        return "processing_tools"

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> str:
        calls = agent_data.tool_calls[: self.max_parallel_calls]
        responses = await asyncio.gather(*[self._call_tool(c, agent_data) for c in calls])
        for ids in responses:
            agent_data.prompt_ids = agent_data.prompt_ids + ids
            agent_data.response_mask += [0] * len(ids)
            if agent_data.response_logprobs:
                agent_data.response_logprobs += [0.0] * len(ids)
        if len(agent_data.response_mask) >= self.response_length:
            return "terminated"
        agent_data.user_turns += 1
        return "generating"

    async def _call_tool(self, tool_call: FunctionCall, agent_data: AgentData) -> list[int]:
        await asyncio.sleep(self.tool_s)
        if self.fail:
            raise RuntimeError("sandbox died")
        return list(self.tool_result)


# ----- one GRPO group, run as verl's AgentLoopWorker runs it -----

@dataclass
class Episode:
    """One member of a group: its trajectory id (None without hints), the model's tokens of each turn, the loop's
    output (``reward_score`` assigned after ``run``, as verl does)."""

    trajectory_id: str | None
    turns: list[list[int]]
    output: Any

    @property
    def reward_score(self) -> Any:
        return self.output.reward_score


def model_turns(output: Any) -> list[list[int]]:
    """The model's tokens of each turn: the runs of ``response_mask`` 1 in ``response_ids``."""
    turns: list[list[int]] = []
    previous = 0
    for token, mask in zip(output.response_ids, output.response_mask):
        if mask and not previous:
            turns.append([])
        if mask:
            turns[-1].append(token)
        previous = mask
    return turns


async def run_group(agent_loop: Any, server_manager: Any, tokenizer: Any, prompt: Any, n: int = 4, *,
                    tool_s: float = 0.0, front_url: str | None = None, turn_tokens: int | Sequence[int] | None = 8,
                    sampling_params: Mapping[str, Any] | None = None, uid: str | None = None,
                    task: str | None = None, report_requests: bool = False, carry_id: bool = True,
                    score: Callable[[Any], float] | None = None, rollout: RolloutConfig | None = None,
                    tool_result: Sequence[int] = TOOL_RESULT, flush_timeout_s: float = 10.0,
                    **loop_kwargs: Any) -> list[Episode]:
    """Run one GRPO group of ``n`` episodes concurrently on the running event loop and return them in order.

    ``agent_loop``: None for the default, ``ProrsaAgentLoop`` around ``EchoToolAgentLoop`` with hints to
    ``front_url`` (``EchoToolAgentLoop`` alone when ``front_url`` is None): model turn, ``echo`` tool (``tool_s``
    seconds, answers ``tool_result``), model turn. ``turn_tokens``: tokens per model turn, an int (the turns are the
    rollout config's ``max_assistant_turns``, default 2) or one entry per turn. Else a class or factory, called per
    episode with verl's constructor keywords and ``loop_kwargs``. ``server_manager``: e.g.
    ``InProcessServerManager(tokenizer_manager)``, which sends verl's request exactly, the trajectory id inside its
    sampling params as the loop put it. ``prompt``: token ids, chat messages or a string (one user message;
    ``tokenizer`` applies the chat template). ``sampling_params``: default verl's greedy validation parameters with
    log-probs, plus ``ignore_eos`` so that every turn makes ``turn_tokens`` tokens. ``carry_id``: the loop puts the
    trajectory id in each request's sampling params (a sglang-prorsa engine reads it there and strips it before
    sampling). ``report_requests``: the loop reports the request events too (off by default: a sglang-prorsa engine
    reports them itself under the carried id). ``score``: the reward verl would assign to each output after ``run``
    (default 1.0); it is assigned only where verl would (the reward-model keys of the rollout's trainer config). Hints
    are flushed before returning; ``aclose()`` of ``integrations.verl`` closes the clients."""
    rollout = rollout or getattr(server_manager, "rollout", None) or RolloutConfig()
    if isinstance(turn_tokens, Sequence):  # one model turn per entry
        rollout = dataclasses.replace(rollout, multi_turn=dataclasses.replace(
            rollout.multi_turn, max_assistant_turns=len(turn_tokens)))
    config = trainer_config(rollout)
    if agent_loop is None:
        echo = dict(tool_s=tool_s, tool_result=tool_result, turn_tokens=turn_tokens)
        if front_url is None:
            def agent_loop(**kw: Any) -> Any:
                return EchoToolAgentLoop(**kw, **echo)
        else:
            def agent_loop(**kw: Any) -> Any:
                return ProrsaAgentLoop(**kw, agent_loop=EchoToolAgentLoop, hints_url=front_url, task=task,
                                       report_requests=report_requests, carry_id=carry_id, **echo)
    params = dict(sampling_params) if sampling_params is not None else {
        **verl_sampling_params(rollout, validate=True), "ignore_eos": True}
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    as_ids = bool(prompt) and all(isinstance(i, int) for i in prompt)
    uid = uid or str(uuid.uuid4())

    async def episode(i: int) -> Episode:
        loop = agent_loop(trainer_config=DictConfigWrap(config), server_manager=server_manager, tokenizer=tokenizer,
                          processor=None, hf_model_type=None, dataset_cls=None, data_config=DictConfigWrap({}),
                          tools=ToolListWrap([]), **loop_kwargs)
        sample = {"uid": uid, "index": 0, "priority": i, "raw_prompt": None if as_ids else list(prompt)}
        if as_ids:
            sample["prompt_ids"] = list(prompt)
        output = await loop.run(dict(params), **sample)
        # AgentLoopWorker._agent_loop_postprocess -> _compute_score: the worker scores after run returns
        if output.reward_score is None and reward_mode(config) == "after_run":
            output.reward_score = 1.0 if score is None else score(output)
        return Episode(output.extra_fields.get(OUTPUT_KEY), model_turns(output), output)

    episodes = list(await asyncio.gather(*[episode(i) for i in range(n)]))
    await flush(flush_timeout_s)  # this loop's hint clients (none without hints)
    return episodes
