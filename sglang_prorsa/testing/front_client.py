"""A small HTTP client for a Prorsa front and its instances, shared by the integration tests and the benchmarks."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import requests

from sglang_prorsa.srt.common.messages import ROUTE_HEADER


def instances(url: str) -> list[dict]:
    """The front's instances (``GET /prorsa/instances``)."""
    return requests.get(url + "/prorsa/instances", timeout=30).json()["instances"]


def instance_status(instance_url: str) -> dict:
    """One engine instance's own report (``GET /prorsa/status``)."""
    return requests.get(instance_url + "/prorsa/status", timeout=30).json()


def switch(url: str, instance: str, new_role: str, timeout_s: float = 600) -> requests.Response:
    return requests.post(url + "/prorsa/switch", json={"instance": instance, "new_role": new_role}, timeout=timeout_s)


def arrange(url: str, prefill: int, max_switches: int = 8) -> list[dict]:
    """Switch idle instances until ``prefill`` of them serve prefill; returns the instances."""
    for _ in range(max_switches + 1):
        insts = instances(url)
        n_p = sum(i["role"] == "prefill" for i in insts)
        if n_p == prefill:
            return insts
        src, dst = ("prefill", "decode") if n_p > prefill else ("decode", "prefill")
        r = switch(url, next(i for i in insts if i["role"] == src and i["status"] == "active")["instance"], dst)
        r.raise_for_status()
    raise RuntimeError(f"could not arrange {prefill} prefill instances in {max_switches} switches")


def sampling(max_new: int, **extra: Any) -> dict:
    return {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, **extra}


def generate(url: str, input_ids: list[int], max_new: int, *, logprobs: bool = True, headers: dict | None = None,
             timeout: float = 900, top_logprobs: int = 0) -> tuple[int, dict]:
    """A greedy ``/generate``; ``top_logprobs`` > 0 also returns that many top candidates per output token."""
    body = {"input_ids": input_ids, "sampling_params": sampling(max_new), "return_logprob": logprobs or top_logprobs > 0}
    if top_logprobs:
        body["top_logprobs_num"] = top_logprobs
    r = requests.post(url + "/generate", json=body, timeout=timeout, headers=headers)
    try:
        out = r.json()
    except ValueError:
        return r.status_code, {"error": r.text[:2000]}
    if isinstance(out, dict) and ROUTE_HEADER in r.headers:
        out["route"] = r.headers[ROUTE_HEADER]  # which pair (or instance) a front sent it to
    return r.status_code, out


def generate_stream(url: str, input_ids: list[int], max_new: int, timeout: float = 900) -> list[dict]:
    """Every server-sent event of a streamed ``/generate``, parsed."""
    body = {"input_ids": input_ids, "sampling_params": sampling(max_new), "return_logprob": True, "stream": True}
    chunks = []
    with requests.post(url + "/generate", json=body, timeout=timeout, stream=True) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                chunks.append(json.loads(line[5:]))
    return chunks


def run_all(send: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    with ThreadPoolExecutor(max(1, len(items))) as ex:
        return list(ex.map(send, items))


def switch_under_load(url: str, send: Callable[[Any], Any], items: Sequence[Any], target: dict | Callable[[], dict],
                      new_role: str, ready: Callable[[dict], bool], settle_s: float = 0.0,
                      timeout_s: float = 300) -> tuple[requests.Response, list[Any], dict]:
    """Send every item concurrently, wait until ``ready(status of target)``, then switch ``target`` to ``new_role``.

    ``target`` may be a callable choosing the instance once the load is on (e.g. the busiest decode instance).
    Returns (the switch response, every item's answer in order, the target's status just before the switch).
    """
    with ThreadPoolExecutor(len(items)) as ex:
        futures = [ex.submit(send, item) for item in items]
        deadline = time.monotonic() + timeout_s
        while True:
            chosen = target() if callable(target) else target
            if ready(instance_status(chosen["url"])):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"instance {chosen['instance']} never reached the state to switch in")
            time.sleep(0.02)
        time.sleep(settle_s)
        before = instance_status(chosen["url"])
        before["instance"] = chosen["instance"]
        response = switch(url, chosen["instance"], new_role)
        return response, [f.result() for f in futures], before


def busiest(url: str, role: str) -> dict:
    """The active instance of ``role`` with the most requests running (the one a switch hurts most)."""
    cands = [i for i in instances(url) if i["role"] == role and i["status"] == "active"]
    return max(cands, key=lambda i: instance_status(i["url"])["running"])


def distinct_prompts(n: int, length: Callable[[int], int], seed: int) -> list[list[int]]:
    """Token prompts whose first tokens differ: no two share a cached prefix, so computed-token counts are exact."""
    return [[10 + i] + [(seed * 131 + i * 37 + j * 11) % 900 + 20 for j in range(length(i) - 1)] for i in range(n)]


def start_manual_front(instances_n: int, initial_prefill: int, engine_flags: Sequence[str], log_dir: Any,
                       extra: Sequence[str] = ()) -> Any:
    """An adaptive front on loopback whose instances switch only when told (``POST /prorsa/switch``), with no dwell
    time: the set-up of the benchmarks that switch at moments they choose. Returns the started ``ServerProcess``."""
    from pathlib import Path

    from sglang_prorsa.srt.utils import processes

    log_dir = Path(log_dir)
    port = processes.free_port()
    return processes.start(["--pd-adaptive", "--prorsa-instances", str(instances_n), "--prorsa-initial-prefill",
                            str(initial_prefill), "--prorsa-manual-switch", "--prorsa-min-dwell", "0",
                            "--prorsa-dwell-switch-costs", "0", "--prorsa-log-dir", str(log_dir / "instances"),
                            "--host", processes.LOOPBACK, "--port", str(port), *extra, *engine_flags],
                           name="front", port=port, log_dir=log_dir,
                           die_with_parent=True)  # a benchmark stopped by a signal leaves no front behind


def idle_keepalive_survives(url: str, idle_s: float) -> tuple[int, int, bool]:
    """Two ``GET /health`` on one HTTP/1.1 connection, ``idle_s`` apart: (first status, second status, same socket).
    A listener that closes idle connections sooner makes the second request fail (or, with a pool, race the close)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", "/health")
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        time.sleep(idle_s)
        conn.request("GET", "/health")
        second = conn.getresponse()
        second.read()
        return first.status, second.status, conn.sock is sock
    finally:
        conn.close()
