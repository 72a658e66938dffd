"""A small HTTP client for the adaptive front, shared by the integration tests and the switch benchmark."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import requests


def instances(url: str) -> list[dict]:
    """The front's instances (``GET /prorsa/instances``)."""
    return requests.get(url + "/prorsa/instances", timeout=10).json()["instances"]


def instance_status(instance_url: str) -> dict:
    """One engine instance's own report (``GET /prorsa/status``)."""
    return requests.get(instance_url + "/prorsa/status", timeout=10).json()


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
        r = switch(url, next(i for i in insts if i["role"] == src)["instance"], dst)
        r.raise_for_status()
    raise RuntimeError(f"could not arrange {prefill} prefill instances in {max_switches} switches")


def switch_under_load(url: str, send: Callable[[Any], Any], items: Sequence[Any], target: dict, new_role: str,
                      ready: Callable[[dict], bool], settle_s: float = 0.0,
                      timeout_s: float = 300) -> tuple[requests.Response, list[Any], dict]:
    """Send every item concurrently, wait until ``ready(status of target)``, then switch ``target`` to ``new_role``.

    Returns (the switch response, every item's answer in order, the target's status just before the switch).
    """
    with ThreadPoolExecutor(len(items)) as ex:
        futures = [ex.submit(send, item) for item in items]
        deadline = time.monotonic() + timeout_s
        while not ready(instance_status(target["url"])):
            if time.monotonic() > deadline:
                raise TimeoutError(f"instance {target['instance']} never reached the state to switch in")
            time.sleep(0.02)
        time.sleep(settle_s)
        before = instance_status(target["url"])
        response = switch(url, target["instance"], new_role)
        return response, [f.result() for f in futures], before
