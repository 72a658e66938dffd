"""Carry out one role change on a busy instance (paper Appendix C), from the front's side.

1. take the instance out of the routing pool (DRAINING);
2. ``/prorsa/migrate_out``: its requests are cancelled with their tokens kept and their KV persisted; the records go
   to the router at once, which resumes them on other instances while this one rebuilds;
3. ``/prorsa/switch_role`` (SWITCHING): the instance sweeps stragglers, waits until quiet and rebuilds its
   role-specific structures through SGLang's own teardown/init, weights resident;
4. back in the pool under the new role.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sglang_prorsa.srt.entrypoints.instances import InstancePool
from sglang_prorsa.srt.entrypoints.pd_router import PDRouter
from sglang_prorsa.srt.role_switch.capacity import InstanceStatus, Role
from sglang_prorsa.srt.role_switch.messages import MigratedRequest

logger = logging.getLogger(__name__)


class SwitchRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SwitchExecutor:
    def __init__(self, pool: InstancePool, router: PDRouter) -> None:
        self.pool = pool
        self.router = router
        self._lock = asyncio.Lock()
        self.history: list[dict[str, Any]] = []

    def check(self, instance_id: str, new_role: Role) -> None:
        inst = self.pool.get(instance_id)
        if inst.status is not InstanceStatus.ACTIVE:
            raise SwitchRefused(409, f"instance {instance_id} is {inst.status.value}")
        if inst.role is new_role:
            raise SwitchRefused(409, f"instance {instance_id} is already {new_role.value}")
        others = [i for i in self.pool if i.role is inst.role and i.routable and i is not inst]
        if not others:
            raise SwitchRefused(409, f"instance {instance_id} is the last routable {inst.role.value} instance")

    async def switch(self, instance_id: str, new_role: Role) -> dict[str, Any]:
        async with self._lock:
            self.check(instance_id, new_role)
            inst = self.pool.get(instance_id)
            old_role = inst.role
            t0 = time.perf_counter()
            inst.status = InstanceStatus.DRAINING
            inst.target_role = new_role
            self.router.expect_migrations(inst)
            migrated: list[MigratedRequest] = []
            try:
                status, res = await self.router.post(inst.url + "/prorsa/migrate_out", {}, timeout_s=300)
                if status != 200:
                    raise SwitchRefused(502, f"migrate_out on {instance_id} failed: {res}")
                first = [MigratedRequest(**r) for r in res["requests"]]
                self.router.deliver(first)
                await self.router.release_partners(first, inst)
                migrated += first
                persist_s, persisted = res["persist_s"], res["persisted_bytes"]
                t_handed = time.perf_counter()
                inst.status = InstanceStatus.SWITCHING
                status, res = await self.router.post(inst.url + "/prorsa/switch_role", {"new_role": new_role.value},
                                                     timeout_s=300)
                late = [MigratedRequest(**r) for r in (res.get("requests") or [])]
                self.router.deliver(late)
                await self.router.release_partners(late, inst)
                migrated += late
                if status != 200:
                    raise SwitchRefused(502, f"switch_role on {instance_id} failed: {res}")
            except BaseException:
                self.router.settle(inst)
                inst.status, inst.target_role = InstanceStatus.UNHEALTHY, None
                logger.exception("switch of %s failed; instance marked unhealthy", instance_id)
                raise
            self.router.settle(inst)
            self.pool.set_role(inst, new_role)
            inst.status = InstanceStatus.ACTIVE
            timings = dict(res.get("timings") or {})
            timings["persist_s"] = timings.get("persist_s", 0.0) + persist_s
            timings["total_s"] = timings.get("total_s", 0.0) + persist_s  # the instance's own time, both calls
            timings["front_total_s"] = time.perf_counter() - t0
            timings["handoff_s"] = t_handed - t0  # until the cancelled requests were handed to the router
            out = {
                "instance": instance_id, "old_role": old_role.value, "new_role": new_role.value,
                "migrated": sum(1 for r in migrated if r.kv_tokens > 0),
                "restarted": sum(1 for r in migrated if r.kv_tokens == 0),
                "persisted_bytes": persisted + res.get("persisted_bytes", 0), "timings": timings,
            }
            self.history.append(out)
            logger.info("switched %s %s -> %s: %s", instance_id, old_role.value, new_role.value, out)
            return out
