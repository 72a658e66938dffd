"""verl 0.9.1's agent-loop classes, copied field for field (verl is not importable here: its package imports ``ray``
on import). Each names the verl source it mirrors; only what ``integrations/verl.py`` and a two-turn tool episode touch
is reproduced. The drivers that run them (a server manager, a tool loop, a GRPO group) are in ``verl_shapes``, which
also re-exports everything here.

- ``AgentLoopMetrics``, ``AgentLoopOutput``, ``DictConfigWrap``, ``ToolListWrap``, ``AgentLoopBase`` (without verl's
  Continuous Token builder), ``register``; ``TokenOutput``; ``AgentData``, ``FunctionCall``.
- ``MultiTurnConfig``, ``RolloutConfig``, ``trainer_config``: the slice of verl's config those classes read;
  ``verl_sampling_params``: what ``AgentLoopWorker.generate_sequences`` hands every loop.
- ``sglang_request``, ``token_output``: ``SGLangHttpServer.generate``'s request dict from the loop's arguments, and its
  ``TokenOutput`` from SGLang's answer.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional

from pydantic import BaseModel

# ----- verl/experimental/agent_loop/agent_loop.py -----

class AgentLoopMetrics(BaseModel):  # agent_loop.py AgentLoopMetrics
    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):  # agent_loop.py AgentLoopOutput (as_dict, which needs torch, left out)
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: Optional[list[float]] = None
    routed_experts: Optional[Any] = None
    multi_modal_data: Optional[dict[str, Any]] = None
    reward_score: Optional[float] = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}
    mm_processor_kwargs: Optional[dict[str, Any]] = None
    mm_processor_output: Optional[list[dict[str, Any]]] = None


class DictConfigWrap:  # agent_loop.py: keeps hydra.utils.instantiate from resolving the config
    def __init__(self, config: Any) -> None:
        self.config = config


class ToolListWrap:  # agent_loop.py
    def __init__(self, tools: list) -> None:
        self.tools = tools


_agent_loop_registry: dict[str, dict] = {}  # agent_loop.py: agent_name -> hydra config


def register(agent_name: str) -> Callable[[type], type]:  # agent_loop.py register
    def decorator(subclass: type) -> type:
        _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
        return subclass

    return decorator


def _event_loop() -> asyncio.AbstractEventLoop | None:
    """verl.utils.ray_utils.get_event_loop, without creating a loop outside one (verl builds loops on its loop)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AgentLoopBase(ABC):  # agent_loop.py AgentLoopBase: same constructor (no Continuous Token builder)
    def __init__(self, trainer_config: DictConfigWrap, server_manager: Any, tokenizer: Any, processor: Any,
                 dataset_cls: Any, data_config: DictConfigWrap, hf_model_type: str | None = None,
                 **kwargs: Any) -> None:
        self.config = trainer_config.config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.data_config = data_config.config
        self.apply_chat_template_kwargs = self.data_config.get("apply_chat_template_kwargs", {})
        self.mm_processor_kwargs = self.data_config.get("mm_processor_kwargs", {})
        self.loop = _event_loop()

    def _get_mm_processor_kwargs(self, audio_data: Optional[list[Any]] = None) -> dict[str, Any]:
        return dict(self.mm_processor_kwargs or {})

    def _cap_text_prompt_length(self, prompt_ids: list[int]) -> list[int]:
        n = self.rollout_config.prompt_length
        return prompt_ids[-n:] if len(prompt_ids) > n else prompt_ids

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        raise NotImplementedError


# ----- verl/workers/rollout/replica.py -----

class TokenOutput(BaseModel):  # replica.py TokenOutput
    token_ids: list[int]
    log_probs: Optional[list[float]] = None
    routed_experts: Optional[Any] = None
    stop_reason: Optional[str] = None
    num_preempted: Optional[int] = None
    extra_fields: dict[str, Any] = {}


# ----- the slice of verl's config the classes above read -----

@dataclass
class MultiTurnConfig:  # verl/workers/config/rollout.py MultiTurnConfig (the fields ToolAgentLoop reads)
    max_user_turns: Optional[int] = None
    max_assistant_turns: Optional[int] = 2
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"


@dataclass
class RolloutConfig:  # verl/workers/config/rollout.py RolloutConfig: what the agent loop and the SGLang server read
    name: str = "sglang"
    prompt_length: int = 8192  # verl left-truncates longer prompts
    response_length: int = 8192  # an episode ends once its response (model and tool tokens) reaches this
    max_model_len: int = 32768
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    calculate_log_probs: bool = True
    full_determinism: bool = False
    enable_rollout_routing_replay: bool = False
    skip_tokenizer_init: bool = False
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


def trainer_config(rollout: RolloutConfig | None = None, *, reward_model: bool = False,
                   rm_resource_pool: bool = False) -> SimpleNamespace:
    """verl's trainer config, the keys the agent loop reads: ``actor_rollout_ref.rollout``, ``reward.reward_model``
    (``enable``, ``enable_resource_pool``: whether the agent-loop worker scores after ``run``) and ``data``."""
    return SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(rollout=rollout or RolloutConfig()),
        reward=SimpleNamespace(reward_model=SimpleNamespace(enable=reward_model,
                                                            enable_resource_pool=rm_resource_pool)),
        data={})


