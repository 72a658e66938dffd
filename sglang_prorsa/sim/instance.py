"""One simulated engine instance: attention-DP ranks that step together (perf_model.py), advanced event by event.

Each rank holds a FIFO prefill queue (chunked: ``chunk`` tokens per iteration, requests packed in arrival order, as
SGLang packs a prefill batch), a running decode batch, an admission queue and a prefix cache (prefix_cache.py). A rank
with prefill work runs a prefill chunk, otherwise a decode step (prefill first, no mixed batches: SGLang's default).
All ranks of the instance then wait for the slowest.

KV and batch limits (SGLang 0.5.23 semantics, simplified):
* a request is admitted to a rank (colocated: before its prefill; PD decode: the pre-allocation before its KV is
  transferred) when the rank runs fewer than ``max_running_per_rank`` requests and its KV fits next to the running
  contexts plus ``reserved_decode_tokens`` of headroom per request (``--num-reserved-decode-tokens``); nothing is
  reserved for the whole output;
* when a decode step would overflow the pool, the request with the fewest generated tokens is retracted: on a PD decode
  rank its KV goes to a CPU backup and it resumes first when room frees (``--disaggregation-decode-retraction-backup``);
  on a colocated rank it is prefilled again from scratch (its prefix cache is what the pool pressure evicted).

The instance moves in regimes of identical iterations (regime.py: ``plan`` and ``advance``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from sglang_prorsa.policy.role_switch.capacity import InstanceStatus, Role
from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.sim.regime import INF, RegimeStepper, prefill_queue
from sglang_prorsa.sim.requests import Rank, Request

__all__ = ["INF", "Instance", "Rank", "Request"]


class Instance(RegimeStepper):
    """``role`` None = colocated (prefill and decode on every rank)."""

    def __init__(self, iid: str, perf: PerfModel, role: Role | None, on_prefilled: Callable, on_decoded: Callable,
                 on_admitted: Callable | None = None, on_interval: Callable | None = None,
                 time_quantum_s: float = 0.0) -> None:
        self.iid, self.perf, self.role = iid, perf, role
        self.status, self.role_since = InstanceStatus.ACTIVE, None
        self.ranks = [Rank() for _ in range(perf.ranks)]
        self.gpus = perf.gpus
        self.gpus_per_rank = perf.gpus / perf.ranks
        self.cap = perf.kv_tokens_per_rank
        self.slots = perf.shape.max_running_per_rank
        self.reserve = perf.model.reserved_decode_tokens
        self._on_prefilled, self._on_decoded = on_prefilled, on_decoded
        self._on_admitted, self._on_interval = on_admitted, on_interval
        self.quantum = time_quantum_s  # a regime may run through completions for this long (see plan)
        self.t = 0.0
        # (start, period, k, ops, interference, imbalance, work, prefilling ranks), the sums per iteration
        self._regime: tuple | None = None
        self.wake_at = INF
        self.rr = 0  # round-robin rank counter (SGLang's default DP load balancing)
        self.busy_s = 0.0  # wall time with at least one rank working
        self.work_gpu_s = 0.0
        self.interference_gpu_s = 0.0
        self.imbalance_gpu_s = 0.0
        self.retractions = 0
        self.last_switch_s: float | None = None
        self.n_requests = 0  # requests on the instance (queued, admitted, running, parked): the router's load
        self.prefill_left = 0  # prompt tokens still to prefill over all ranks
        p, d = perf.shape.prefill, perf.shape.decode
        self._p = (p.iter_base_s, p.per_token_s, p.per_token_ctx_s)
        self._d = (d.iter_base_s, d.per_seq_s, d.per_ctx_token_s)
        # the open prefill busy interval (θ samples): start, new tokens, cached tokens, requests
        self._busy: list | None = None

    @property
    def idle_gpu_s(self) -> float:
        return self.interference_gpu_s + self.imbalance_gpu_s

    # ----- loads, for routing and the controller's reports -----
    def prefill_load(self) -> int:
        return self.prefill_left

    def kv_used(self) -> int:
        return sum(r.context + r.reserved for r in self.ranks)

    def running_requests(self) -> int:
        """Requests holding a batch slot: running, plus admitted ones prefilling (colocated) or in transfer (decode)."""
        return sum(len(r.running) + r.pending for r in self.ranks)

    def queued_requests(self) -> int:
        """Requests waiting on the instance: for a slot and KV, retracted, or (prefill role) in the prefill queue."""
        queued = sum(len(r.admit) + len(r.parked) for r in self.ranks)
        return queued + (sum(len(r.prefill) for r in self.ranks) if self.role is Role.PREFILL else 0)

    def load_requests(self) -> int:
        """Requests on the instance, the router's load measure."""
        return self.n_requests

    def prefix_cache_tokens(self) -> int:
        return sum(r.cache.tokens for r in self.ranks)

    def has_work(self) -> bool:
        return any(r.prefill or r.running or r.admit or r.parked or r.pending for r in self.ranks)

    def room(self, rank: Rank) -> int:
        """KV the rank's cache may use: the pool minus what running and admitted requests hold, and on a prefill
        rank the request being prefilled (queued requests hold no KV until they are scheduled)."""
        held = rank.context + rank.reserved
        if self.role is Role.PREFILL and rank.prefill:
            held += rank.prefill[0].prompt
        return self.cap - held

    # ----- routing help -----
    def least_loaded_rank(self) -> int:
        ranks = self.ranks
        return min(range(len(ranks)), key=lambda i: (len(ranks[i].running) + ranks[i].pending + len(ranks[i].admit)
                                                     + len(ranks[i].prefill), ranks[i].prefill_left, i))

    def round_robin_rank(self) -> int:
        r = self.rr % len(self.ranks)
        self.rr += 1
        return r

    def prefilling(self, rank: int) -> bool:
        """Rank ``rank`` runs prefill chunks in the current regime: work added behind its queue changes nothing the
        regime computed (it ends before reaching the new work), so no re-plan is needed."""
        regime = self._regime
        return regime is not None and regime[3][rank] > 0

    def cached_tokens(self, rank: int, key: object) -> int:
        rs = self.ranks[rank]
        return rs.cache.get(key, self.room(rs))

    # ----- entering work -----
    def add_prefill(self, req: Request, rank: int, now: float) -> None:
        """A request joins rank ``rank``: a prefill instance queues it; a colocated rank admits it first."""
        req.rank = rank
        rs = self.ranks[rank]
        self.n_requests += 1
        if req.done >= req.prompt > 0:  # SGLang matches at most all but the last token: one computes the logits
            req.done = req.cached = req.prompt - 1
        if self.role is None:
            rs.admit.append(req)
            self._admit(rs, now)
        else:
            self._start_busy(now)
            rs.prefill.append(req)
            rs.prefill_left += req.prompt - req.done
            self.prefill_left += req.prompt - req.done

    def add_decode(self, req: Request, rank: int, now: float) -> None:
        """A prefilled request asks rank ``rank`` for a decode slot (SGLang's pre-allocation queue)."""
        req.rank = rank
        self.n_requests += 1
        self.ranks[rank].admit.append(req)
        self._admit(self.ranks[rank], now)

    def start_decode(self, req: Request) -> None:
        """KV arrived (transfer done): the request joins the running batch of the rank that admitted it."""
        rs = self.ranks[req.rank]
        rs.reserved -= req.context
        rs.pending -= 1
        self._run(rs, req)

    def _run(self, rs: Rank, req: Request) -> None:
        req.joined_step = rs.steps
        left = req.output - req.generated
        req.finish_step = rs.steps + (left if left > 1 else 1)
        rs.running[req.rid] = req
        heapq.heappush(rs.finish_heap, (req.finish_step, req.rid))
        if req.finish_step > rs.finish_max:
            rs.finish_max = req.finish_step
        rs.context += req.context

    def best_rank(self, tokens: int, limit: float = INF) -> tuple[int, int] | None:
        """(busy, index) of the rank with the fewest running and admitted requests, at most ``limit`` (lowest index on
        ties), that would admit a request of ``tokens`` KV now, nothing waiting ahead of it there; None if none would."""
        best = None
        for k, rs in enumerate(self.ranks):
            busy = len(rs.running) + rs.pending
            # the KV check only for a rank that would be the new best
            if busy <= limit and not rs.admit and not rs.parked and self._fits(rs, tokens):
                best, limit = (busy, k), busy - 1
        return best

    def _fits(self, rs: Rank, tokens: int) -> bool:
        busy = len(rs.running) + rs.pending
        if busy == 0:
            return True  # an empty rank always takes one request, however long
        return busy < self.slots and rs.context + rs.reserved + tokens + self.reserve * (busy + 1) <= self.cap

    def _admit(self, rs: Rank, now: float) -> None:
        """Retracted requests first, then the admission queue, while slots and KV allow."""
        while rs.parked and self._fits(rs, rs.parked[0].context):
            self._run(rs, rs.parked.popleft())
        if rs.parked:
            return
        admit = rs.admit
        while admit and self._fits(rs, admit[0].context if self.role is not None else admit[0].prompt):
            req = admit.popleft()
            if self.role is None:  # colocated: KV for the prompt, then prefill on this rank
                rs.reserved += req.prompt
                rs.pending += 1
                rs.prefill.append(req)
                rs.prefill_left += req.prompt - req.done
                self.prefill_left += req.prompt - req.done
            else:  # PD decode: KV pre-allocated; the cluster starts the transfer
                rs.reserved += req.context
                rs.pending += 1
                self._on_admitted(self, rs, req, now)

    # ----- θ busy intervals (prefill instances) -----
    def _start_busy(self, now: float) -> None:
        if self._busy is None and self.role is Role.PREFILL and not any(map(prefill_queue, self.ranks)):
            self._busy = [max(now, self.t), 0, 0, 0, 0.0]

    def _close_busy(self) -> None:
        """An idle-to-idle interval ends: report its work and its instance-equivalent busy seconds (each DP rank runs
        its own scheduler; one rank busy for 1 s on a 2-rank instance is half an instance-second)."""
        _, new, cached, requests, seconds = self._busy
        self._busy = None
        if requests and seconds > 0 and self._on_interval is not None:
            self._on_interval(self, new, cached, requests, seconds)

    # ----- leaving work -----
    def evict_all(self) -> tuple[list[Request], list[Request]]:
        """Take every request off the instance (switch drain, weight update): (not yet decoding, decoding).
        Prefill progress and generated tokens stay with the requests; the caller decides what is kept. Requests
        waiting for a decode slot or in transfer come back in the first list; parked ones in the second."""
        waiting, decoding = [], []
        for rs in self.ranks:
            waiting += list(rs.admit) + list(rs.prefill)
            for req in rs.running.values():
                self._settle(rs, req)
                decoding.append(req)
            decoding += list(rs.parked)
            rs.admit.clear(), rs.prefill.clear(), rs.running.clear(), rs.finish_heap.clear(), rs.parked.clear()
            rs.finish_max = 0
            rs.prefill_left = rs.context = rs.reserved = rs.pending = 0
            rs.cache.clear()
        self._regime = None
        self._busy = None  # an interrupted interval says nothing about θ
        self.wake_at = INF
        self.n_requests = self.prefill_left = 0
        return waiting, decoding

    def remove(self, req: Request) -> bool:
        """Take one request off the instance (its trajectory was dropped); False when it is not here."""
        home = self.ranks[req.rank] if 0 <= req.rank < len(self.ranks) else None
        for rs in ([home] if home is not None else []) + self.ranks:
            if self._remove_from(rs, req):
                self.n_requests -= 1
                return True
        return False

    def _remove_from(self, rs: Rank, req: Request) -> bool:
        if req in rs.admit:
            rs.admit.remove(req)
            return True
        if req in rs.parked:
            rs.parked.remove(req)
            return True
        if req in rs.prefill:
            rs.prefill.remove(req)
            rs.prefill_left -= req.prompt - req.done
            self.prefill_left -= req.prompt - req.done
            if self.role is None:
                rs.reserved -= req.prompt
                rs.pending -= 1
            self._regime = None
            return True
        if rs.running.pop(req.rid, None) is not None:
            self._settle(rs, req)
            rs.finish_heap = [e for e in rs.finish_heap if e[1] != req.rid]
            heapq.heapify(rs.finish_heap)
            rs.finish_max = max((f for f, _ in rs.finish_heap), default=0)
            rs.context -= req.context
            self._regime = None
            self._admit(rs, self.t)
            return True
        return False

    def release(self, req: Request) -> None:
        """Drop a decode pre-allocation whose transfer will never land (its trajectory was dropped)."""
        rs = self.ranks[req.rank]
        rs.reserved -= req.context
        rs.pending -= 1
        self.n_requests -= 1
        self._admit(rs, self.t)
