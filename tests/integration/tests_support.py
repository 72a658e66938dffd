"""Prompts and request helpers shared by the integration tests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import requests

from sglang_prorsa.srt.utils import processes
from sglang_prorsa.testing import front_client

PROMPTS = [
    "the agent calls a tool and reads the result",
    "def solve(x): return x plus one",
    "Hello world. question answer step think plan observe act",
    # Longer than the 64-token chunked-prefill chunk the test servers use: prefill runs in several chunks.
    " ".join(["the sandbox runs the failing test then the agent writes code to fix it"] * 8),
]


def sampling(max_new: int) -> dict:
    return {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}


def generate_ids(url: str, input_ids: list[int], max_new: int) -> list[int]:
    r = requests.post(url + "/generate", json={"input_ids": input_ids, "sampling_params": sampling(max_new)},
                      timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


@contextmanager
def running_front(log_dir: Path, store_flags: list[str], n_instances: int = 3) -> Iterator[processes.ServerProcess]:
    """An adaptive front over ``n_instances`` engine instances (1 prefill first), switching only on request; ended
    by PID when the block exits."""
    port = processes.free_port()
    srv = processes.start(
        ["--pd-adaptive", "--prorsa-instances", str(n_instances), "--prorsa-initial-prefill", "1",
         "--prorsa-manual-switch", "--prorsa-min-dwell", "0", *store_flags, "--prorsa-log-dir", str(log_dir),
         "--host", processes.LOOPBACK, "--port", str(port), "--chunked-prefill-size", "64",
         "--max-total-tokens", "65536", "--log-level", "warning"],
        name=f"adaptive-front-{port}", port=port, log_dir=log_dir)
    try:
        srv.wait_ready(timeout=600)
        yield srv
    finally:
        srv.stop(grace_s=20)


def instances(front) -> list[dict]:
    return front_client.instances(front.url)


def status(url: str) -> dict:
    return front_client.instance_status(url)


def arrange(front, prefill: int, decode: int) -> None:
    """Switch idle instances until the roles are ``prefill`` : ``decode``."""
    insts = front_client.arrange(front.url, prefill)
    assert len(insts) - prefill == decode


def generate(front, ids: list[int], max_new: int) -> tuple[int, dict]:
    r = requests.post(front.url + "/generate", json={"input_ids": ids, "sampling_params": sampling(max_new)},
                      timeout=600)
    return r.status_code, r.json()


def run_all(front, prompts, max_new) -> list[tuple[int, dict]]:
    with ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(lambda p: generate(front, p, max_new), prompts))


def flush_prefix_caches(front) -> None:
    for inst in instances(front):
        if inst["role"] == "prefill":
            assert requests.post(inst["url"] + "/flush_cache", timeout=30).status_code == 200


def computed_tokens(front) -> int:
    return sum(int(status(i["url"])["counters"].get("prompt_tokens_computed", 0)) for i in instances(front))


def distinct_prompts(n: int, length, seed: int) -> list[list[int]]:
    # Distinct first tokens: no two prompts share a cached prefix, so computed-token counts are exact.
    return [[10 + i] + [(seed * 131 + i * 37 + j * 11) % 900 + 20 for j in range(length(i) - 1)] for i in range(n)]


