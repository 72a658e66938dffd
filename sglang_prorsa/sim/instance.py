"""One simulated engine instance: attention-DP ranks that step together (perf_model.py), advanced event by event.

Each rank holds a FIFO prefill queue (chunked: ``chunk`` tokens per iteration, requests packed in arrival order, as
SGLang packs a prefill batch) and a running decode batch. A rank with prefill work runs a prefill chunk, otherwise a
decode step (prefill first, no mixed batches: SGLang's default). All ranks of the instance then wait for the slowest.

Simulating every ~30 ms iteration of 128 GPUs for an hour would take minutes, so the instance moves in *regimes*:
while no request starts or finishes, every iteration has the same per-rank operations and the same length T, so k
iterations are applied at once. A regime ends at the first prefill or decode completion; an outside change (a new
request, a switch) applies the whole iterations done so far and re-plans. Context growth inside a regime is applied
at its end (the step time uses the context at its start; regimes are short, so the error is small).

KV: a request reserves prompt + output tokens on its rank when it is admitted (no retraction model); it waits in the
rank's admission queue while the pool is full. Prefill-only instances do not hold KV beyond the transfer.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.srt.role_switch.capacity import InstanceStatus, Role

INF = math.inf


@dataclass(slots=True, eq=False)
class Request:
    """One model call of a trajectory. ``done`` counts prompt tokens already in KV (cached prefix + chunks)."""

    rid: int
    owner: object  # the trajectory run that receives the completion callbacks
    prompt: int  # x: full prompt length
    done: int  # prefill progress (starts at the cached prefix)
    output: int  # tokens to generate in all
    generated: int = 0  # while running, tokens generated before joining the batch (see Rank.generated)
    joined_step: int = 0  # the rank's decode step when it joined the running batch
    untracked: bool = False  # a re-prefill the lifecycle API cannot report (weight update / cancel-and-resend)
    rank: int = -1
    finish_step: int = 0

    @property
    def context(self) -> int:
        return self.prompt + self.generated

    @property
    def kv_need(self) -> int:
        return self.prompt + self.output


@dataclass(slots=True)
class Rank:
    prefill: deque = field(default_factory=deque)
    prefill_left: int = 0  # tokens still to prefill over the whole queue
    running: dict = field(default_factory=dict)  # rid -> Request
    finish_heap: list = field(default_factory=list)  # (finish step, rid)
    steps: int = 0  # decode steps done: a running request finishes at step ``finish_step``
    context: int = 0  # KV tokens of the running batch (attention cost of a decode step)
    kv_reserved: int = 0
    admit: deque = field(default_factory=deque)  # waiting for KV room


class Instance:
    """``role`` None = colocated (prefill and decode on every rank)."""

    def __init__(self, iid: str, perf: PerfModel, role: Role | None, on_prefilled: Callable, on_decoded: Callable) -> None:
        self.iid, self.perf, self.role = iid, perf, role
        self.status, self.role_since = InstanceStatus.ACTIVE, None
        self.ranks = [Rank() for _ in range(perf.ranks)]
        self.gpus_per_rank = perf.model.gpus_per_instance / perf.ranks
        self.kv_per_rank = perf.kv_tokens_per_rank
        self._on_prefilled, self._on_decoded = on_prefilled, on_decoded
        self.t = 0.0
        self._regime: tuple | None = None  # (start, T, k, per-rank (op, tokens or batch))
        self.version = 0  # bumps whenever the next event moves; stale heap entries are skipped
        self.busy_s = 0.0  # wall time with at least one rank working
        self.idle_gpu_s = 0.0  # GPU-seconds lost waiting for the slowest rank (interference + imbalance)
        self.work_gpu_s = 0.0

    # ----- loads, for routing and the controller's reports -----
    def prefill_load(self) -> int:
        return sum(r.prefill_left for r in self.ranks)

    def kv_used(self) -> int:
        return sum(r.context for r in self.ranks)

    def kv_free(self) -> int:
        return sum(self.kv_per_rank - r.kv_reserved for r in self.ranks)

    def has_work(self) -> bool:
        return any(r.prefill or r.running or r.admit for r in self.ranks)

    # ----- entering work -----
    def add_prefill(self, req: Request, rank: int | None = None) -> None:
        """A request joins a rank's queue; colocated ranks reserve its KV first (or queue it for admission)."""
        r = self._pick(rank)
        req.rank = r
        rank_state = self.ranks[r]
        if self.role is None:
            rank_state.admit.append(req)  # FIFO behind earlier requests still waiting for KV
            self._admit(rank_state)
        else:
            self._enqueue(rank_state, req)

    def add_decode(self, req: Request) -> bool:
        """Reserve KV for a transferred request on the rank with most room; False when no rank can hold it."""
        r = max(range(len(self.ranks)), key=lambda i: (self.kv_per_rank - self.ranks[i].kv_reserved, -i))
        rank_state = self.ranks[r]
        if rank_state.kv_reserved + req.kv_need > self.kv_per_rank and rank_state.kv_reserved > 0:
            return False
        req.rank = r
        rank_state.kv_reserved += req.kv_need
        return True

    def start_decode(self, req: Request) -> None:
        """KV arrived (transfer done): the request joins the running batch of the rank that reserved it."""
        self._run(self.ranks[req.rank], req)

    def _pick(self, rank: int | None) -> int:
        if rank is not None and 0 <= rank < len(self.ranks):
            return rank
        return min(range(len(self.ranks)), key=lambda i: (self.ranks[i].kv_reserved + self.ranks[i].prefill_left, i))

    def _enqueue(self, rank: Rank, req: Request) -> None:
        if self.role is None:
            rank.kv_reserved += req.kv_need
        rank.prefill.append(req)
        rank.prefill_left += req.prompt - req.done

    def _run(self, rank: Rank, req: Request) -> None:
        req.joined_step = rank.steps
        req.finish_step = rank.steps + max(1, req.output - req.generated)
        rank.running[req.rid] = req
        heapq.heappush(rank.finish_heap, (req.finish_step, req.rid))
        rank.context += req.context

    # ----- time -----
    def plan(self) -> float:
        """Choose the next regime from ``self.t``; returns when it ends (inf when idle)."""
        self.version += 1
        ops, times, k = [], [], INF
        chunk = self.perf.chunk
        for rank in self.ranks:
            if rank.prefill and self.role is not Role.DECODE:
                head = rank.prefill[0]
                left_head = head.prompt - head.done
                if rank.prefill_left <= chunk:
                    n, k_r = rank.prefill_left, 1
                else:
                    n, k_r = chunk, min(math.ceil(left_head / chunk), rank.prefill_left // chunk)
                ops.append(("P", n))
                times.append(self.perf.prefill_iteration_s(n, head.done))
            elif rank.running:
                ops.append(("D", len(rank.running)))
                times.append(self.perf.decode_step_s(len(rank.running), rank.context))
                k_r = rank.finish_heap[0][0] - rank.steps
            else:
                ops.append(None)
                times.append(0.0)
                k_r = INF
            k = min(k, k_r)
        period, _ = self.perf.synchronised(times)
        if period <= 0 or k is INF:
            self._regime = None
            return INF
        self._regime = (self.t, period, int(k), ops, times)
        return self.t + k * period

    def advance(self, now: float) -> None:
        """Apply the whole iterations finished by ``now``; completions call back (in rank order)."""
        if self._regime is None:
            self.t = max(self.t, now)
            return
        start, period, k, ops, times = self._regime
        done = min(k, int((now - start) / period + 1e-9))
        if done <= 0:
            return
        self.t = start + done * period
        self.busy_s += done * period
        gpr = self.gpus_per_rank
        self.idle_gpu_s += done * sum(period - t for t in times) * gpr
        self.work_gpu_s += done * sum(times) * gpr
        self._regime = None
        prefilled, decoded = [], []
        for rank, op in zip(self.ranks, ops):
            if op is None:
                continue
            if op[0] == "P":
                self._apply_prefill(rank, op[1] * done, prefilled)
            else:
                self._apply_decode(rank, done, decoded)
        for req in prefilled:
            self._on_prefilled(self, req, self.t)
        for req in decoded:
            self._on_decoded(self, req, self.t)

    def _apply_prefill(self, rank: Rank, tokens: int, out: list) -> None:
        rank.prefill_left -= tokens
        while tokens > 0 and rank.prefill:
            head = rank.prefill[0]
            take = min(tokens, head.prompt - head.done)
            head.done += take
            tokens -= take
            if head.done >= head.prompt:
                rank.prefill.popleft()
                if self.role is None:
                    self._run(rank, head)  # colocated: decode continues on the same rank, KV already there
                out.append(head)

    def _apply_decode(self, rank: Rank, steps: int, out: list) -> None:
        # O(1) per regime plus O(log B) per finished request: generated counts are settled only when a request leaves.
        rank.steps += steps
        rank.context += steps * len(rank.running)
        while rank.finish_heap and rank.finish_heap[0][0] <= rank.steps:
            _, rid = heapq.heappop(rank.finish_heap)
            req = rank.running.pop(rid)
            self._settle(rank, req)
            rank.context -= req.context
            rank.kv_reserved -= req.kv_need
            out.append(req)
        self._admit(rank)

    @staticmethod
    def _settle(rank: Rank, req: Request) -> None:
        """A request leaves the running batch: fix its generated count from the rank's step counter."""
        req.generated = min(req.output, req.generated + rank.steps - req.joined_step)
        req.joined_step = rank.steps

    def _admit(self, rank: Rank) -> None:
        while rank.admit and (rank.kv_reserved + rank.admit[0].kv_need <= self.kv_per_rank or rank.kv_reserved == 0):
            self._enqueue(rank, rank.admit.popleft())

    def release(self, req: Request) -> None:
        """Drop a reservation made by ``add_decode`` that will never run (its trajectory was dropped)."""
        self.ranks[req.rank].kv_reserved -= req.kv_need

    def evict_all(self) -> tuple[list[Request], list[Request]]:
        """Take every request off the instance (switch drain, weight update): (not yet decoding, decoding).
        Prefill progress and generated tokens stay with the requests; the caller decides what is kept."""
        waiting, decoding = [], []
        for rank in self.ranks:
            waiting += list(rank.admit) + list(rank.prefill)
            for req in rank.running.values():
                self._settle(rank, req)
                decoding.append(req)
            rank.admit.clear(), rank.prefill.clear(), rank.running.clear(), rank.finish_heap.clear()
            rank.prefill_left = rank.context = rank.kv_reserved = 0
        self._regime = None
        return waiting, decoding

    def remove(self, req: Request) -> bool:
        """Take one request off the instance (its trajectory was dropped); False when it is not here."""
        for rank in self.ranks:
            if req in rank.admit:
                rank.admit.remove(req)
                return True
            if req in rank.prefill:
                rank.prefill.remove(req)
                rank.prefill_left -= req.prompt - req.done
                if self.role is None:
                    rank.kv_reserved -= req.kv_need
                self._regime = None
                return True
            if rank.running.pop(req.rid, None) is not None:
                self._settle(rank, req)
                rank.finish_heap = [e for e in rank.finish_heap if e[1] != req.rid]
                heapq.heapify(rank.finish_heap)
                rank.context -= req.context
                rank.kv_reserved -= req.kv_need
                self._regime = None
                self._admit(rank)
                return True
        return False
