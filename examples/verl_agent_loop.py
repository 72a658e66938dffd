"""An adapter that runs a verl-style agent loop on sglang-prorsa, written against the shape of verl's agent-loop API.

verl drives multi-turn rollouts through ``AgentLoopBase.run(sampling_params, **kwargs) -> AgentLoopOutput`` and gets
tokens from ``AsyncLLMServerManager.generate(request_id, *, prompt_ids, sampling_params, image_data=None)``, which
returns a ``TokenOutput`` (``token_ids``, ``log_probs``); ``request_id`` is the trajectory's sticky-session key. This
file provides:

- ``ProrsaServerManager``: that ``generate`` signature over the SDK, with ``request_id`` sent as the trajectory id, plus
  ``trajectory(request_id)`` for the lifecycle hints verl does not send (sampled, sandbox, tool, reward, aborted);
- ``ProrsaToolAgentLoop``: a tool-calling agent loop in verl's shape (chat template, model turn, tool turn with
  response_mask 0, log-probs, reward) that reports its lifecycle through the manager.

With verl installed the real ``AgentLoopBase`` / ``AgentLoopOutput`` are used (register the loop under a name in your
agent-loop config and hand ``ProrsaServerManager`` the server address); without it, minimal stand-ins of the same shape
let this file run on its own:

    python examples/verl_agent_loop.py --url http://127.0.0.1:30000 --batch 2 --n 4

The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

from sglang_prorsa.client import AsyncProrsaClient, AsyncTrajectory, HintConfig

try:  # the real API when verl is installed
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
except ImportError:  # stand-ins with the same constructor, method and fields (no behaviour of verl's is needed here)

    class AgentLoopBase:  # type: ignore[no-redef]
        def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any = None,
                     **kwargs: Any) -> None:
            self.config = trainer_config.config
            self.server_manager = server_manager
            self.tokenizer = tokenizer
            self.processor = processor
            self.loop = asyncio.get_running_loop()

    @dataclass
    class AgentLoopOutput:  # type: ignore[no-redef]
        prompt_ids: list[int]
        response_ids: list[int]
        response_mask: list[int]
        response_logprobs: Optional[list[float]] = None
        multi_modal_data: Optional[dict] = None
        reward_score: Optional[float] = None
        num_turns: int = 0
        metrics: dict = field(default_factory=dict)
        extra_fields: dict = field(default_factory=dict)


@dataclass
class TokenOutput:
    """The shape of verl's ``TokenOutput``: generated ids and their log-probabilities."""

    token_ids: list[int]
    log_probs: Optional[list[float]] = None
    stop_reason: Optional[str] = None


def to_sglang_sampling(params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """verl's sampling params -> SGLang's, and whether log-probs were asked for (verl's ``logprobs`` flag)."""
    out = {k: v for k, v in params.items() if k not in ("logprobs", "max_tokens")}
    if "max_tokens" in params:
        out["max_new_tokens"] = params["max_tokens"]
    return out, bool(params.get("logprobs", False))


class ProrsaServerManager:
    """``AsyncLLMServerManager.generate``'s signature over an sglang-prorsa address (our front routes and balances, so
    no per-server choice is made here); the trajectory id is verl's sticky-session ``request_id``."""

    def __init__(self, client: AsyncProrsaClient) -> None:
        self.client = client
        self._trajectories: dict[str, AsyncTrajectory] = {}

    def trajectory(self, request_id: str, **kwargs: Any) -> AsyncTrajectory:
        t = self.client.trajectory(trajectory_id=request_id, **kwargs)
        self._trajectories[request_id] = t
        return t

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Optional[list[Any]] = None) -> TokenOutput:
        if image_data:
            raise ValueError("field 'image_data': this adapter sends token ids only")
        sp, want_logprobs = to_sglang_sampling(sampling_params)
        t = self._trajectories.get(request_id)
        if t is not None:  # inside the agent loop's trajectory: turn counter and context follow
            g = await t.generate(prompt_ids, sampling_params=sp, return_logprob=want_logprobs)
        else:
            g = await self.client.generate(prompt_ids, sampling_params=sp, return_logprob=want_logprobs,
                                           trajectory_id=request_id)
        reason = g.finish_reason.get("type") if isinstance(g.finish_reason, dict) else g.finish_reason
        return TokenOutput(token_ids=g.output_ids, log_probs=g.output_logprobs, stop_reason=reason)

    def forget(self, request_id: str) -> None:
        self._trajectories.pop(request_id, None)


