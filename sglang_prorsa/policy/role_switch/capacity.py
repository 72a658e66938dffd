"""Decode KV capacity C^D_KV and current decode footprint K^D_t (§4.2), read from instance reports.

Every engine instance reports what it holds each control tick (``InstanceReport``). This module turns a set of reports
into the decode-side numbers of Eq. 1 and the GPU budget G; the planner reads the same reports for load and eligibility.

Units: KV quantities are in the unit the decode engine reports its pool in (tokens for SGLang's token-to-KV pool). The
forecaster's K̂^D must use the same unit, since Eq. 1 adds K^D_t and K̂^D and divides by C^D_KV.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Role(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def other(self) -> Role:
        return Role.DECODE if self is Role.PREFILL else Role.PREFILL


class InstanceStatus(str, enum.Enum):
    ACTIVE = "active"  # serving its role and in the routing pool
    DRAINING = "draining"  # out of the routing pool, in-flight work being cancelled and persisted (Appendix C)
    SWITCHING = "switching"  # rebuilding role-specific communication and cache resources
    UNHEALTHY = "unhealthy"  # failed health checks; neither capacity nor a switch candidate


@dataclass(frozen=True)
class InstanceReport:
    """What one engine instance tells the controller at a tick.

    ``role`` is the role the instance serves, or, while DRAINING/SWITCHING, the role it is switching *to*: an instance
    already on its way to a role is counted there, so the planner does not order the same change twice.
    ``role_since`` is when the instance last got a new role (None: never switched since start), for the dwell guard.

    The optional fields after ``role_since`` are what the server can measure per instance beyond the paper's inputs;
    their defaults mean "not reported" and leave the controller to its configured fallbacks:
    ``running_requests`` / ``queued_requests`` (scheduler), ``max_running_requests`` (the engine's batch limit: with it,
    decode demand counts request slots as well as KV, see ``decode_slot_demand``), ``prefix_cache_tokens`` (held in the
    radix cache; lost on a switch), ``prefix_cache_capacity`` (its KV pool, the most the cache can hold), ``last_switch_s`` (duration of its last switch), ``generation_paused`` (the trainer
    paused generation on it).
    """

    instance_id: str
    role: Role
    status: InstanceStatus = InstanceStatus.ACTIVE
    gpus: int = 1
    queued_prompt_tokens: int = 0  # full prompt lengths waiting in this instance's prefill queue
    inflight_prompt_tokens: int = 0  # full prompt lengths of prefills being computed
    decode_kv_used: int = 0  # KV held by decode requests (0 on a pure prefill instance)
    decode_kv_capacity: int = 0  # usable KV pool size under the decode configuration (0 when not serving decode)
    role_since: float | None = None
    running_requests: int = 0
    queued_requests: int = 0
    max_running_requests: int = 0  # 0: unknown
    prefix_cache_tokens: int = 0
    prefix_cache_capacity: int = 0  # tokens its KV pool can give the prefix cache (0: unknown)
    last_switch_s: float | None = None
    generation_paused: bool = False

    @property
    def prefill_load(self) -> int:
        """Prefill load for the least-loaded choice (Appendix C): queued + in-flight prompt tokens."""
        return self.queued_prompt_tokens + self.inflight_prompt_tokens

    @property
    def decode_load(self) -> int:
        """Decode load for the least-loaded choice: the KV footprint it would have to migrate away."""
        return self.decode_kv_used

    def load(self) -> int:
        return self.prefill_load if self.role is Role.PREFILL else self.decode_load


@dataclass(frozen=True)
class CapacityConfig:
    """``profiled_decode_kv_capacity``: C^D_KV from offline profiling, used until a decode instance reports its pool.
    ``usable_fraction`` keeps part of each pool out of the plan (e.g. 0.9 leaves room for KV growth within the horizon,
    which Eq. 1 does not model); 1.0 trusts the engine's own notion of usable."""

    profiled_decode_kv_capacity: float | None = None
    usable_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.usable_fraction <= 1.0:
            raise ValueError(f"usable_fraction must be in (0, 1], got {self.usable_fraction}")
        if self.profiled_decode_kv_capacity is not None and self.profiled_decode_kv_capacity <= 0:
            raise ValueError("profiled_decode_kv_capacity must be positive")


