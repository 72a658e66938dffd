"""Stage waits: how long work arriving now would wait at each stage (beyond the paper).

A turn of a trajectory waits at prefill, then for a decode slot. When the cluster is GPU-bound both stages hold
queues, and Eq. 1's demands do not say which stage bounds the rollout: its decode term is the KV decode holds, queue
included, so the queue the current split causes reads as demand for more decode.

The planner's wait rule (planner.py; opt-in) therefore moves one instance at a time when the move shortens a turn's
summed wait, prefill's plus decode's (``move_shortens_waits``); while neither wait exceeds ``wait_floor_s`` (no
queue), the forecast rules act instead, ahead of the work. The sum, not equal waits: a turn passes both stages, so
its time in the engines is the sum, and the fastest static split need not even the waits out. Both waits come
from what the engines report now and one measured rate, through Little's law:

    prefill_s = (queued + in-flight prompt tokens on the active prefill instances) / (n^P · θ^P)
    decode_s  = (requests waiting for a decode slot + requests returning to decode) / decode completions per second
                (the last ``window_s`` seconds)

θ^P is the prefill throughput of one instance at the current mix (theta.py). The decode completion rate is counted
from the trajectories' ``decode_end`` events (``CompletionRate``); until it is measured, the waits are unknown and
the planner keeps its forecast rules.

Requests returning to decode count in decode's queue: an asynchronous weight update sends every context in decode,
or waiting for it, back through prefill (§3.1), and without them decode's queue reads empty at that tick and the rule
moves a decode instance to prefill and back at every update. docs/controller.md has the traces and the measurements
(benchmarks/results/wait_rule_ab).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_prorsa.policy.role_switch.capacity import InstanceReport, InstanceStatus, Role

DEFAULT_RATE_WINDOW_S = 60.0  # long enough to hold many completions, short enough to follow a weight update


@dataclass(frozen=True)
class StageWaits:
    """Expected seconds a request arriving now waits at each stage."""

    prefill_s: float
    decode_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.prefill_s) and self.prefill_s >= 0 and math.isfinite(self.decode_s)
                and self.decode_s >= 0):
            raise ValueError(f"waits must be finite and >= 0, got {self.prefill_s}, {self.decode_s}")

    def queued(self, floor_s: float) -> bool:
        """Whether either stage holds more than ``floor_s`` seconds of waiting work."""
        return max(self.prefill_s, self.decode_s) > floor_s

    def to_dict(self) -> dict:
        return {"prefill_s": self.prefill_s, "decode_s": self.decode_s}


def stage_waits(reports: Sequence[InstanceReport], theta_per_instance: float,
                decode_completions_per_s: float | None, returning_requests: float = 0.0) -> StageWaits | None:
    """The two waits (module docstring), or None when they cannot be told: no completion rate measured yet, no
    active prefill instance, or no prefill throughput. ``returning_requests``: decode's queue in transit through a
    re-prefill, counted in decode's wait."""
    if decode_completions_per_s is None or not decode_completions_per_s > 0 or not theta_per_instance > 0:
        return None
    prefill = [r for r in reports if r.role is Role.PREFILL and r.status is InstanceStatus.ACTIVE]
    if not prefill:
        return None
    queued_tokens = sum(r.prefill_load for r in prefill)
    queued_requests = sum(r.queued_requests for r in reports if r.role is Role.DECODE) + returning_requests
    return StageWaits(queued_tokens / (len(prefill) * theta_per_instance),
                      queued_requests / decode_completions_per_s)


def move_shortens_waits(waits: StageWaits, dst: Role, n_dst: int, n_src: int, donors: int, ratio: float,
                        floor_s: float) -> bool:
    """Whether ``donors`` instances of the other stage becoming one more ``dst`` instance shortens a turn's summed
    wait (beyond the paper). Each stage's queue is held and its wait taken as inverse to its instances (Little's
    law: the same queue over more or fewer servers), so ``dst``'s wait falls by w_dst / (n_dst + 1) and the donor
    stage's rises by w_src * donors / (n_src - donors). The fall must exceed ``ratio`` times the rise plus
    ``floor_s`` / (n_dst + 1): with nothing to lose at the donor, ``dst``'s wait must itself exceed ``floor_s``.
    A donor stage left with no instance never qualifies. With ``ratio`` >= 1 at most one direction qualifies."""
    if n_src - donors < 1:
        return False
    w_dst, w_src = (waits.prefill_s, waits.decode_s) if dst is Role.PREFILL else (waits.decode_s, waits.prefill_s)
    fall = w_dst / (n_dst + 1)
    rise = w_src * donors / (n_src - donors)
    return fall > ratio * rise + floor_s / (n_dst + 1)


class CompletionRate:
    """Completions per second over the last ``window_s`` seconds, from a cumulative counter read at each tick."""

    def __init__(self, window_s: float = DEFAULT_RATE_WINDOW_S) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be finite and > 0, got {window_s}")
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def observe(self, now: float, total: int) -> None:
        """The counter read ``total`` at ``now``. Keeps the newest reading at or before the window's start."""
        samples = self._samples
        if samples and (now < samples[-1][0] or total < samples[-1][1]):
            samples.clear()  # the clock or the counter went back (a restarted control plane): start over
        samples.append((now, total))
        while len(samples) > 1 and samples[1][0] <= now - self.window_s:
            samples.popleft()

    def per_s(self) -> float | None:
        """The rate over the span the readings cover (at most about one window); None before two readings."""
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None
