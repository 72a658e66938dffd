"""The simulated rollout cluster: G GPUs in instances of m, run colocated, as static PD, or adaptive (§4, §5).

Request path. Colocated: a request goes to one instance (sticky to the one holding its prefix cache, else the least
loaded), is prefilled and decoded there. PD: it is prefilled on a prefill instance (sticky likewise), then a decode
instance with KV room reserves its prompt + output, the KV is transferred (perf_model.transfer_s) and decoding runs
there; with no room anywhere it waits, oldest first. A prefix cache hit skips the previous context of the trajectory
when it comes back to the same rank under the same weights and the same role epoch.

Role switch (Appendix C): the instance leaves the routing pool, its requests are cancelled and resent elsewhere
keeping their progress (prefill tokens done, tokens generated; the decode KV moves with a transfer), and it serves
its new role ``switch_s`` later. Weight update (async, §3.1): every request's KV is stale; prefill restarts and
decoding requests re-prefill prompt + generated tokens before they continue.

Engine events go to a ``Lifecycle`` (adaptive.py drives the real control plane with them; the others discard them).
"""

from __future__ import annotations

import itertools
from collections import deque

from sglang_prorsa.sim.config import ClusterConfig, ModelConfig, RolloutConfig
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.sim.instance import INF, Instance, Request
from sglang_prorsa.sim.lifecycle_sink import Lifecycle
from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.sim.trainer import Trainer, TrajectoryRun
from sglang_prorsa.srt.role_switch.capacity import InstanceStatus, Role


