"""Servers and request helpers shared by the integration tests (every server on 127.0.0.1, ended by PID)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import requests

from sglang_prorsa.srt.utils import processes
from sglang_prorsa.testing import front_client
from sglang_prorsa.testing.front_client import distinct_prompts, instance_status, instances  # noqa: F401

PROMPTS = [
    "the agent calls a tool and reads the result",
    "def solve(x): return x plus one",
    "Hello world. question answer step think plan observe act",
    # Longer than the 64-token chunked-prefill chunk the test servers use: prefill runs in several chunks.
    " ".join(["the sandbox runs the failing test then the agent writes code to fix it"] * 8),
]
PAGE = 1  # the CPU recipe's page size
LOGPROB_TOL = 1e-4  # fp32 on CPU: the same request in another batch differs by up to ~6e-6 (measured), switch or not

ENGINE_FLAGS = ["--chunked-prefill-size", "64", "--max-total-tokens", "65536", "--log-level", "warning"]


def sampling(max_new: int) -> dict:
    return front_client.sampling(max_new)


def generate_ids(url: str, input_ids: list[int], max_new: int) -> list[int]:
    r = requests.post(url + "/generate", json={"input_ids": input_ids, "sampling_params": sampling(max_new)},
                      timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


@contextmanager
def running_front(log_dir: Path, flags: list[str], n_instances: int = 3, initial_prefill: int = 1,
                  mode: str = "--pd-adaptive") -> Iterator[processes.ServerProcess]:
    """A front over ``n_instances`` engine instances, switching only on request; ended by PID when the block exits."""
    port = processes.free_port()
    mode_flags = [mode]
    if mode == "--pd-adaptive":
        mode_flags += ["--prorsa-instances", str(n_instances), "--prorsa-initial-prefill", str(initial_prefill),
                       "--prorsa-manual-switch", "--prorsa-min-dwell", "0",
                       "--prorsa-dwell-switch-costs", "0"]
    srv = processes.start(
        [*mode_flags, *flags, "--prorsa-log-dir", str(log_dir / f"front-{port}"), "--host", processes.LOOPBACK,
         "--port", str(port), *ENGINE_FLAGS],
        name=f"front-{port}", port=port, log_dir=log_dir)
    try:
        srv.wait_ready(timeout=900)
        yield srv
    finally:
        srv.stop(grace_s=20)


@contextmanager
def running_router(log_dir: Path) -> Iterator[processes.ServerProcess]:
    """sglang-router 0.3.2 in PD mode with empty pools (a controller fills them); ended by PID."""
    port = processes.free_port()
    srv = processes.start(["--pd-disaggregation", "--host", processes.LOOPBACK, "--port", str(port),
                           "--policy", "round_robin", "--log-level", "warn", "--prometheus-port",
                           str(processes.free_port()), "--prometheus-host", processes.LOOPBACK],
                          name=f"sglang-router-{port}", port=port, log_dir=log_dir, module="sglang_router.launch_router")
    try:
        srv.wait_ready(timeout=120, path="/workers")
        yield srv
    finally:
        srv.stop(grace_s=5)


def arrange(front, prefill: int, decode: int) -> None:
    """Switch idle instances until the roles are ``prefill`` : ``decode``."""
    insts = front_client.arrange(front.url, prefill)
    assert len(insts) - prefill == decode


def status(url: str) -> dict:
    return instance_status(url)


def flush_prefix_caches(front) -> None:
    for inst in instances(front.url):
        assert requests.post(inst["url"] + "/flush_cache", timeout=30).status_code == 200


def computed_tokens(front, counter: str = "prompt_tokens_computed") -> int:
    return sum(int(status(i["url"])["counters"].get(counter, 0)) for i in instances(front.url))


def engine_counter(front, name: str) -> int:
    return sum(int(status(i["url"])["engine_counters"].get(name, 0)) for i in instances(front.url))


def max_logprob_gap(a: dict, b: dict) -> float:
    la = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
    lb = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
    assert len(la) == len(lb) == len(a["output_ids"])
    return max((abs(x - y) for x, y in zip(la, lb)), default=0.0)
