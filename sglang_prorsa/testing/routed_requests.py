"""Requests for ``routed_experts`` checks against a live front or PD pair, shared by the CPU integration test
(``tests/integration/test_routed_experts_moe.py``) and the prepared GPU run (``benchmarks/gpu_validate.py``)."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import requests

from sglang_prorsa.testing.front_client import sampling
from sglang_prorsa.testing.pd import new_bootstrap_room


def routed_body(prompt: list[int], max_new: int, stream: bool, start: Any) -> dict:
    """A greedy ``/generate`` body asking for routed experts; ``start`` "prompt": ``routed_experts_start_len`` is
    the prompt's length (None: from position 0)."""
    out = {"input_ids": prompt, "sampling_params": sampling(max_new), "return_routed_experts": True, "stream": stream}
    if start == "prompt":
        out["routed_experts_start_len"] = len(prompt)
    return out


def post(url: str, payload: dict, timeout: float = 600) -> dict:
    """One ``/generate``; for a streamed one its last event (the only one SGLang gives the routed experts)."""
    with requests.post(url + "/generate", json=payload, timeout=timeout, stream=payload["stream"]) as r:
        assert r.status_code == 200, r.text[:2000]
        if not payload["stream"]:
            return r.json()
        events = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]
    assert events and all("routed_experts" not in e["meta_info"] for e in events[:-1])  # final output only
    return events[-1]


def pair_post(prefill: dict, decode: dict, payload: dict, timeout: float = 600) -> dict:
    """Both halves of one PD request, straight to ``prefill`` and ``decode`` (instances as ``GET /prorsa/instances``
    lists them), as SGLang's router sends them; the decode half's answer is the caller's."""
    payload = dict(payload, bootstrap_host=prefill["bootstrap_host"], bootstrap_port=prefill["bootstrap_port"],
                   bootstrap_room=new_bootstrap_room())
    with ThreadPoolExecutor(2) as ex:
        half = ex.submit(requests.post, prefill["url"] + "/generate", json=dict(payload, stream=False),
                         timeout=timeout)
        answer = post(decode["url"], payload, timeout)
        assert half.result().status_code == 200, half.result().text[:500]
    return answer


def rows(answer: dict, layers: int, top_k: int) -> np.ndarray:
    """An answer's ``routed_experts`` as int32 ``[positions, layers, top_k]``."""
    raw = base64.b64decode(answer["meta_info"]["routed_experts"])
    return np.frombuffer(raw, dtype=np.int32).reshape(-1, layers, top_k)
