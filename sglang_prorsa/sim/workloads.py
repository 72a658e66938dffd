"""Workloads the simulator can run: the paper's three tasks (workload/presets.py) and mixed batches of them.

A workload name is a task (``math``, ``coding_agent``, ``general_agent``) or a ``+``-joined mix of tasks, e.g.
``math+coding_agent``: the training batch is made of whole GRPO groups of each task in turn (group k takes task
k mod len(mix)), every group drawn from its own task's distributions. Mixed batches are how RL recipes train
several skills at once, and they make the prefill:decode mix shift inside a step: a math group prefills a short prompt
then decodes for minutes; an agent group alternates short decodes with long-context prefills for as long as its tools
run. The shifting-mix benchmark uses them (bench_sim_grid.py ``--shift``).

``research_agent`` and ``document_agent`` are tasks of our own, shaped after deep-research / long-document agents:
retrieval turns that append large documents and answer briefly (prefill heavy). Their numbers are ASSUMED, like the
presets'; they exist to test a shifting mix, not to claim a measured workload.
"""

from __future__ import annotations

from dataclasses import replace

from sglang_prorsa.workload.presets import GENERAL_AGENT, TASKS, LogNormal, TaskProfile, ToolSpec

# Both share the general agent's sandbox, dispatch, overhead and reward timings; they differ in turns, prompts, outputs
# and tools.
RESEARCH_AGENT = replace(
    GENERAL_AGENT,
    name="research_agent",
    turns=LogNormal(10, 0.3, 4, 30),
    first_prompt_tokens=LogNormal(2000, 0.3, 500, 8000),
    output_tokens=LogNormal(600, 0.6, 50, 16000),
    tools=(
        ToolSpec("fetch", 0.7, LogNormal(6.0, 0.5, 0.5, 60), LogNormal(9000, 0.4, 1000, 40000)),
        ToolSpec("search", 0.3, LogNormal(3.0, 0.5, 0.3, 30), LogNormal(3000, 0.5, 200, 12000)),
    ),
)

# A long-document agent: every turn reads a large document (tool result ~10k tokens) and answers briefly, for many
# turns, so its context (and the prefill a prefix-cache miss costs) grows turn after turn. Mixed with math, whose
# requests all arrive at the step's start and decode for minutes, the step goes from decode-bound to prefill-bound.
DOCUMENT_AGENT = replace(
    GENERAL_AGENT,
    name="document_agent",
    turns=LogNormal(16, 0.2, 8, 30),
    first_prompt_tokens=LogNormal(3000, 0.3, 500, 8000),
    output_tokens=LogNormal(200, 0.5, 20, 2000),
    tools=(ToolSpec("read", 1.0, LogNormal(30.0, 0.3, 5, 120), LogNormal(10000, 0.3, 2000, 30000)),),
    reward_s=LogNormal(5.0, 0.5, 1, 60),
)

SIM_TASKS: dict[str, TaskProfile] = {**TASKS, RESEARCH_AGENT.name: RESEARCH_AGENT, DOCUMENT_AGENT.name: DOCUMENT_AGENT}


def workload_tasks(name: str) -> list[TaskProfile]:
    """The tasks of workload ``name`` in group order (one entry per task of a mix)."""
    parts = name.split("+")
    unknown = [p for p in parts if p not in SIM_TASKS]
    if unknown:
        raise ValueError(f"unknown task {unknown[0]!r} in workload {name!r}; tasks: {sorted(SIM_TASKS)}")
    return [SIM_TASKS[p] for p in parts]


def default_group_size(name: str) -> int:
    """§5.1: 8 for math, 32 for the agentic tasks (a mix uses the agentic size when it has an agentic task)."""
    return 8 if all(p == "math" for p in name.split("+")) else 32
