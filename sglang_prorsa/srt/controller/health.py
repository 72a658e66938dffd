"""Instance failure (issue 14): notice it, keep its requests alive, bring it back.

- *Notice*: an instance this front started is watched by PID; any instance that misses ``MISSED_CHECKS_UNHEALTHY``
  status polls in a row becomes UNHEALTHY (not routable) and recovers by answering again.
- *Keep its requests alive*: when a prefill instance is lost, every decode instance takes off the halves still
  waiting for its KV and continues them elsewhere (``POST /prorsa/peer_lost``); the requests a lost decode instance
  held died with their connections, and the relay or router that sent them retries them.
- *Bring it back*: an instance started here is restarted with the same spec (tried again after a pause if a restart
  fails, ``RESTART_ATTEMPTS`` in all); when it answers it rejoins the pools with a new epoch (decode instances then
  forget its old transfer endpoints).
- *Stop with the front* (issue 29): once the front is told to stop (``stop``) no restart starts, and one still
  loading ends its process instead of keeping the front's shutdown waiting for it; every process a restart started
  is kept in ``started``, so the front's last act can end them all.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.http import Http
from sglang_prorsa.srt.controller.orchestrator import Orchestrator

logger = logging.getLogger(__name__)

WATCH_EVERY_S = 0.5
RESTART_READY_TIMEOUT_S = 900.0
RESTART_ATTEMPTS = 3
RESTART_PAUSE_S = 5.0  # before the second attempt; twice that before the third


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
        self.started: list[Any] = []  # every process a restart started, ended or not
        self.stopping = threading.Event()  # set once: the front is stopping
        self._restart_tasks: set[asyncio.Task] = set()

    def stop(self) -> None:
        """The front is stopping: no restart starts from now on, and one waiting for its process to load ends that
        process (its waiting thread wakes at once). Safe from any thread and from a signal handler."""
        self.stopping.set()

    async def restarts_ended(self, timeout_s: float = 10.0) -> None:
        """Wait, at most ``timeout_s``, for the restarts in flight to end (after ``stop``: to end their processes)."""
        if self._restart_tasks:
            await asyncio.wait(list(self._restart_tasks), timeout=timeout_s)

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
        if inst.instance_id in self.processes and not self.stopping.is_set():
            task = asyncio.get_running_loop().create_task(self.restart_until_back(inst))
            self._restart_tasks.add(task)
            task.add_done_callback(self._restart_tasks.discard)

    async def notify_decodes(self, inst: Instance, dead: bool = True) -> None:
        """Decode instances continue elsewhere what waits for ``inst``'s KV. Only a ``dead`` one counts as a death
        against those requests (a poison request's count): an instance that missed its checks may just be slow."""
        targets = [i for i in self.registry if i.role == "decode" and i.state not in (State.DEAD, State.STARTING)]
        body = {"bootstrap_host": inst.bootstrap_host, "bootstrap_port": inst.bootstrap_port, "dead": dead}
        results = await asyncio.gather(*(self.http.post(i.url + "/prorsa/peer_lost", body) for i in targets),
                                       return_exceptions=True)
        for i, r in zip(targets, results):
            if isinstance(r, BaseException) or r[0] != 200:
                logger.warning("peer_lost not delivered to %s: %s", i.instance_id, r)

    async def catch_up_weights(self, inst: Instance) -> None:
        """A restarted instance loads its start checkpoint: give it the weights its peers serve now (issue 13; a
        checkpoint on disk and its version -- weights pushed as tensors cannot be replayed, see the README)."""
        peers = [i for i in self.registry if i.state is State.ACTIVE and i is not inst]
        if not peers:
            return
        s1, theirs = await self.http.get(peers[0].url + "/model_info")
        s2, mine = await self.http.get(inst.url + "/model_info")
        if s1 != 200 or s2 != 200:
            return
        keys = ("model_path", "weight_version")
        if all(theirs.get(k) == mine.get(k) for k in keys):
            return
        status, answer = await self.http.post(inst.url + "/update_weights_from_disk", {
            "model_path": theirs["model_path"], "weight_version": theirs.get("weight_version")}, timeout_s=1800)
        logger.info("restarted instance %s caught up to %s (%s): %s", inst.instance_id, theirs.get("model_path"),
                    theirs.get("weight_version"), status)

    async def restart_until_back(self, inst: Instance) -> bool:
        """``restart``, tried again after a pause when it fails (its process died while loading, its port was taken,
        it did not load in time), up to ``RESTART_ATTEMPTS`` in all: one failed restart used to leave the instance
        out of every pool for good. Whether it is back."""
        for attempt in range(RESTART_ATTEMPTS):
            if attempt:
                logger.warning("restarting instance %s again in %.0f s (attempt %d of %d)", inst.instance_id,
                               RESTART_PAUSE_S * attempt, attempt + 1, RESTART_ATTEMPTS)
                if await asyncio.to_thread(self.stopping.wait, RESTART_PAUSE_S * attempt):
                    return False
            if await self.restart(inst):
                return True
            if self.stopping.is_set():
                return False
        logger.error("instance %s did not come back after %d restarts; it stays out of the pools", inst.instance_id,
                     RESTART_ATTEMPTS)
        return False

    async def restart(self, inst: Instance) -> bool:
        """One restart of ``inst`` with its spec; whether it is back in the pools."""
        from sglang_prorsa.srt.utils import processes

        iid = inst.instance_id
        self._restarting.add(iid)
        try:
            old = self.processes[iid]
            old.stop(grace_s=1.0)
            spec = self.specs.get(iid)
            if spec is not None and spec.role != inst.role and {spec.role, inst.role} <= {"prefill", "decode"}:
                # Come back in the role the controller last gave it (the pools and the forecast's plan assume it),
                # not the role it first started in.
                spec = self.specs[iid] = spec.with_role(inst.role)
                spec.dump(Path(old.argv[old.argv.index("--spec") + 1]))
            if self.stopping.is_set():  # told to stop while the old process was ending: start nothing
                logger.info("instance %s not restarted: the front is stopping", iid)
                return False
            proc = processes.start(old.argv[3:], name=f"instance-{iid}-restart{self.restarts + 1}", port=old.port,
                                   log_dir=old.log_path.parent, module=old.argv[2], die_with_parent=True,
                                   env=old.env)  # the address it advertises, as at its first start
            self.started.append(proc)
            self.processes[iid] = proc
            inst.pid = proc.pid
            self.restarts += 1
            t0 = time.monotonic()
            try:
                await asyncio.to_thread(proc.wait_ready, RESTART_READY_TIMEOUT_S, stop=self.stopping)
            except processes.Stopped:
                logger.warning("front stopping: ending instance %s while it restarts (pid %d)", iid, proc.pid)
                await asyncio.to_thread(proc.stop, 1.0)
                return False
            logger.info("instance %s restarted in %.1f s", iid, time.monotonic() - t0)
            inst.role = spec.role if spec is not None else inst.role  # a fresh process serves its spec's role
            await self.catch_up_weights(inst)
            inst.epoch += 1
            inst.missed_checks = 0
            self.registry.set_state(inst, State.ACTIVE)
            await self.orchestrator.push_peers()
            if self.orchestrator.router is not None and inst.role in ("prefill", "decode"):
                await self.orchestrator.router.add_eventually(inst.url, inst.role, inst.bootstrap_port)
            return True
        except Exception:
            logger.exception("restart of instance %s failed", iid)
            return False
        finally:
            self._restarting.discard(iid)