class CannotDecide(ValueError):
    """No allocation can be computed from these reports; ``code`` says why (the front answers 409 with it)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


TOO_FEW_INSTANCES = "too_few_instances"  # the healthy GPUs cannot hold one instance of each role
NO_DECODE_CAPACITY = "no_decode_capacity"  # no KV pool is known to size decode with


def active_decode_pool(reports: Iterable[InstanceReport]) -> int | None:
    """The smallest KV pool among active decode instances (None: none reports one)."""
    return min((r.decode_kv_capacity for r in reports
                if r.role is Role.DECODE and r.status is InstanceStatus.ACTIVE and r.decode_kv_capacity > 0),
               default=None)


def decode_kv_capacity(reports: Iterable[InstanceReport], config: CapacityConfig,
                       fallback_pool: float | None = None) -> float:
    """C^D_KV: usable KV capacity of one decode instance.

    Taken as the smallest pool among active decode instances: Eq. 1 uses a single per-instance capacity, and the
    smallest one never promises KV room an instance does not have. When no decode instance is active (all switching,
    or the only one died) it falls back to the profiled value, else to ``fallback_pool`` (the controller passes the
    last pool it saw, or a prefill instance's pool: the same engines, the same KV pool), else raises
    ``CannotDecide``."""
    pool: float | None = active_decode_pool(reports)
    if pool is None:
        pool = config.profiled_decode_kv_capacity if config.profiled_decode_kv_capacity is not None else fallback_pool
    if pool is None or not pool > 0:
        raise CannotDecide(NO_DECODE_CAPACITY, "no active decode instance reports a KV pool, none was seen before "
                                               "and no profiled capacity is configured")
    return pool * config.usable_fraction


def decode_kv_footprint(reports: Iterable[InstanceReport]) -> int:
    """K^D_t: decode KV held right now, summed over every instance whatever its status.

    Instances that are draining, switching away from decode or unhealthy are included on purpose: their decode
    requests are retried on other decode instances with their KV (Appendix C), so that KV still needs a home."""
    return sum(r.decode_kv_used for r in reports)


def decode_slot_demand(reports: Iterable[InstanceReport], decode_requests_forecast: float) -> float:
    """Decode demand in instances counted in request slots: (running + queued decode requests + requests predicted to
    enter decode within the horizon) / the smallest active decode instance's ``max_running_requests``.

    Beyond the paper: Eq. 1 sizes decode from KV alone. An engine also caps its running batch
    (``--max-running-requests``); when requests wait for a slot while KV is free, decode is short although K/C_KV says
    otherwise. 0 when no active decode instance reports its limit."""
    limits = [r.max_running_requests for r in reports
              if r.role is Role.DECODE and r.status is InstanceStatus.ACTIVE and r.max_running_requests > 0]
    if not limits:
        return 0.0
    waiting = sum(r.running_requests + r.queued_requests for r in reports if r.role is Role.DECODE)
    return (waiting + max(0.0, decode_requests_forecast)) / min(limits)


def gpu_budget(reports: Iterable[InstanceReport]) -> int:
    """G: GPUs of all instances that can hold a role, i.e. everything but unhealthy instances."""
    return sum(r.gpus for r in reports if r.status is not InstanceStatus.UNHEALTHY)


def role_counts(reports: Iterable[InstanceReport]) -> dict[Role, int]:
    """Instances per role, counting one mid-switch under the role it is switching to; unhealthy ones not at all."""
    counts = {Role.PREFILL: 0, Role.DECODE: 0}
    for r in reports:
        if r.status is not InstanceStatus.UNHEALTHY:
            counts[r.role] += 1
    return counts