def verl_sampling_params(rollout: RolloutConfig, validate: bool = False) -> dict[str, Any]:
    """What ``AgentLoopWorker.generate_sequences`` hands every loop (``validate``: its greedy override)."""
    params = dict(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k, repetition_penalty=1.0,
                  logprobs=rollout.calculate_log_probs)
    if validate:
        params.update(top_p=1.0, top_k=-1, temperature=0)
    return params


# ----- verl/workers/rollout/sglang_rollout/async_sglang_server.py: SGLangHttpServer.generate -----

def sglang_request(prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                   rollout: RolloutConfig) -> tuple[dict[str, Any], bool, Any]:
    """``SGLangHttpServer.generate``'s ``request`` dict (verl/workers/rollout/sglang_rollout/async_sglang_server.py,
    outside PD), with its return-logprob flag and prompt-logprobs count. Pops from ``sampling_params`` as verl does:
    pass a copy."""
    max_possible_tokens = rollout.max_model_len - len(prompt_ids) - 1
    if max_possible_tokens < 0:
        raise ValueError(f"Prompt length ({len(prompt_ids)}) exceeds the model's maximum context length "
                         f"({rollout.max_model_len}).")
    if "max_new_tokens" in sampling_params:
        max_new_tokens = sampling_params.pop("max_new_tokens")
    elif "max_tokens" in sampling_params:
        max_new_tokens = sampling_params.pop("max_tokens")
    else:
        max_new_tokens = min(rollout.response_length,
                             rollout.prompt_length + rollout.response_length - len(prompt_ids))
    max_new_tokens = max(0, min(max_new_tokens, max_possible_tokens))
    sampling_params["max_new_tokens"] = max_new_tokens
    return_logprob = sampling_params.pop("logprobs", False)
    prompt_logprobs = sampling_params.pop("prompt_logprobs", None)
    if prompt_logprobs is not None:
        return_logprob = True
    request: dict[str, Any] = {"rid": request_id, "input_ids": prompt_ids, "sampling_params": sampling_params,
                               "return_logprob": return_logprob, "image_data": None, "video_data": None}
    if prompt_logprobs is not None:
        request["logprob_start_len"] = 0
        if prompt_logprobs > 0:
            request["top_logprobs_num"] = prompt_logprobs
    if rollout.enable_rollout_routing_replay:
        request["return_routed_experts"] = True
    return request, bool(return_logprob), prompt_logprobs


def token_output(output: Mapping[str, Any], return_logprob: bool, rollout: RolloutConfig,
                 global_steps: Any = None, hf_config: Any = None) -> TokenOutput:
    """``SGLangHttpServer.generate``'s ``TokenOutput`` from SGLang's output dict (prompt logprobs and speculative
    decoding counters left out)."""
    meta_info = output.get("meta_info", {})
    finish_reason = meta_info.get("finish_reason")
    finish_reason = finish_reason["type"] if finish_reason else None
    log_probs: Optional[list[float]]
    if return_logprob:
        token_ids = list(output.get("output_ids", []))
        output_token_logprobs = meta_info.get("output_token_logprobs") or []
        if output_token_logprobs and len(output_token_logprobs) == len(token_ids):
            log_probs = [float(log_prob) for log_prob, _, _ in output_token_logprobs]
        else:
            token_ids, log_probs = [], []
    else:
        token_ids, log_probs = output["output_ids"], None
    routed_experts = None
    if rollout.enable_rollout_routing_replay:
        if rollout.skip_tokenizer_init:
            captured = meta_info.get("routed_experts", None)
            routed_experts = captured.numpy() if captured is not None else None
        else:
            from sglang.srt.layers.moe.routed_experts_capturer import extract_routed_experts_from_meta_info

            routed_experts = extract_routed_experts_from_meta_info(output).reshape(
                -1, hf_config.num_hidden_layers, hf_config.num_experts_per_tok)
    return TokenOutput(token_ids=token_ids, log_probs=log_probs, routed_experts=routed_experts,
                       stop_reason=finish_reason, extra_fields={"global_steps": global_steps})


# ----- verl/experimental/agent_loop/tool_agent_loop.py and tool_parser.py -----

@dataclass
class FunctionCall:  # verl/experimental/agent_loop/tool_parser.py FunctionCall
    arguments: str
    name: str
    tool_call_id: Optional[str] = None


class AgentData:  # tool_agent_loop.py AgentData (the fields used here)
    def __init__(self, messages: Any, request_id: str, metrics: dict[str, Any]) -> None:
        self.messages = messages
        self.image_data: Any = None
        self.video_data: Any = None
        self.audio_data: Any = None
        self.mm_processor_kwargs: dict[str, Any] = {}
        self.mm_processor_output: Any = None
        self.metrics = metrics
        self.request_id = request_id
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.user_turns = 0
        self.assistant_turns = 0
        self.tool_calls: list[FunctionCall] = []
        self.extra_fields: dict[str, Any] = {}