class Cluster:
    def __init__(self, cluster: ClusterConfig, model: ModelConfig, rollout: RolloutConfig, events: EventQueue,
                 trainer: Trainer, lifecycle: Lifecycle) -> None:
        self.config, self.perf, self.events = cluster, PerfModel(model), events
        self.trainer, self.lifecycle = trainer, lifecycle
        trainer.engines = self
        n, p = cluster.instances(model), cluster.initial_prefill(model)
        roles = [None] * n if cluster.mode == "colocated" else [Role.PREFILL] * p + [Role.DECODE] * (n - p)
        self.instances = [Instance(f"i{k}", self.perf, r, self._prefilled, self._decoded) for k, r in enumerate(roles)]
        self.by_id = {inst.iid: inst for inst in self.instances}
        self._rid = itertools.count()
        self._awaiting_kv: deque[Request] = deque()  # prefilled, no decode instance has room yet
        self._in_transfer: dict[Request, Instance] = {}  # request -> decode instance that reserved its KV
        self._untracked: set[Request] = set()  # re-prefills the lifecycle API cannot report (see adaptive.py)
        self.epoch = 0  # weight version as the engines see it
        self.switches: list[tuple[float, str, str]] = []  # (time, instance, new role)

    # ----- the trainer's side (trainer.Engines) -----
    def submit(self, run: TrajectoryRun, t: float) -> None:
        plan, turn = run.plan, run.turn
        x = run.prompt_tokens_at(turn)
        inst, rank, cached = self._route_prefill(run, x, turn)
        req = Request(next(self._rid), run, x, cached, plan.turns[turn].output_tokens)
        run.request = req
        self.lifecycle.request_arrived(run, x, inst.iid, t)
        self._add_prefill(inst, req, rank, t)

    def weight_update(self, t: float) -> None:
        self.epoch += 1
        for inst in self._active():
            inst.advance(t)
            waiting, decoding = inst.evict_all()
            for req in waiting:
                self._restart(req, 0, t)  # partial prefill was computed with the old weights
            for req in decoding:
                self._reprefill(req, t)
            self._plan(inst)
        for req in list(self._awaiting_kv) + list(self._in_transfer):
            self._reprefill(req, t)
        self._awaiting_kv.clear()
        self._in_transfer.clear()

    def abort(self, run: TrajectoryRun, t: float) -> None:
        req, run.request = run.request, None
        if req is None:
            return
        self._untracked.discard(req)
        self.lifecycle.prefill_cancelled(req)
        target = self._in_transfer.pop(req, None)
        if target is not None:
            target.release(req)
            return
        if req in self._awaiting_kv:
            self._awaiting_kv.remove(req)
        for inst in self.instances:
            inst.advance(t)
            if inst.remove(req):
                self._plan(inst)
                return

    # ----- routing -----
    def _active(self, role: Role | None = None) -> list[Instance]:
        return [i for i in self.instances if i.status is InstanceStatus.ACTIVE and (role is None or i.role is role)]

    def _route_prefill(self, run: TrajectoryRun, x: int, turn: int) -> tuple[Instance, int | None, int]:
        pool = self._active(None if self.config.mode == "colocated" else Role.PREFILL)
        if run.cache is not None:
            iid, rank, epoch = run.cache
            home = self.by_id[iid]
            if home in pool and epoch == (self.epoch, home.role_since):
                cached = x - run.plan.turns[turn - 1].tool_result_tokens
                return home, rank, max(0, cached)
        return min(pool, key=lambda i: (i.prefill_load() + i.kv_used(), i.iid)), None, 0

    def _add_prefill(self, inst: Instance, req: Request, rank: int | None, t: float) -> None:
        inst.advance(t)
        inst.add_prefill(req, rank)
        self.lifecycle.prefill_queued(inst.iid, req, t)
        self._plan(inst)

    def _restart(self, req: Request, done: int, t: float) -> None:
        """Send a cancelled request to another (or the same) instance, keeping ``done`` prefill tokens."""
        req.done = done
        pool = self._active(None if self.config.mode == "colocated" else Role.PREFILL)
        self._add_prefill(min(pool, key=lambda i: (i.prefill_load(), i.iid)), req, None, t)

    def _reprefill(self, req: Request, t: float) -> None:
        """New weights: prompt + generated so far is prefilled again (untracked), then decoding continues."""
        req.prompt, req.output, req.generated = req.context, req.output - req.generated, 0
        req.untracked = True
        self._untracked.add(req)
        self._restart(req, 0, t)

    def untracked_prefill_tokens(self) -> int:
        return sum(r.prompt - r.done for r in self._untracked)

    def awaiting_kv_tokens(self) -> int:
        """KV of prefilled requests that no decode instance has room for yet."""
        return sum(r.context for r in self._awaiting_kv)

    # ----- instance callbacks -----
    def _prefilled(self, inst: Instance, req: Request, t: float) -> None:
        run: TrajectoryRun = req.owner
        self.lifecycle.prefill_finished(inst.iid, req, t)
        self._untracked.discard(req)
        run.cache = (inst.iid, req.rank, (self.epoch, inst.role_since))
        if inst.role is None:
            return  # colocated: already running on the same rank
        self._awaiting_kv.append(req)
        self._place_decodes(t)

    def _place_decodes(self, t: float) -> None:
        while self._awaiting_kv:
            req = self._awaiting_kv[0]
            target = max(self._active(Role.DECODE), key=lambda i: (i.kv_free(), i.iid), default=None)
            if target is None or not target.add_decode(req):
                return
            self._awaiting_kv.popleft()
            self._in_transfer[req] = target
            self.events.at(t + self.perf.transfer_s(req.context), lambda t1, r=req, d=target: self._landed(d, r, t1))

    def _landed(self, inst: Instance, req: Request, t: float) -> None:
        if req not in self._in_transfer:
            return  # dropped or re-prefilled while in flight; its reservation went with the instance state
        del self._in_transfer[req]
        if inst.status is not InstanceStatus.ACTIVE or inst.role is not Role.DECODE:
            self._awaiting_kv.appendleft(req)  # the target started switching meanwhile
            self._place_decodes(t)
            return
        inst.advance(t)
        inst.start_decode(req)
        self._plan(inst)

    def _decoded(self, inst: Instance, req: Request, t: float) -> None:
        run: TrajectoryRun = req.owner
        run.request = None
        self.lifecycle.decode_finished(run, t)
        self.trainer.on_decoded(run, t)
        if inst.role is Role.DECODE:
            self.events.at(t, self._place_decodes)

    # ----- time -----
    def _plan(self, inst: Instance) -> None:
        end = inst.plan()
        if end < INF:
            version = inst.version
            self.events.at(end, lambda t, i=inst, v=version: self._wake(i, v, t))

    def _wake(self, inst: Instance, version: int, t: float) -> None:
        if version == inst.version:
            inst.advance(t)
            self._plan(inst)

    # ----- role switch (Appendix C) -----
    def start_switch(self, iid: str, role: Role, t: float) -> None:
        inst = self.by_id[iid]
        inst.advance(t)
        waiting, decoding = inst.evict_all()
        inst.status, inst.role = InstanceStatus.SWITCHING, role
        inst.version += 1  # its pending wake-up is stale
        self.lifecycle.instance_interrupted(iid)
        self.switches.append((t, iid, role.value))
        for req in waiting:
            self._restart(req, req.done, t)
        for req in decoding:
            req.rank = -1
            self._awaiting_kv.append(req)
        self._place_decodes(t)
        self.events.at(t + self.perf.switch_s, lambda t1: self._switched(inst, t1))

    def _switched(self, inst: Instance, t: float) -> None:
        inst.status, inst.role_since, inst.t = InstanceStatus.ACTIVE, t, t
        if inst.role is Role.DECODE:
            self._place_decodes(t)
