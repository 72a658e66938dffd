"""Decode admissions (paper B.7, Eq. 13-14), vectorised over the live trajectories.

Observed requests follow Eq. 13 exactly: each prefill instance m serves its requests one at a time, in arrival
order, starting when its in-flight work ends:

    v_m = latest estimated finish of m's in-flight prefills (start + g(x), never before now), or t if idle
    b_j = max(u_j, v_m(j)) + g(x_j);  v_m(j) <- b_j        with u_j = t for queued requests,

computed per instance with a cumulative sum (queued requests all have u_j = t). In-flight prefills keep the finish
time implied by their observed start (progress before t is honoured, B.7). Requests without a known instance are
served by the pooled instances (the least-loaded router spreads them).

Predicted arrivals are probabilities, not requests, so instead of placing each on an instance (the serial recurrence
over 10^5 fractional jobs is what made the first cut slow) the pooled instances are a fluid queue: they start with
the observed backlog V0 (mean over instances of v_m - t after the queued requests) and receive predicted work at
rate rho (fraction of their capacity). A request arriving at t + u waits max(0, V0 - (1 - rho) u) and needs g; it is
admitted within the horizon if u + wait + g < S. That holds for every u below a cut-off h* (the *admission horizon*),
so the predicted admissions are the predicted arrivals evaluated over h* instead of S. This is an approximation of
Eq. 13 beyond the paper; it agrees with the recurrence when instances are not saturated and degrades gracefully when
they are (h* shrinks as the backlog grows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ObservedAdmissions:
    tokens: float  # x of observed requests (in flight + queued) whose prefill ends before t + S
    kv_tokens: float
    backlog_s: float  # V0: mean seconds until an instance has worked off the observed backlog
    finish_at: np.ndarray  # predicted prefill end of each queued request (input order)
    inflight_finish_at: np.ndarray


def arrival_order(arrival: np.ndarray, inst: np.ndarray | None = None) -> np.ndarray:
    """Positions by instance (if given), then arrival time, ties in input order: ``np.lexsort((arrival, inst))``.

    numpy's stable sorts of float64 (and of int64) are merge sorts, several times slower than its default sort;
    this uses the default sort and restores the input order within runs of equal times by sorting distinct int64
    keys ((rank, position): any sort of distinct keys is stable). ``arrival`` holds no NaN (event times)."""
    n = arrival.size
    by_time = np.argsort(arrival)
    times = arrival[by_time]
    rank = np.zeros(n, np.int64)  # equal times share a rank
    np.cumsum(times[1:] != times[:-1], out=rank[1:])
    key = rank * n + by_time
    key.sort()
    order = key % n  # stable by arrival
    if inst is None:
        return order
    key = inst[order].astype(np.int64) * n + np.arange(n)  # then stable by instance (ids >= 0)
    key.sort()
    return order[key % n]


def observed_admissions(now: float, horizon_s: float, n_instances: int,
                        inflight_x: np.ndarray, inflight_g: np.ndarray, inflight_start: np.ndarray,
                        inflight_inst: np.ndarray,
                        queued_x: np.ndarray, queued_g: np.ndarray, queued_arrival: np.ndarray,
                        queued_inst: np.ndarray, kv: Callable[[np.ndarray], np.ndarray]) -> ObservedAdmissions:
    """Eq. 13-14 over the observed requests. Instance ids are small ints (-1: unknown); ``n_instances`` is the
    pool size (at least the number of distinct known instances)."""
    end = now + horizon_s
    fin_in = np.maximum(inflight_start + inflight_g, now)
    known = queued_inst >= 0
    ids = np.concatenate((inflight_inst[inflight_inst >= 0], queued_inst[known]))
    width = int(ids.max()) + 1 if ids.size else 0
    free = np.full(width, now)
    if inflight_x.size and width:
        sel = inflight_inst >= 0
        np.maximum.at(free, inflight_inst[sel], fin_in[sel])
    fin_q = np.empty(queued_x.size)
    if known.any():
        idx = np.flatnonzero(known)
        order = idx[arrival_order(queued_arrival[idx], queued_inst[idx])]
        inst = queued_inst[order]
        csum = np.cumsum(queued_g[order])
        first = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
        before = np.repeat(np.r_[0.0, csum][first], np.diff(np.r_[first, inst.size]))
        fin_q[order] = free[inst] + csum - before
        last = np.r_[first[1:] - 1, inst.size - 1]
        free[inst[last]] = fin_q[order][last]
    pool = max(n_instances, width, 1)
    busy = np.maximum(free - now, 0.0).sum() if width else 0.0
    unknown = np.flatnonzero(~known)
    if unknown.size:  # pooled: the least-loaded router spreads them; a fluid queue of `pool` servers
        order = unknown[arrival_order(queued_arrival[unknown])]
        fin_q[order] = now + (busy + np.cumsum(queued_g[order])) / pool
        busy += queued_g[unknown].sum()
    admitted_in = fin_in < end
    admitted_q = fin_q < end
    tokens = float(inflight_x[admitted_in].sum() + queued_x[admitted_q].sum())
    kv_tokens = float(kv(inflight_x[admitted_in]).sum() + kv(queued_x[admitted_q]).sum())
    return ObservedAdmissions(tokens, kv_tokens, busy / pool, fin_q, fin_in)


def admission_horizon(horizon_s: float, backlog_s: float, load: float, service_s: float) -> float:
    """h*: predicted arrivals before t + h* are admitted to decode before t + S (fluid queue, see module doc).

    ``backlog_s`` = V0, ``load`` = rho (predicted prefill work per second of pooled capacity), ``service_s`` = g of
    a typical predicted request."""
    room = horizon_s - service_s
    if room <= 0:
        return 0.0
    if backlog_s <= 0:
        return room
    if load < 1.0 and backlog_s / (1.0 - load) <= room:
        return room  # the backlog drains before the horizon closes; later arrivals wait only for themselves
    if load <= 1e-12:
        return 0.0 if backlog_s >= room else room
    return float(min(room, max(0.0, (room - backlog_s) / load)))
