"""Decode admissions from prefill completion: the per-instance serial recurrence (paper B.7, Eq. 13-14).

    v_m  = latest estimated finish of instance m's in-flight prefills, or t if idle
    b_j  = max(u_j, v_m(j)) + g(x_j);   v_m(j) <- b_j          (queued, then predicted arrivals, in scheduling order)
    A_D  = sum_{j : b_j < t + S} x_j        K_D = sum_{j : b_j < t + S} kappa_D(x_j)                      (Eq. 14)

In-flight prefills keep the finish time from the runtime snapshot (``finish_at``: progress made before t is honoured,
never recomputed from scratch). Requests without an instance assignment are routed the way the least-loaded router
would: to the instance that frees up first. Instances run in parallel; each is served serially (no batching/chunking
model, as in the paper).

Predicted arrivals are expectations (a sandbox start that lands in the horizon with probability q), so a job carries a
``weight`` in (0, 1]: it contributes ``weight * x`` tokens and occupies its instance for ``weight * g(x)`` seconds,
which keeps the expected queueing delay without inventing whole requests.

The reference recurrence over individual jobs. The predictor uses the vectorised form in admissions.py (exact for
observed requests; a fluid approximation for predicted arrivals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence


@dataclass(frozen=True, slots=True)
class PrefillJob:
    tokens: float  # x_j, full prompt length
    arrival: float  # u_j (t for requests already queued)
    weight: float = 1.0
    instance: str | None = None
    finish_at: float | None = None  # in-flight only: runtime estimate of the finish time


@dataclass(frozen=True)
class DecodeAdmissionForecast:
    tokens: float  # A_D
    kv_tokens: float  # K_D
    instance_free_at: dict[str, float]  # v_m after the recurrence (diagnostics)


def forecast_decode_admissions(
    now: float,
    horizon_s: float,
    instances: Sequence[str],
    inflight: Iterable[PrefillJob],
    queued: Iterable[PrefillJob],
    predicted: Iterable[PrefillJob],
    prefill_time: Callable[[float], float],
    kv_footprint: Callable[[float], float],
) -> DecodeAdmissionForecast:
    """Eq. 13-14. ``queued`` in scheduling (arrival) order; ``predicted`` is sorted by arrival here."""
    end = now + horizon_s
    free_at: dict[str, float] = {m: now for m in instances}
    tokens = 0.0
    kv = 0.0

    def admit(job: PrefillJob, finish: float) -> None:
        nonlocal tokens, kv
        if finish < end:
            tokens += job.weight * job.tokens
            kv += job.weight * kv_footprint(job.tokens)

    for job in inflight:
        finish = job.finish_at if job.finish_at is not None else now + prefill_time(job.tokens)
        finish = max(finish, now)  # overdue in-flight work finishes "now", not in the past
        if job.instance is not None:
            free_at[job.instance] = max(free_at.get(job.instance, now), finish)
        admit(job, finish)

    def serve(job: PrefillJob) -> None:
        m = job.instance if job.instance in free_at else min(free_at, key=free_at.__getitem__)
        finish = max(job.arrival, free_at[m]) + job.weight * prefill_time(job.tokens)
        free_at[m] = finish
        admit(job, finish)

    if not free_at:
        free_at["_"] = now  # no instance known yet: assume one
    for job in queued:
        serve(job)
    for job in sorted(predicted, key=lambda j: j.arrival):
        serve(job)
    return DecodeAdmissionForecast(tokens, kv, free_at)
