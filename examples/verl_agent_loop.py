"""verl's agent loop with sglang-prorsa's lifecycle hints (``sglang_prorsa.integrations.verl``), run standalone.

In verl 0.9.1 nothing of this file is needed but the config: name ``ProrsaAgentLoop`` in the file given as
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` and select it for your samples (the dataset's
``agent_name`` column, or ``actor_rollout_ref.rollout.agent.default_agent_loop``)::

    - name: prorsa_tool_agent
      _target_: sglang_prorsa.integrations.verl.ProrsaAgentLoop
      hints_url: http://front:30000
      agent_loop: verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop

verl then builds it per sample with its own server manager, and it runs verl's ``ToolAgentLoop`` through that
manager, adding the hints. Without verl, this file plays verl's part with the stand-ins of
``sglang_prorsa.testing.verl_shapes``: ``AgentLoopWorker``'s per-sample construction and its reward assignment after
``run`` (``run_group``), a loop with ``ToolAgentLoop``'s states and one tool, and verl's generation path
(``LLMServerClient.generate`` -> ``SGLangHttpServer.generate``) with the request it builds posted to ``--url`` instead
of handed to an in-process tokenizer manager. The request is verl's exactly, the trajectory id inside its sampling
params (``custom_params.prorsa_trajectory_id``); the sglang-prorsa server reads it there and strips it before sampling,
as an in-process ``sglang_prorsa.engine.Engine`` does in verl:

    python examples/verl_agent_loop.py --url http://127.0.0.1:30000 --batch 2 --n 4

The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from sglang_prorsa.integrations import verl
from sglang_prorsa.testing.verl_shapes import (
    HttpServerManager,
    MultiTurnConfig,
    RolloutConfig,
    run_group,
    verl_sampling_params,
)


def score(output) -> float:
    """The reward verl's reward loop would compute (here: the share of distinct tokens in the response)."""
    return len(set(output.response_ids)) / max(1, len(output.response_ids))


async def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="the server, and where hints go")
    ap.add_argument("--tokenizer", default=None, help="tokenizer path (default: the embedded tiny model)")
    ap.add_argument("--batch", type=int, default=2, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="rollouts per prompt (GRPO group size)")
    ap.add_argument("--max-turns", type=int, default=3, help="model turns (a tool call between two)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per model turn")
    ap.add_argument("--tool-s", type=float, default=0.05, help="how long the tool runs")
    ap.add_argument("--response-length", type=int, default=256)
    ap.add_argument("--report-requests", action="store_true",
                    help="report request events from the loop too (for a stock SGLang, which does not read the id)")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from sglang_prorsa.testing.tiny_model import ensure_default_model

        args.tokenizer = str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    rollout = RolloutConfig(response_length=args.response_length,
                            multi_turn=MultiTurnConfig(max_assistant_turns=args.max_turns))
    manager = HttpServerManager(args.url, rollout)  # in verl: the server manager verl hands the loop
    # What verl's AgentLoopWorker.generate_sequences hands every loop, plus ignore_eos for fixed-length turns.
    sampling_params = {**verl_sampling_params(rollout), "ignore_eos": True}
    prompts = [f"task {i}: fix the failing test and report" for i in range(args.batch)]
    t0 = time.perf_counter()
    groups = await asyncio.gather(*[
        run_group(None, manager, tokenizer, prompt, args.n, tool_s=args.tool_s, front_url=args.url,
                  turn_tokens=args.max_tokens, sampling_params=sampling_params, task="tool_agent",
                  report_requests=args.report_requests, score=score, rollout=rollout)
        for prompt in prompts])
    elapsed = time.perf_counter() - t0
    await manager.aclose()
    await verl.flush()
    stats = [c.hint_stats.to_dict() for c in verl.clients()]
    await verl.aclose()
    outputs = [e.output for group in groups for e in group]
    summary = {
        "outputs": len(outputs),
        "elapsed_s": round(elapsed, 3),
        "num_turns": [o.num_turns for o in outputs],
        "model_tokens": sum(sum(o.response_mask) for o in outputs),
        "aligned": all(len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs or [])
                       for o in outputs),
        "rewards": [round(o.reward_score, 4) for o in outputs],
        "trajectories": len({e.trajectory_id for group in groups for e in group}),
        "hints": {k: sum(s[k] for s in stats) for k in stats[0] if k != "last_error"} if stats else {},
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
