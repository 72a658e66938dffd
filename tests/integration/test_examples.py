"""The runnable examples under examples/ against a real engine, each as its own process, bounded in time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONSAFEPATH="1")
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def finished(url: str) -> int:
    return requests.get(url + "/lifecycle/status", timeout=10).json()["finished_trajectories"]


def test_grpo_asyncio_example(single_server):
    before = finished(single_server.url)
    out = run_example("grpo_asyncio.py", "--url", single_server.url, "--steps", "2", "--groups", "2",
                      "--group-size", "3", "--turns", "2", "--max-new-tokens", "8", "--report-requests")
    assert out["steps"] == 2 and out["trajectories"] == 2 * 2 * 3
    assert out["model_tokens"] == 12 * 2 * 8 and out["tool_tokens"] > 0  # ignore_eos: every turn is 8 tokens
    assert len(out["losses"]) == 2
    hints = out["hints"]
    assert hints["sent"] == hints["enqueued"] > 0 and hints["failed"] == hints["rejected"] == 0
    assert finished(single_server.url) - before == 12  # every trajectory reached reward_end


def test_verl_agent_loop_example(single_server):
    before = finished(single_server.url)
    out = run_example("verl_agent_loop.py", "--url", single_server.url, "--batch", "2", "--n", "2",
                      "--max-turns", "2", "--max-tokens", "8")
    assert out["outputs"] == 4 and out["aligned"] is True and out["trajectories"] == 4
    assert out["num_turns"] == [4] * 4 and out["model_tokens"] == 4 * 2 * 8
    hints = out["hints"]
    assert hints["sent"] == hints["enqueued"] > 0 and hints["failed"] == hints["rejected"] == 0
    assert finished(single_server.url) - before == 4
