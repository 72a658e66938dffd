"""Carry out one role change of a (busy) instance from the controller's side (paper Appendix C).

1. *out of every pool*: DRAINING in the registry, pushed to every instance (no resume picks it) and to the front;
   removed from the external router's pool, waiting until the router confirms;
2. the instance's own switch (``POST /prorsa/switch_role``, ``srt/engine/switch.py``): its requests are taken off
   and continued elsewhere by the instance itself, then it rebuilds its role (SWITCHING);
3. *back into the pools* under the new role: pushed to every instance first (each decode instance forgets the old
   transfer endpoints before it can pick the new ones), then routable here and in the external router.

So one switch pushes the peer list twice, once per change every instance must see (out, back). An instance is sent
the list only when it differs from the last one it accepted (``push_peers``).

Switches run one at a time; a control operation (weight update, pause, memory release; issue 13) holds them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from sglang_prorsa.srt.common.messages import Code
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.http import Http
from sglang_prorsa.srt.controller.router_pools import RouterPoolError, RouterPools

logger = logging.getLogger(__name__)

HISTORY = 1000
SWITCH_TIMEOUT_S = 600.0


class SwitchRefused(Exception):
    def __init__(self, status: int, code: Code, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class _Declined(SwitchRefused):
    """The instance refused the switch (409) and is back in the pools unchanged."""


class Orchestrator:
    def __init__(self, registry: Registry, http: Http, router: RouterPools | None = None) -> None:
        self.registry = registry
        self.http = http
        self.router = router
        self.lock = asyncio.Lock()  # one switch at a time; control operations take it too (issue 13)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.held_by: str | None = None  # the control operation holding switches, if any
        self._delivered: dict[str, list[dict[str, Any]]] = {}  # instance id -> the peer list it last accepted
        self.peer_pushes = 0  # POST /prorsa/peers sent, all instances together

    def check(self, instance_id: str, new_role: str) -> None:
        inst = self.registry.get(instance_id)
        if self.held_by is not None:
            raise SwitchRefused(409, Code.CONTROL_OPERATION, f"switches are held during {self.held_by}")
        if inst.state is not State.ACTIVE:
            raise SwitchRefused(409, Code.NOT_ACTIVE, f"instance {instance_id} is {inst.state.value}")
        if inst.role == new_role:
            raise SwitchRefused(409, Code.ALREADY_IN_ROLE, f"instance {instance_id} is already {new_role}")
        if inst.role not in ("prefill", "decode"):
            raise SwitchRefused(409, Code.INVALID, f"instance {instance_id} is not a PD instance")
        if not [i for i in self.registry.routable(inst.role) if i is not inst]:
            raise SwitchRefused(409, Code.LAST_OF_ROLE,
                                f"instance {instance_id} is the last routable {inst.role} instance")

    async def switch(self, instance_id: str, new_role: str) -> dict[str, Any]:
        async with self.lock:
            self.check(instance_id, new_role)
            inst = self.registry.get(instance_id)
            await self._refuse_if_held(inst)
            old_role = inst.role
            t0 = time.perf_counter()
            self.registry.set_state(inst, State.DRAINING, target_role=new_role)
            await self.push_peers()
            try:
                if self.router is not None:
                    await self.router.remove(inst.url)
                t_out = time.perf_counter()
                self.registry.set_state(inst, State.SWITCHING, target_role=new_role)
                status, body = await self.http.post(inst.url + "/prorsa/switch_role", {"new_role": new_role},
                                                    timeout_s=SWITCH_TIMEOUT_S)
                if status == 409:  # the instance refused before touching anything: it serves on, as it was
                    await self._restore(inst, old_role)
                    code = body.get("code") if isinstance(body, dict) else None
                    raise _Declined(409, Code(code) if code in Code._value2member_map_ else Code.UPSTREAM,
                                    f"instance {instance_id} declined: {body.get('error') if isinstance(body, dict) else body}")
                if status != 200:
                    raise SwitchRefused(502, Code.UPSTREAM, f"switch_role on {instance_id} failed ({status}): {body}")
                # Its transfer endpoints are new: every instance learns it back under its new role and epoch (a
                # decode instance forgets the old endpoints before it lets a continuation pick it), and only then is
                # it routable here. One push: the list it sends is the registry's once set_role has run.
                inst.role, inst.epoch = new_role, inst.epoch + 1
                await self.push_peers(back_in=inst)
                self.registry.set_role(inst, new_role)
                await self.push_peers()  # only to an instance that did not accept the list just pushed
                t_back = time.perf_counter()
                if self.router is not None:
                    await self.router.add_eventually(inst.url, new_role, inst.bootstrap_port)
            except _Declined:
                raise
            except (SwitchRefused, RouterPoolError, OSError, asyncio.TimeoutError) as e:
                self.registry.set_state(inst, State.UNHEALTHY)
                await self.push_peers()
                logger.error("switch of %s failed; instance marked unhealthy: %s", instance_id, e)
                if isinstance(e, SwitchRefused):
                    raise
                raise SwitchRefused(502, Code.UPSTREAM, f"switch of {instance_id} failed: {e}") from e
            timings = dict(body.get("timings") or {})
            timings.update(controller_total_s=time.perf_counter() - t0, pools_out_s=t_out - t0,
                           pools_in_s=time.perf_counter() - t_back)
            inst.last_switch_s = timings["controller_total_s"]
            out = {"instance": instance_id, "old_role": old_role, "new_role": new_role, "time": time.time(),
                   "taken": body.get("taken", 0), "sweeps": body.get("sweeps", 0),
                   "released_elsewhere": body.get("released_elsewhere", {}),
                   "persisted_bytes": body.get("persisted_bytes", 0), "timings": timings}
            self.history.append(out)
            logger.info("switched %s %s -> %s in %.2f s (%d requests taken off)", instance_id, old_role, new_role,
                        timings["controller_total_s"], out["taken"])
            return out

    async def _refuse_if_held(self, inst) -> None:
        """A trainer that paused or released an instance directly (as slime and AReaL do) holds its switches: refuse
        before taking it out of any pool. (The instance checks again itself; this only spares the pools a round trip
        that sglang-router's health check could not complete while the instance is paused.)"""
        try:
            status, st = await self.http.get(inst.url + "/prorsa/status", timeout_s=10)
        except (OSError, asyncio.TimeoutError):
            return  # the switch itself will find out
        held = st.get("held_by") if status == 200 and isinstance(st, dict) else None
        if held:
            raise SwitchRefused(409, Code.CONTROL_OPERATION,
                                f"instance {inst.instance_id} holds switches: {', '.join(held)}")

    async def _restore(self, inst, role: str) -> None:
        self.registry.set_state(inst, State.ACTIVE)
        await self.push_peers()
        if self.router is not None:
            await self.router.add_eventually(inst.url, role, inst.bootstrap_port)

    async def sync_router(self) -> None:
        """At start-up: the external router's pools hold exactly our active PD instances, each in its role's pool."""
        if self.router is None:
            return
        for inst in self.registry:
            if inst.state is State.ACTIVE and inst.role in ("prefill", "decode"):
                await self.router.place(inst.url, inst.role, inst.bootstrap_port)  # maybe listed from an earlier run

    def forget(self, instance_id: str) -> None:
        """``instance_id`` left the registry: a later instance under that id is sent the peer list afresh."""
        self._delivered.pop(instance_id, None)

    async def push_peers(self, back_in: Instance | None = None) -> None:
        """Every instance learns the registry (where resumed requests may go) before anything else happens.

        An instance is sent the list only when it differs from the last one it accepted: once per change, and again
        at the next call to one that did not accept it. ``back_in``: an instance shown active already (it is about to
        be, ``switch``), so the instances know it before the front routes to it."""
        payload = self.registry.peers_payload(back_in=back_in)
        listed = payload["instances"]
        targets = [i for i in self.registry if i.state not in (State.DEAD, State.STARTING)
                   and self._delivered.get(i.instance_id) != listed]
        self.peer_pushes += len(targets)
        # An instance registered by a trainer (POST /workers) learns here where its request events go.
        bodies = [{**payload, "controller": i.controller_url} if i.controller_url else payload for i in targets]
        results = await asyncio.gather(*(self.http.post(i.url + "/prorsa/peers", body, timeout_s=10)
                                         for i, body in zip(targets, bodies)), return_exceptions=True)
        for inst, r in zip(targets, results):
            if isinstance(r, BaseException) or r[0] != 200:
                self._delivered.pop(inst.instance_id, None)
                logger.warning("peer list not delivered to %s: %s", inst.instance_id, r)
            else:
                self._delivered[inst.instance_id] = listed