class ProrsaToolAgentLoop(AgentLoopBase):
    """Model turn, tool turn, ... then reward, in verl's agent-loop shape, with sglang-prorsa lifecycle hints."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        rollout = self.config.actor_rollout_ref.rollout
        messages = list(kwargs["raw_prompt"])
        request_id = uuid.uuid4().hex
        prompt_ids = await self.loop.run_in_executor(
            None, lambda: _ids(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                  tokenize=True)))
        response_ids: list[int] = []
        response_mask: list[int] = []
        logprobs: list[float] = []
        metrics = {"generate_sequences": 0.0, "tool_calls": 0.0}
        manager: ProrsaServerManager = self.server_manager
        async with manager.trajectory(request_id, task=kwargs.get("agent_name", "tool_agent"),
                                      group_id=kwargs.get("group_id"), prompt_tokens=len(prompt_ids)) as t:
            try:
                for turn in range(rollout.multi_turn.max_assistant_turns):
                    t0 = time.perf_counter()
                    out = await manager.generate(request_id, prompt_ids=prompt_ids + response_ids,
                                                 sampling_params=sampling_params)
                    metrics["generate_sequences"] += time.perf_counter() - t0
                    response_ids += out.token_ids
                    response_mask += [1] * len(out.token_ids)
                    logprobs += out.log_probs or [0.0] * len(out.token_ids)
                    if turn == rollout.multi_turn.max_assistant_turns - 1 or len(response_ids) >= rollout.response_length:
                        break
                    t0 = time.perf_counter()
                    with t.tool("echo") as call:
                        text = await self.loop.run_in_executor(None, self.tokenizer.decode, out.token_ids)
                        tool_ids = self.tokenizer(f" tool: {len(text)} chars.", add_special_tokens=False)["input_ids"]
                        call.result_tokens = len(tool_ids)
                    metrics["tool_calls"] += time.perf_counter() - t0
                    response_ids += tool_ids
                    response_mask += [0] * len(tool_ids)
                    logprobs += [0.0] * len(tool_ids)
                with t.reward() as r:
                    reward = float(len(set(response_ids)) / max(1, len(response_ids)))
                    r.accepted = True
            finally:
                manager.forget(request_id)
        n = rollout.response_length
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response_ids[:n], response_mask=response_mask[:n],
                               response_logprobs=logprobs[:n], reward_score=reward, num_turns=2 * t.turn,
                               metrics=metrics)


def _ids(encoded: Any) -> list[int]:
    return list(encoded if isinstance(encoded, list) else encoded["input_ids"])


def trainer_config(response_length: int, max_turns: int, n: int) -> SimpleNamespace:
    """The slice of verl's trainer config the loop reads (``config.actor_rollout_ref.rollout...``)."""
    rollout = SimpleNamespace(response_length=response_length, n=n,
                              multi_turn=SimpleNamespace(max_assistant_turns=max_turns))
    return SimpleNamespace(config=SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout)))


async def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--tokenizer", default=None, help="tokenizer path (default: the embedded tiny model)")
    ap.add_argument("--batch", type=int, default=2, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="rollouts per prompt (GRPO group size)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--response-length", type=int, default=256)
    ap.add_argument("--report-requests", action="store_true")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from sglang_prorsa.testing.tiny_model import ensure_default_model

        args.tokenizer = str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = trainer_config(args.response_length, args.max_turns, args.n)
    # What verl's AgentLoopWorker.generate_sequences builds from its rollout config.
    sampling_params = {"temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0, "logprobs": True,
                       "max_tokens": args.max_tokens, "ignore_eos": True}
    prompts = [[{"role": "user", "content": f"task {i}: fix the failing test and report"}] for i in range(args.batch)]
    async with AsyncProrsaClient(args.url, hints=HintConfig(report_requests=args.report_requests)) as client:
        manager = ProrsaServerManager(client)
        t0 = time.perf_counter()
        runs = [ProrsaToolAgentLoop(config, manager, tokenizer, None).run(
                    sampling_params, raw_prompt=messages, agent_name="tool_agent", group_id=f"prompt-{i}")
                for i, messages in enumerate(prompts) for _ in range(args.n)]
        outputs = await asyncio.gather(*runs)
        elapsed = time.perf_counter() - t0
        await client.flush_hints()
        hints = client.hint_stats.to_dict()
    summary = {
        "outputs": len(outputs),
        "elapsed_s": round(elapsed, 3),
        "num_turns": [o.num_turns for o in outputs],
        "model_tokens": sum(sum(o.response_mask) for o in outputs),
        "aligned": all(len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs) for o in outputs),
        "rewards": [round(o.reward_score, 4) for o in outputs],
        "hints": hints,
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
