"""The time half of a simulated instance (instance.py): regimes of identical iterations, planned and applied.

Simulating every ~30 ms iteration of 128 GPUs for hours would take minutes, so the instance moves in *regimes*: while
no request starts, finishes or hits the KV limit, every iteration has the same per-rank operations and length T, so k
iterations are applied at once. A regime ends at the first prefill or decode completion or KV overflow, or, with
``time_quantum_s`` > 0, runs on through completions for up to that long while every rank keeps its operation: each
completion is still reported at its own iteration's end, only the batch slot and KV it frees wait for the regime's end
(a delay below the quantum). An outside change (a new request, a switch) applies the whole iterations done so far and
re-plans. Context growth inside a regime is applied at its end (the step time uses the context at its start).

Accounting per instance: busy time, GPU-seconds of work, and GPU-seconds lost waiting at the MoE collective, split into
``interference`` (a rank waiting for a rank of the other stage: a decode step held by a prefill chunk, §3.2 / Figure 6)
and ``imbalance`` (waiting for a rank of the same stage, or having nothing to do while others work). A prefill
instance also reports its busy intervals (idle -> idle) for the θ model, timed in instance-equivalent seconds (the
prefilling ranks' busy time over the rank count), so θ is an instance's capacity whatever the load.
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter, itemgetter

from sglang_prorsa.policy.role_switch.capacity import Role
from sglang_prorsa.policy.role_switch.theta import MAX_SAMPLE_S
from sglang_prorsa.sim.requests import Rank, Request

INF = math.inf
_iteration = itemgetter(0)  # completions sort by the iteration that ended them (stable: rank order on ties)
prefill_queue = attrgetter("prefill")  # a rank's prefill queue (any(map(...)): some rank has prefill work)


class RegimeStepper:
    """``plan`` and ``advance`` of ``Instance``: which iterations run next and what they did. Uses the instance's
    ranks, limits and callbacks (instance.py), and its admission (``_run``, ``_admit``) and θ interval hooks."""

    def plan(self) -> float:
        """Choose the next regime from ``self.t``; returns when it ends (inf when idle).

        Each busy rank can run ``k_exact`` iterations before its first completion and ``k_max`` before its operation
        would change (its full prefill chunks run out, its KV pool fills). A regime lasts the smallest ``k_exact``,
        stretched toward ``time_quantum_s`` within every rank's ``k_max``: completions inside it are reported at their
        exact iteration times; only the slot and KV they free are reused at the regime's end."""
        chunk, cap = self.perf.chunk, self.cap
        pb, pt, pc = self._p
        db, ds, dc = self._d
        prefills = self.role is not Role.DECODE
        quantum = self.quantum
        ops, times = [], []
        # One pass: the slowest rank (the first of equal ones), the bounds' minima, the work summed in rank order.
        period, slowest_op, k_lo, k_hi = -INF, 0, INF, INF
        work, prefilling = 0.0, 0
        for rs in self.ranks:
            if prefills and rs.prefill:
                head = rs.prefill[0]
                left = rs.prefill_left
                if left <= chunk:
                    n, k_exact, k_max = left, 1, 1
                else:
                    n, k_max = chunk, left // chunk
                    k_exact = -(-(head.prompt - head.done) // chunk)
                    if k_exact > k_max:
                        k_exact = k_max
                op = n  # > 0: prefill of n tokens (0: only fully cached prompts queued, no chunk to run)
                t = pb + pt * n + pc * n * (head.done + n / 2)
                if n > 0:
                    prefilling += 1
            elif rs.running:
                batch = len(rs.running)
                free = cap - rs.context - rs.reserved
                while free < batch and batch > 1:  # the next step cannot allocate: retract (SGLang retract_decode)
                    self._retract(rs)
                    batch = len(rs.running)
                    free = cap - rs.context - rs.reserved
                op = -batch  # < 0: decode of |n| sequences
                t = db + ds * batch + dc * rs.context
                k_exact = rs.finish_heap[0][0] - rs.steps
                if batch > 1:
                    k_max = free // batch
                    if k_max < 1:
                        k_max = 1
                else:
                    k_max = k_exact
                if k_exact > k_max:
                    k_exact = k_max
                elif quantum > 0 and k_max > k_exact and rs.finish_max - rs.steps < k_max:
                    k_max = rs.finish_max - rs.steps
            else:  # idle: waits the whole iteration, adds no work
                ops.append(0)
                times.append(0.0)
                if period < 0.0:
                    period = 0.0
                continue
            ops.append(op)
            times.append(t)
            work += t
            if t > period:
                period, slowest_op = t, op
            if k_exact < k_lo:
                k_lo = k_exact
            if k_max < k_hi:
                k_hi = k_max
        if k_lo == INF:
            self._regime = None
            self.wake_at = INF
            return INF
        k = k_lo
        if quantum > 0:
            stretch = int(quantum / period)
            if stretch > k:
                k = min(stretch, k_hi)
        slowest_prefill = slowest_op > 0
        interference = imbalance = 0.0
        for op, t in zip(ops, times):
            if op == 0:
                imbalance += period
            elif (op > 0) is slowest_prefill:
                imbalance += period - t
            else:
                interference += period - t
        self._regime = (self.t, period, k, ops, interference, imbalance, work, prefilling)
        self.wake_at = self.t + k * period
        return self.wake_at

    def advance(self, now: float) -> None:
        """Apply the whole iterations finished by ``now``; completions call back in time order, each at its own
        iteration's end."""
        regime = self._regime
        if regime is None:
            if now > self.t:
                self.t = now
            return
        start, period, k, ops, interference, imbalance, work, prefilling = regime
        done = int((now - start) / period + 1e-9)
        if done > k:
            done = k
        elif done <= 0:
            return
        self.t = start + done * period
        self.busy_s += done * period
        gpr = done * self.gpus_per_rank
        self.work_gpu_s += work * gpr
        self.interference_gpu_s += interference * gpr
        self.imbalance_gpu_s += imbalance * gpr
        self._regime = None
        if self._busy is not None:  # θ sample time: the prefilling ranks' busy seconds over the rank count
            self._busy[4] += done * period * prefilling / len(ops)
        prefilled, decoded = [], []
        for rs, op in zip(self.ranks, ops):  # the common cases inline: the head goes on prefilling, nobody finishes
            if op > 0:
                tokens, head = op * done, rs.prefill[0]
                if head.prompt - head.done > tokens:
                    head.done += tokens
                    rs.prefill_left -= tokens
                    self.prefill_left -= tokens
                else:
                    self._apply_prefill(rs, op, done, prefilled)
            elif op < 0:
                if rs.finish_heap[0][0] > rs.steps + done:
                    rs.steps += done
                    rs.context += done * len(rs.running)
                else:
                    self._apply_decode(rs, done, decoded)
        if prefilled:
            if len(prefilled) > 1:
                prefilled.sort(key=_iteration)
            for it, req in prefilled:
                self._on_prefilled(self, req, start + it * period)
            if self._busy is not None:
                if not any(map(prefill_queue, self.ranks)):
                    self._close_busy()
                elif self._busy[4] >= MAX_SAMPLE_S:  # still busy: report this slice, the next starts now
                    self._close_busy()
                    self._busy = [self.t, 0, 0, 0, 0.0]
        if decoded:
            if len(decoded) > 1:
                decoded.sort(key=_iteration)
            for it, req in decoded:
                self._on_decoded(self, req, start + it * period)

    def _apply_prefill(self, rs: Rank, n: int, done: int, out: list) -> None:
        tokens = n * done
        rs.prefill_left -= tokens
        self.prefill_left -= tokens
        queue = rs.prefill
        busy = self._busy
        consumed = 0
        while tokens > 0 and queue:
            head = queue[0]
            take = head.prompt - head.done
            if take > tokens:
                take = tokens
            head.done += take
            tokens -= take
            consumed += take
            if head.done >= head.prompt:
                queue.popleft()
                if self.role is None:  # colocated: decode continues on the same rank, KV already there
                    rs.reserved -= head.prompt
                    rs.pending -= 1
                    self._run(rs, head)
                else:  # a prefill rank keeps the prompt it computed (not the output: decode makes that elsewhere)
                    self.n_requests -= 1
                    rs.cache.put(head.owner, head.prompt, self.room(rs))
                    if busy is not None:
                        busy[1] += head.prompt - head.cached
                        busy[2] += head.cached
                        busy[3] += 1
                out.append((-(-consumed // n), head))  # the iteration whose chunk finished it

    def _apply_decode(self, rs: Rank, steps: int, out: list) -> None:
        # O(1) per regime plus O(log B) per finished request: generated counts are settled only when a request leaves.
        first = rs.steps
        last = rs.steps = first + steps
        heap, running = rs.finish_heap, rs.running
        rs.context += steps * len(running)
        if not heap or heap[0][0] > last:
            return  # nobody finished (advance does that case inline)
        while heap and heap[0][0] <= last:
            finish, rid = heapq.heappop(heap)
            req = running.pop(rid)
            generated = req.generated + finish - req.joined_step
            req.generated = generated if generated < req.output else req.output
            rs.context -= req.context + last - finish  # its KV, and the steps counted for it after it finished
            out.append((finish - first, req))
            self.n_requests -= 1
            if self.role is None:  # colocated: the finished sequence stays in the radix cache
                rs.cache.put(req.owner, req.context, self.room(rs))
        if not heap:
            rs.finish_max = 0
        self._admit(rs, self.t)

    def _retract(self, rs: Rank) -> None:
        """Free KV by retracting the running request with the fewest generated tokens (ties: longest prompt)."""
        steps = rs.steps
        victim = min(rs.running.values(), key=lambda r: (r.generated + steps - r.joined_step, -r.prompt, r.rid))
        self._settle(rs, victim)
        del rs.running[victim.rid]
        rs.finish_heap = [e for e in rs.finish_heap if e[1] != victim.rid]
        heapq.heapify(rs.finish_heap)
        rs.finish_max = max((f for f, _ in rs.finish_heap), default=0)
        rs.context -= victim.context
        self.retractions += 1
        if self.role is None:  # recompute from scratch: prompt + generated so far, then continue decoding
            victim.prompt, victim.output, victim.generated = victim.context, victim.output - victim.generated, 0
            victim.done = victim.cached = 0
            rs.admit.appendleft(victim)
        else:
            rs.parked.append(victim)

    @staticmethod
    def _settle(rs: Rank, req: Request) -> None:
        """A request leaves the running batch: fix its generated count from the rank's step counter."""
        req.generated = min(req.output, req.generated + rs.steps - req.joined_step)
        req.joined_step = rs.steps
