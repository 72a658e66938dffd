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

import bisect
import math
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
    """Readings of a cumulative completion counter taken at each tick: the rate over the last ``window_s`` seconds
    (the wait rule's) and between any two kept times (the move review's, review.py). Readings are kept for
    ``keep_s`` seconds (at least the window), and one at or before that edge."""

    def __init__(self, window_s: float = DEFAULT_RATE_WINDOW_S, keep_s: float | None = None) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be finite and > 0, got {window_s}")
        keep_s = window_s if keep_s is None else keep_s
        if not (math.isfinite(keep_s) and keep_s >= window_s):
            raise ValueError(f"keep_s must be finite and >= window_s, got {keep_s}")
        self.window_s, self.keep_s = window_s, keep_s
        self._readings: list[tuple[float, int]] = []

    def observe(self, now: float, total: int) -> bool:
        """The counter read ``total`` at ``now``. False when the clock or the counter went back (a restarted
        control plane): the readings start over from this one."""
        readings = self._readings
        went_back = bool(readings) and (now < readings[-1][0] or total < readings[-1][1])
        if went_back:
            readings.clear()
        readings.append((now, total))
        cut = bisect.bisect_right(readings, (now - self.keep_s, math.inf)) - 1  # keep the one at or before the edge
        if cut > 0:
            del readings[:cut]
        return not went_back

    @property
    def first_s(self) -> float | None:
        """When the oldest kept reading was taken; None before any."""
        return self._readings[0][0] if self._readings else None

    def per_s(self) -> float | None:
        """The rate over the last window (from the newest reading at or before its start, else the oldest); None
        before two readings."""
        if len(self._readings) < 2:
            return None
        t1, n1 = self._readings[-1]
        t0, n0 = self._at(t1 - self.window_s) or self._readings[0]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def rate(self, t0: float, t1: float) -> float | None:
        """Completions per second between the readings at or before ``t0`` and ``t1``; None without both."""
        a, b = self._at(t0), self._at(t1)
        if a is None or b is None or not b[0] > a[0]:
            return None
        return (b[1] - a[1]) / (b[0] - a[0])

    def _at(self, t: float) -> tuple[float, int] | None:
        i = bisect.bisect_right(self._readings, (t, math.inf)) - 1
        return self._readings[i] if i >= 0 else None
