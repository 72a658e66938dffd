"""Prompts and request helpers shared by the integration tests."""

from __future__ import annotations

import requests

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
