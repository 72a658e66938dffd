"""The simulated rollout cluster: G GPUs in instances, run colocated, as static PD, or adaptive (§4, §5).

Routing (public SGLang 0.5.23 / sglang-router behaviour; ``ClusterConfig.routing``):
* instance: the router's ``cache_aware`` policy sends a trajectory back to the instance that served its previous turn
  unless that instance is overloaded (more than 64 requests above the least loaded one and 1.5x its load), else to the
  least loaded instance;
* DP rank inside the instance: ``sglang`` = SGLang's default load balancing, which ignores prefixes: round robin for
  colocated and decode servers, ``follow_bootstrap_room`` (the router's random bootstrap room) for PD prefill servers,
  so a trajectory finds its prefix on the rank it lands on with probability ~1/dp_ranks; ``rank_aware`` = a DP-aware
  router that also returns to the rank (an upper bound on cache reuse).
A prefix hit is whatever the landing rank's prefix cache still holds (prefix_cache.py: LRU inside the free KV pool).

Request path. Colocated: a request is admitted to a rank (instance.py: slots and KV), prefilled and decoded there. PD:
prefilled on a prefill rank, then placed on the least busy decode rank that has a slot and KV for it; when none has,
it waits in the front's FIFO queue for the first that frees (late binding: SGLang's router binds the decode instance
at dispatch, which would leave capacity switched to decode idle until new requests arrive; our front re-routes waiting
requests, whose prompt is still cached on the prefill side). Once admitted its KV crosses the network: a transfer
waits for both ranks' NICs (each rank's NICs carry one transfer at a time, at ``gpus_per_rank`` x the per-GPU NIC
bandwidth), then decoding starts.

Role switch (Appendix C): the instance leaves the routing pool; queued prefills restart elsewhere keeping their progress
(persisted KV), decode requests move to other decode instances with their KV (a transfer from the switching instance)
and generated tokens; its prefix cache is lost; it serves its new role ``switch_s`` later. When the two roles have
different instance shapes (stage-specific parallelism), switched instances are regrouped: two 16-GPU prefill instances
become one 32-GPU decode instance and back. Weight update (async, §3.1): every KV is stale; queued prefills restart from
scratch and decoding requests re-prefill prompt + generated tokens before they continue; all prefix caches are dropped.

Engine events go to a ``Lifecycle`` (adaptive.py drives the real control plane with them; the others discard them).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from functools import partial

from sglang_prorsa.policy.role_switch.capacity import InstanceStatus, Role
from sglang_prorsa.sim.config import ClusterConfig, ModelConfig, RolloutConfig
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.sim.instance import INF, Instance, Rank, Request
from sglang_prorsa.sim.lifecycle_sink import Lifecycle
from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.sim.routing_index import RoutingIndex
from sglang_prorsa.sim.stage_clock import StageClock
from sglang_prorsa.sim.trainer import Trainer, TrajectoryRun

BALANCE_ABS, BALANCE_REL = 64, 1.5  # sglang-router cache_aware defaults (--balance-abs/rel-threshold)


class Cluster:
    def __init__(self, cluster: ClusterConfig, model: ModelConfig, rollout: RolloutConfig, events: EventQueue,
                 trainer: Trainer, lifecycle: Lifecycle) -> None:
        self.config, self.model, self.events = cluster, model, events
        self.trainer, self.lifecycle = trainer, lifecycle
        trainer.engines = self
        prefill_shape, decode_shape = cluster.shapes(model)
        self.perf = {Role.PREFILL: PerfModel(model, prefill_shape), Role.DECODE: PerfModel(model, decode_shape)}
        self.colocated = cluster.mode == "colocated"
        self.rank_aware = cluster.routing == "rank_aware"
        self._ids = itertools.count()
        p, d = cluster.split(model)
        roles = [None] * d if self.colocated else [Role.PREFILL] * p + [Role.DECODE] * d
        self.instances = [self._new_instance(role) for role in roles]
        self._pools: RoutingIndex | None = None  # see _routing_pools
        self._dirty: tuple[set[Instance], set[Instance]] = (set(), set())  # see _touch
        self.retired: list[Instance] = []  # regrouped away; kept for the GPU-time accounting
        self._rng = random.Random(f"{rollout.seed}/bootstrap-room")
        self._rid = itertools.count()
        self._awaiting: deque[Request] = deque()  # prefilled, waiting for a decode rank with room (FIFO)
        self._in_transfer: dict[Request, Instance] = {}  # request -> decode instance that admitted it
        self._src: dict[Request, tuple[Instance, int]] = {}  # where a prefilled request's KV sits
        self._untracked: set[Request] = set()  # re-prefills the lifecycle API cannot report (see adaptive.py)
        self.epoch = 0  # weight version as the engines see it
        self.switches: list[tuple[float, str, str]] = []  # (time, instance, new role)
        self._regroup: dict[Role, list[Instance]] = {Role.PREFILL: [], Role.DECODE: []}
        self.prefill_tokens = self.cached_tokens = 0  # prompt tokens prefilled and served from prefix caches
        self.stage_clock: StageClock | None = None  # records each turn's stage times when set (stage_clock.py)

    def _new_instance(self, role: Role | None) -> Instance:
        perf = self.perf[Role.PREFILL if role is None else role]
        inst = Instance(f"i{next(self._ids)}", perf, role, self._prefilled, self._decoded, self._admitted,
                        self.lifecycle.prefill_interval, self.config.time_quantum_s)
        return inst

    @property
    def by_id(self) -> dict[str, Instance]:
        return {inst.iid: inst for inst in self.instances}

    # ----- the trainer's side (trainer.Engines) -----
    def submit(self, run: TrajectoryRun, t: float) -> None:
        x = run.prompt_tokens_at(run.turn)
        inst, rank = self._route(run)
        cached = inst.cached_tokens(rank, run)
        if cached > x:
            cached = x
        req = Request(next(self._rid), run, x, cached, run.plan.turns.output_tokens(run.turn), cached=cached)
        run.request = req
        self.lifecycle.request_arrived(run, x, inst.iid, t)
        if self.stage_clock is not None:
            self.stage_clock.arrived(req, t)
        self._add_prefill(inst, req, rank, t)

    def weight_update(self, t: float) -> None:
        self.epoch += 1
        moved: list[Request] = []
        for inst in self._active():
            inst.advance(t)
            waiting, decoding = inst.evict_all()
            self._touch(inst)
            if inst.role is Role.DECODE:
                moved += waiting + decoding  # prefilled with the old weights: prefill again
            else:
                for req in waiting:
                    req.done = req.cached = 0  # partial prefill was computed with the old weights
                    self._restart(req, t)
                moved += decoding
            self._plan(inst)
        moved += list(self._awaiting) + list(self._in_transfer)
        self._awaiting.clear()
        self._in_transfer.clear()
        self._src.clear()
        for inst in self._switching():
            inst.evict_all()  # caches only: switching instances hold no work
        for req in moved:
            self._reprefill(req, t)

    def abort(self, run: TrajectoryRun, t: float) -> None:
        req, run.request = run.request, None
        if req is None:
            return
        if self.stage_clock is not None:
            self.stage_clock.dropped(req)
        self._untracked.discard(req)
        self._src.pop(req, None)
        target = self._in_transfer.pop(req, None)
        if target is not None:
            target.advance(t)
            target.release(req)
            self._plan(target)
            return
        if req in self._awaiting:
            self._awaiting.remove(req)
            return
        for inst in self.instances:
            inst.advance(t)
            self._touch(inst)
            if inst.remove(req):
                self._plan(inst)
                return

    # ----- routing -----
    def _active(self, role: Role | None = None) -> list[Instance]:
        return [i for i in self.instances if i.status is InstanceStatus.ACTIVE and (role is None or i.role is role)]

    def _switching(self) -> list[Instance]:
        return [i for i in self.instances if i.status is not InstanceStatus.ACTIVE]

    def _routing_pools(self) -> RoutingIndex:
        """The prefill pool and the active decode instances (in instance order), indexed by load (routing_index.py)
        so that routing a request costs no scan of the cluster. Rebuilt when a role switch changes an instance's
        role or status (``_pools = None``); between switches, kept current through ``_touch``."""
        if self._pools is None:
            self._pools = RoutingIndex(self._active(None if self.colocated else Role.PREFILL), self._active(Role.DECODE),
                                       self._dirty)
        return self._pools

    def _touch(self, inst: Instance) -> None:
        """``inst``'s requests or ranks changed: the routing index re-reads its load at the next query. Called after
        every change (``_plan`` after most), and at the start of the instance callbacks, which run inside its own
        ``advance`` once its completions are applied and may route before ``advance`` returns."""
        self._dirty[inst.role is Role.DECODE].add(inst)

    def _route(self, run: TrajectoryRun | None) -> tuple[Instance, int]:
        """(instance, rank) for the next prefill of ``run`` (None: no cache to look for)."""
        home = run.home if run is not None else None
        pools = self._routing_pools()
        least = pools.least_loaded()  # fewest requests, then queued tokens, then id
        assert least is not None, "no instance to route to"
        if home is not None and home[0] is not least and pools.in_prefill_pool(home[0]):
            h, m = home[0].n_requests, least.n_requests
            if not (h - m > BALANCE_ABS and h > BALANCE_REL * m):
                least = home[0]
        if self.rank_aware:
            rank = home[1] if home is not None and home[0] is least else least.least_loaded_rank()
        elif self.colocated:
            rank = least.round_robin_rank()
        else:  # PD prefill: follow_bootstrap_room, the room being random per request
            rank = self._rng.randrange(len(least.ranks))
        return least, rank

    def _add_prefill(self, inst: Instance, req: Request, rank: int, t: float) -> None:
        if inst.prefilling(rank):  # joins the queue behind work the current regime already accounts for
            inst.add_prefill(req, rank, t)
            self._touch(inst)
            return
        inst.advance(t)
        inst.add_prefill(req, rank, t)
        self._plan(inst)

    def _restart(self, req: Request, t: float) -> None:
        """Send a request that has not finished prefill to another (or the same) instance, keeping ``req.done``."""
        inst, rank = self._route(None)
        self._add_prefill(inst, req, rank, t)

    def _reprefill(self, req: Request, t: float) -> None:
        """New weights: prompt + generated so far is prefilled again (untracked), then decoding continues."""
        req.prompt, req.output, req.generated = req.context, req.output - req.generated, 0
        req.done = req.cached = 0
        req.untracked = True
        self._untracked.add(req)
        if self.stage_clock is not None:
            self.stage_clock.reprefilled(req)
        self._restart(req, t)

    def reprefill_tokens(self) -> int:
        """Tokens a weight update now would send back to prefill: every decoding, waiting or in-transfer context."""
        decode = sum(inst.kv_used() for inst in self.instances if inst.role is Role.DECODE)
        return decode + sum(r.context for r in self._awaiting)

    def untracked_prefill_tokens(self) -> int:
        return sum(r.prompt - r.done for r in self._untracked)

    def untracked_prefill_requests(self) -> int:
        """Re-prefills in progress: requests that go back to decode once prefilled."""
        return len(self._untracked)

    def awaiting_requests(self) -> int:
        return len(self._awaiting)

    def awaiting_kv_tokens(self) -> int:
        return sum(r.context for r in self._awaiting)

    # ----- decode placement and KV transfer -----
    def _place(self, req: Request, t: float, front: bool = False) -> None:
        """Late-bound decode placement: the request goes to the least busy decode rank that has a slot and KV for it
        now, else it waits in the front's queue (FIFO; ``front``: ahead of the others, for requests that were already
        decoding on a switched instance) for the first one that frees."""
        if front:
            self._awaiting.appendleft(req)
            self._drain(t)
        elif self._awaiting or not self._try_place(req, t):
            self._awaiting.append(req)

    def _try_place(self, req: Request, t: float) -> bool:
        """Admit ``req`` on the decode rank with the fewest running requests, then the least loaded instance, then the
        lowest rank index, among those with a slot and KV for it now."""
        where = self._routing_pools().place(req.context)  # ties: the first in instance order
        if where is None:
            return False
        where[0].add_decode(req, where[1], t)  # admitted at once: a reservation, the regime is unchanged
        self._touch(where[0])
        if self.stage_clock is not None:
            self.stage_clock.admitted(req, t)
        return True

    def _drain(self, t: float) -> None:
        """Place waiting prefilled requests while some decode rank has room."""
        awaiting = self._awaiting
        while awaiting and self._try_place(awaiting[0], t):
            awaiting.popleft()

    def _admitted(self, inst: Instance, rs: Rank, req: Request, t: float) -> None:
        """A decode rank pre-allocated ``req``'s KV: move it over both ranks' NICs, then start decoding."""
        src = self._src.pop(req, None)
        src_rank = src[0].ranks[src[1]] if src is not None and src[1] < len(src[0].ranks) else None
        start = max(t, rs.nic_free, src_rank.nic_free if src_rank is not None else t)
        bw = inst.perf  # the slower of the two ranks' NICs sets the pace
        if src is not None and src[0].perf.rank_bytes_per_s < bw.rank_bytes_per_s:
            bw = src[0].perf
        end = start + bw.transfer_s(req.context)
        rs.nic_free = end
        if src_rank is not None:
            src_rank.nic_free = end
        self._in_transfer[req] = inst
        self.events.at(end + self.model.transfer_latency_s, partial(self._landed, inst, req))

    def _landed(self, inst: Instance, req: Request, t: float) -> None:
        if self._in_transfer.get(req) is not inst:
            return  # dropped, re-prefilled or moved while in flight
        del self._in_transfer[req]
        inst.advance(t)
        inst.start_decode(req)
        self._plan(inst)

    # ----- instance callbacks -----
    def _prefilled(self, inst: Instance, req: Request, t: float) -> None:
        run: TrajectoryRun = req.owner
        self._touch(inst)  # called from inst.advance, which has changed its load
        self.lifecycle.prefill_finished(inst.iid, req, t)
        if self.stage_clock is not None:
            self.stage_clock.prefilled(req, t)
        self._untracked.discard(req)
        self.prefill_tokens += req.prompt
        self.cached_tokens += req.cached
        run.home = (inst, req.rank)
        if inst.role is None:
            return  # colocated: already running on the same rank
        self._src[req] = (inst, req.rank)
        self._place(req, t)

    def _decoded(self, inst: Instance, req: Request, t: float) -> None:
        run: TrajectoryRun = req.owner
        self._touch(inst)  # called from inst.advance, which has changed its load
        run.request = None
        self.lifecycle.decode_finished(run, t)
        if self.stage_clock is not None:
            self.stage_clock.decoded(req, t)
        self.trainer.on_decoded(run, t)
        if self._awaiting and inst.role is Role.DECODE:
            self._drain(t)

    # ----- time -----
    def _plan(self, inst: Instance) -> None:
        """Plan ``inst``'s next regime (it may retract requests) after a change to it, and ``_touch`` it."""
        before = inst.wake_at
        end = inst.plan()
        self._dirty[inst.role is Role.DECODE].add(inst)  # _touch, inlined (hot)
        if end < INF and end != before:
            self.events.at(end, partial(self._wake, inst, end))

    def _wake(self, inst: Instance, end: float, t: float) -> None:
        if inst.wake_at == end:
            inst.advance(t)
            end = inst.plan()  # _plan inlined (the hottest path): this event was the one pending
            self._dirty[inst.role is Role.DECODE].add(inst)  # _touch, inlined
            if end < INF:
                self.events.at(end, partial(self._wake, inst, end))

    # ----- role switch (Appendix C) -----
    def start_switch(self, iid: str, role: Role, t: float) -> None:
        inst = self.by_id[iid]
        src_role = inst.role
        inst.advance(t)
        waiting, decoding = inst.evict_all()
        inst.status, inst.role = InstanceStatus.SWITCHING, role
        self._pools = None
        self.lifecycle.instance_interrupted(iid)
        self.switches.append((t, iid, role.value))
        if src_role is Role.PREFILL:
            for req in waiting:
                self._restart(req, t)  # its persisted progress is loaded by the next instance
        else:
            for req in waiting:
                self._place(req, t)  # still waiting for a decode slot: its KV is where it was
            for req in reversed(decoding):
                self._src[req] = (inst, req.rank)  # KV persisted from this instance's NICs
                self._place(req, t, front=True)
            for req in [r for r, d in self._in_transfer.items() if d is inst]:
                del self._in_transfer[req]
                self._place(req, t)
        self.events.at(t + inst.perf.switch_s, lambda t1: self._switched(inst, role, t1))

    def _switched(self, inst: Instance, role: Role, t: float) -> None:
        inst.last_switch_s = inst.perf.switch_s
        target = self.perf[role]
        if inst.perf.shape == target.shape:
            inst.perf = target
            self._activate(inst, t)
            return
        pool = self._regroup[role]
        pool.append(inst)
        while sum(i.gpus for i in pool) >= target.gpus:
            taken, gpus = [], 0
            while gpus < target.gpus:
                taken.append(pool.pop(0))
                gpus += taken[-1].gpus
            spot = self.instances.index(taken[0])
            for old in taken:
                self.instances.remove(old)
                self.retired.append(old)
            self._pools = None
            for _ in range(gpus // target.gpus):
                new = self._new_instance(role)
                new.t, new.last_switch_s = t, inst.perf.switch_s
                self.instances.insert(spot, new)
                self._activate(new, t)

    def _activate(self, inst: Instance, t: float) -> None:
        inst.status, inst.role_since, inst.t = InstanceStatus.ACTIVE, t, t
        self._pools = None
        if inst.role is Role.DECODE:
            self._drain(t)
        else:
            self._rebalance(inst, t)

    def _rebalance(self, new: Instance, t: float) -> None:
        """A switched-in prefill instance takes over requests queued, not started, on busier prefill instances (the
        front cancels and re-sends them), while that narrows the gap in queued tokens. Without it, only requests
        arriving after the switch would use it. (Decode needs no such step: placement is late-bound, see _place.)"""
        if self.colocated:
            return
        donors = [i for i in self._active(new.role) if i is not new]
        while True:  # prefill: move queued, not started requests while that narrows the gap in queued tokens
            donor = max(donors, key=lambda i: (i.prefill_left, i.iid), default=None)
            if donor is None:
                return
            tail = [(r.prefill[-1], k) for k, r in enumerate(donor.ranks) if len(r.prefill) > 1]
            if not tail:
                return
            req, _ = max(tail, key=lambda e: e[0].prompt - e[0].done)
            size = req.prompt - req.done
            if new.prefill_left + size >= donor.prefill_left - size:
                return
            donor.advance(t)
            donor.remove(req)
            self._plan(donor)
            req.cached = req.done = 0  # its prefix cache stayed on the donor: prefilled in full
            rank = new.round_robin_rank() if not self.rank_aware else new.least_loaded_rank()
            self._add_prefill(new, req, rank, t)

    # ----- metrics -----
    def all_instances(self) -> list[Instance]:
        return self.instances + self.retired
