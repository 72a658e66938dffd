"""A plain asyncio GRPO-style rollout loop on the sglang-prorsa trainer SDK.

Each step samples ``--groups`` prompts; each prompt runs as a GRPO group of ``--group-size`` agentic trajectories
(multi-turn: the model answers, a tool runs, its output joins the context, the model answers again), all concurrent.
The SDK carries every trajectory's id to the engine and streams its lifecycle hints (sampled, sandbox, tool, reward)
in the background, so the server can forecast prefill and decode demand. After the rollout the group-normalised
advantages and a GRPO-style surrogate loss are computed from the returned log-probabilities (a stand-in for the
training step), and optionally new weights are loaded (``--update-weights PATH``).

    python examples/grpo_asyncio.py --url http://127.0.0.1:30000 --steps 2 --groups 2 --group-size 4

Tokens in, tokens out: prompts are tokenised here (``--tokenizer``, default: the embedded tiny model's) and the
response mask marks model tokens (1) apart from tool tokens (0), as RL trainers need. The last line printed is a JSON
summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

from sglang_prorsa.client import AsyncProrsaClient, AsyncTrajectory, HintConfig, grpo_advantages

PROMPTS = [
    "plan the fix: the failing test reads a file then writes the result",
    "question: what is two plus three? think step by step",
    "the agent opens the file, runs the tests and reads the error",
    "write a function that returns the sum of a list",
]


@dataclass
class Rollout:
    """One trajectory as a trainer keeps it."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: model token, 0: tool token
    response_logprobs: list[float] = field(default_factory=list)  # 0.0 for tool tokens
    reward: float = 0.0
    turns: int = 0


def run_tool(text: str) -> str:
    """A toy tool: counts what the model wrote (a real agent would run code or search here)."""
    words = text.split()
    return f" tool: {len(words)} words, {sum(c.isdigit() for c in text)} digits."


def score(text: str) -> float:
    """A toy reward with spread across a group: the share of distinct words in the answers."""
    words = text.split()
    return len(set(words)) / len(words) if words else 0.0


async def episode(t: AsyncTrajectory, tokenizer, prompt_ids: list[int], turns: int, sampling: dict) -> Rollout:
    out = Rollout(prompt_ids=list(prompt_ids))
    with t.sandbox("prewarm"):  # e.g. start a container; here there is nothing to start
        await asyncio.sleep(0)
    answer_text = ""
    for turn in range(turns):
        g = await t.generate(out.prompt_ids + out.response_ids, sampling_params=sampling)
        out.response_ids += g.output_ids
        out.response_mask += [1] * len(g.output_ids)
        out.response_logprobs += g.output_logprobs or [0.0] * len(g.output_ids)
        out.turns += 1
        answer_text += g.text
        if turn == turns - 1:
            break
        with t.tool("count") as call:
            observation = await asyncio.to_thread(run_tool, g.text)
            obs_ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
            call.result_tokens = len(obs_ids)
        out.response_ids += obs_ids
        out.response_mask += [0] * len(obs_ids)
        out.response_logprobs += [0.0] * len(obs_ids)
    with t.reward() as r:
        out.reward = await asyncio.to_thread(score, answer_text)
        r.accepted = True
    return out


def grpo_loss(groups: list[list[Rollout]]) -> float:
    """-mean over trajectories of advantage x (sum of the model tokens' log-probabilities): the on-policy GRPO
    surrogate's value (a trainer would back-propagate it through the policy)."""
    terms = []
    for group in groups:
        for adv, ro in zip(grpo_advantages([ro.reward for ro in group]), group):
            terms.append(adv * sum(lp for lp, m in zip(ro.response_logprobs, ro.response_mask) if m))
    return -sum(terms) / len(terms)


async def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--hints-url", default=None, help="where /lifecycle lives if not at --url")
    ap.add_argument("--tokenizer", default=None, help="tokenizer path (default: the embedded tiny model)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--update-weights", default=None, help="checkpoint to load after each step (update_weights_from_disk)")
    ap.add_argument("--report-requests", action="store_true",
                    help="the client reports request arrival itself (hints to a control plane that sees no requests)")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from sglang_prorsa.testing.tiny_model import ensure_default_model

        args.tokenizer = str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    rng = random.Random(args.seed)
    summary = {"steps": 0, "trajectories": 0, "model_tokens": 0, "tool_tokens": 0, "losses": []}
    hints = HintConfig(report_requests=args.report_requests)
    async with AsyncProrsaClient(args.url, hints_url=args.hints_url, hints=hints) as client:
        for step in range(args.steps):
            t0 = time.perf_counter()
            prompts = [rng.choice(PROMPTS) for _ in range(args.groups)]
            sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                        "ignore_eos": True}

            async def group(prompt: str) -> list[Rollout]:
                ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                    add_generation_prompt=True, tokenize=True)
                ids = list(ids if isinstance(ids, list) else ids["input_ids"])  # newer transformers return a BatchEncoding
                return await client.run_group(
                    args.group_size, lambda t: episode(t, tokenizer, ids, args.turns, sampling),
                    task="toy_agent", prompt_tokens=len(ids))

            groups = await asyncio.gather(*(group(p) for p in prompts))
            loss = grpo_loss(groups)
            rollouts = [ro for g in groups for ro in g]
            summary["steps"] += 1
            summary["trajectories"] += len(rollouts)
            summary["model_tokens"] += sum(sum(ro.response_mask) for ro in rollouts)
            summary["tool_tokens"] += sum(len(ro.response_mask) - sum(ro.response_mask) for ro in rollouts)
            summary["losses"].append(loss)
            mean_reward = sum(ro.reward for ro in rollouts) / len(rollouts)
            print(f"step {step}: {len(rollouts)} trajectories in {time.perf_counter() - t0:.2f} s, "
                  f"mean reward {mean_reward:.3f}, GRPO loss {loss:.3f}", flush=True)
            if args.update_weights:
                res = await client.update_weights_from_disk(args.update_weights, weight_version=f"step-{step + 1}")
                print(f"weights: {res.get('message', res)}", flush=True)
        await client.flush_hints()
        summary["hints"] = client.hint_stats.to_dict()
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
