"""The per-request and per-rank state of a simulated engine instance (instance.py holds them, regime.py steps them)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sglang_prorsa.sim.prefix_cache import PrefixCache


@dataclass(slots=True, eq=False)
class Request:
    """One model call of a trajectory. ``done`` counts prompt tokens already in KV (cached prefix + chunks)."""

    rid: int
    owner: object  # the trajectory run that receives the completion callbacks (also its prefix-cache key)
    prompt: int  # x: full prompt length
    done: int  # prefill progress (starts at the cached prefix)
    output: int  # tokens to generate in all
    generated: int = 0  # while running, tokens generated before joining the batch (see Rank.steps)
    joined_step: int = 0  # the rank's decode step when it joined the running batch
    untracked: bool = False  # a re-prefill the lifecycle API cannot report (weight update)
    rank: int = -1
    finish_step: int = 0
    cached: int = 0  # prefix-cache hit when it was queued (θ samples count it as cached, not computed)

    @property
    def context(self) -> int:
        return self.prompt + self.generated


@dataclass(slots=True)
class Rank:
    prefill: deque = field(default_factory=deque)
    prefill_left: int = 0  # tokens still to prefill over the whole queue
    running: dict = field(default_factory=dict)  # rid -> Request
    finish_heap: list = field(default_factory=list)  # (finish step, rid)
    finish_max: int = 0  # the latest finish step in the heap (0 when empty)
    steps: int = 0  # decode steps done: a running request finishes at step ``finish_step``
    context: int = 0  # KV tokens of the running batch (grows one per request per step)
    reserved: int = 0  # KV of admitted requests not running yet (colocated: prefilling; decode: in transfer)
    pending: int = 0  # how many requests ``reserved`` holds (they take batch slots)
    admit: deque = field(default_factory=deque)  # waiting for a slot and KV room
    parked: deque = field(default_factory=deque)  # retracted with a CPU backup of their KV (PD decode)
    cache: PrefixCache = field(default_factory=PrefixCache)
    nic_free: float = 0.0  # when this rank's NICs finish the transfers queued on them
