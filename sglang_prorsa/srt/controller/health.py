"""Instance failure (issue 14): notice it, keep its requests alive, bring it back.

- *Notice*: an instance this front started is watched by PID; any instance that misses ``MISSED_CHECKS_UNHEALTHY``
  status polls in a row becomes UNHEALTHY (not routable) and recovers by answering again.
- *Keep its requests alive*: when a prefill instance is lost, every decode instance takes off the halves still
  waiting for its KV and continues them elsewhere (``POST /prorsa/peer_lost``); the requests a lost decode instance
  held died with their connections, and the relay or router that sent them retries them.
- *Bring it back*: an instance started here is restarted with the same spec; when it answers it rejoins the pools
  with a new epoch (decode instances then forget its old transfer endpoints).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sglang_prorsa.srt.controller.http import Http
from sglang_prorsa.srt.controller.orchestrator import Orchestrator
from sglang_prorsa.srt.controller.registry import Instance, Registry, State

logger = logging.getLogger(__name__)

WATCH_EVERY_S = 0.5
RESTART_READY_TIMEOUT_S = 900.0


class Health:
    def __init__(self, registry: Registry, orchestrator: Orchestrator, http: Http, processes: dict[str, Any],
                 specs: dict[str, Any], log_dir: Any = None) -> None:
        self.registry = registry
        self.orchestrator = orchestrator
        self.http = http
        self.processes = processes  # instance id -> ServerProcess (instances this front started)
        self.specs = specs
        self.log_dir = log_dir
        self.restarts = 0
        self.lost_total = 0
        self._restarting: set[str] = set()

    async def watch_forever(self) -> None:
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            for iid, proc in list(self.processes.items()):
                inst = self.registry.instances.get(iid)
                if inst is not None and not proc.alive() and iid not in self._restarting:
                    logger.error("instance %s (pid %d) exited with %s", iid, proc.pid, proc.proc.returncode)
                    await self.lost(inst)

    async def lost(self, inst: Instance) -> None:
        """``inst`` is gone: out of every pool, its pending requests continued elsewhere, restarted if ours."""
        if inst.state is State.DEAD:
            return
        was = inst.role
        self.lost_total += 1
        self.registry.set_state(inst, State.DEAD)
        await self.orchestrator.push_peers()
        if self.orchestrator.router is not None:
            try:
                await self.orchestrator.router.remove(inst.url)
            except Exception as e:  # the router drops dead workers by its own health checks too
                logger.warning("router did not drop %s: %s", inst.instance_id, e)
        if was == "prefill":
            await self.notify_decodes(inst)
        if inst.instance_id in self.processes:
            asyncio.get_running_loop().create_task(self.restart(inst))

    async def notify_decodes(self, inst: Instance) -> None:
        targets = [i for i in self.registry if i.role == "decode" and i.state not in (State.DEAD, State.STARTING)]
        body = {"bootstrap_host": inst.bootstrap_host, "bootstrap_port": inst.bootstrap_port}
        results = await asyncio.gather(*(self.http.post(i.url + "/prorsa/peer_lost", body) for i in targets),
                                       return_exceptions=True)
        for i, r in zip(targets, results):
            if isinstance(r, BaseException) or r[0] != 200:
                logger.warning("peer_lost not delivered to %s: %s", i.instance_id, r)

    async def restart(self, inst: Instance) -> None:
        from sglang_prorsa.srt.utils import processes

        iid = inst.instance_id
        self._restarting.add(iid)
        try:
            old = self.processes[iid]
            old.stop(grace_s=1.0)
            proc = processes.start(old.argv[3:], name=f"instance-{iid}-restart{self.restarts + 1}", port=old.port,
                                   log_dir=old.log_path.parent, module=old.argv[2], die_with_parent=True)
            self.processes[iid] = proc
            inst.pid = proc.pid
            self.restarts += 1
            t0 = time.monotonic()
            await asyncio.to_thread(proc.wait_ready, RESTART_READY_TIMEOUT_S)
            logger.info("instance %s restarted in %.1f s", iid, time.monotonic() - t0)
            spec = self.specs.get(iid)
            inst.role = spec.role if spec is not None else inst.role  # a fresh process serves its start role
            inst.epoch += 1
            inst.missed_checks = 0
            self.registry.set_state(inst, State.ACTIVE)
            await self.orchestrator.push_peers()
            if self.orchestrator.router is not None and inst.role in ("prefill", "decode"):
                await self.orchestrator.router.add(inst.url, inst.role, inst.bootstrap_port)
        except Exception:
            logger.exception("restart of instance %s failed; it stays out of the pools", iid)
        finally:
            self._restarting.discard(iid)
