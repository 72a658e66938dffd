"""Send one request to a prefill/decode pair the way SGLang's PD router does: both at once, one bootstrap room."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import requests

_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="pd-send")


def new_bootstrap_room(rng: random.Random | None = None) -> int:
    return (rng or random).getrandbits(63)


def pd_generate(prefill_url: str, decode_url: str, bootstrap_port: int, payload: dict, *,
                bootstrap_host: str = "127.0.0.1", room: int | None = None, timeout: float = 300.0) -> dict:
    """POST ``payload`` to ``/generate`` on both servers; return the decode server's answer."""
    body = dict(payload, bootstrap_host=bootstrap_host, bootstrap_port=bootstrap_port,
                bootstrap_room=new_bootstrap_room() if room is None else room)
    p = _POOL.submit(requests.post, prefill_url + "/generate", json=body, timeout=timeout)
    d = _POOL.submit(requests.post, decode_url + "/generate", json=body, timeout=timeout)
    dr, pr = d.result(), p.result()
    if pr.status_code != 200:
        raise RuntimeError(f"prefill answered {pr.status_code}: {pr.text[:500]}")
    if dr.status_code != 200:
        raise RuntimeError(f"decode answered {dr.status_code}: {dr.text[:500]}")
    return dr.json()
