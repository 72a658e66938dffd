"""The controller's registry of engine instances: the one owner of who serves which role, in which state.

Instances enter it two ways: started by a front (``launcher.py``), or registered by URL
(``launch_server --prorsa-controller URL`` on any machine, ``POST /prorsa/register``; a trainer's ``POST /workers``,
``controller/workers.py``), and one URL is one entry whichever way it came. Every change of role or state
bumps ``version``; the controller pushes the list to all instances (``POST /prorsa/peers``, once per change they must
see: ``Orchestrator.push_peers``), which continue resumed requests on the peers they know.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

from sglang_prorsa.policy.role_switch.capacity import InstanceReport, InstanceStatus, Role


class State(str, enum.Enum):
    STARTING = "starting"  # registered or started, not yet answering
    ACTIVE = "active"  # serving its role and in the routing pools
    DRAINING = "draining"  # out of the pools, its requests being taken off (Appendix C)
    SWITCHING = "switching"  # rebuilding its role
    UNHEALTHY = "unhealthy"  # failed liveness checks or a rebuild; not routable
    DEAD = "dead"  # its process is gone (a front restarts the instances it started)


_AS_REPORT_STATUS = {State.ACTIVE: InstanceStatus.ACTIVE, State.DRAINING: InstanceStatus.DRAINING,
                     State.SWITCHING: InstanceStatus.SWITCHING}


@dataclass
class Instance:
    instance_id: str
    url: str
    role: str  # prefill | decode | null (colocated)
    bootstrap_host: str = "127.0.0.1"
    bootstrap_port: int | None = None
    state: State = State.STARTING
    started_here: bool = False  # a front started (and may restart) it
    controller_url: str | None = None  # where it sends request events, told by the peer push (POST /workers only)
    gpus: int = 1  # GPUs it occupies (Eq. 1's G counts them): its own report (take_gpus); 1 until it reports, on CPU
    role_since: float | None = None
    target_role: str | None = None  # while draining/switching
    switches: int = 0
    epoch: int = 0  # bumped whenever its transfer endpoints change (a role rebuild, a restart)
    # Loads: what the front has in flight there, and the instance's own last report.
    inflight: int = 0
    inflight_prompt_tokens: int = 0
    running: int = 0
    queued: int = 0
    kv_footprint_tokens: int = 0
    kv_capacity_tokens: int = 0
    prefix_cache_tokens: int = 0
    last_seen: float = 0.0
    missed_checks: int = 0
    busy_seq: int = -1  # the last busy interval read from it (θ)
    last_switch_s: float | None = None
    pid: int | None = None  # the process, for an instance this front started
    reported_switches: int | None = None  # the switches it says it has completed (its registration heartbeat)
    adopted_switch: bool = False  # it registered mid-switch (one a previous controller began): SWITCHING until done

    def take_gpus(self, reported: Any) -> bool:
        """Take the GPU count the instance reports (``gpus`` of its ``GET /prorsa/status`` or its registration:
        tp × pp × dp of its own SGLang arguments, 1 on CPU); anything but a positive integer leaves the count as it
        was. Whether it changed."""
        if isinstance(reported, bool) or not isinstance(reported, int) or reported < 1 or reported == self.gpus:
            return False
        self.gpus = reported
        return True

    @property
    def routable(self) -> bool:
        return self.state is State.ACTIVE

    def peer_json(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "url": self.url, "role": self.role, "status": self.state.value,
                "bootstrap_host": self.bootstrap_host, "bootstrap_port": self.bootstrap_port, "epoch": self.epoch}

    def describe(self) -> dict[str, Any]:
        return {
            "instance": self.instance_id, "url": self.url, "role": self.role, "status": self.state.value,
            "bootstrap_host": self.bootstrap_host, "bootstrap_port": self.bootstrap_port,
            "started_here": self.started_here, "inflight_requests": self.inflight,
            "inflight_prompt_tokens": self.inflight_prompt_tokens, "running": self.running, "queued": self.queued,
            "kv_footprint_tokens": self.kv_footprint_tokens, "kv_capacity_tokens": self.kv_capacity_tokens,
            "prefix_cache_tokens": self.prefix_cache_tokens, "switches": self.switches, "role_since": self.role_since,
            "target_role": self.target_role, "last_switch_s": self.last_switch_s, "epoch": self.epoch,
            "pid": self.pid, "gpus": self.gpus,
        }

    def report(self) -> InstanceReport | None:
        """This instance as the allocation sees it (None: not counted, e.g. dead or colocated)."""
        status = _AS_REPORT_STATUS.get(self.state)
        role = self.target_role or self.role
        if status is None or role not in ("prefill", "decode"):
            return None
        decode = role == "decode"
        return InstanceReport(
            instance_id=self.instance_id, role=Role(role), status=status, gpus=self.gpus,
            inflight_prompt_tokens=0 if decode else self.inflight_prompt_tokens,
            decode_kv_used=self.kv_footprint_tokens if decode else 0,
            decode_kv_capacity=self.kv_capacity_tokens if decode else 0, role_since=self.role_since,
            running_requests=self.running, queued_requests=self.queued, prefix_cache_tokens=self.prefix_cache_tokens,
            # a prefill instance's radix cache lives in its KV pool (the controller's C^D_KV fallback reads it)
            prefix_cache_capacity=0 if decode else self.kv_capacity_tokens)


class UnknownInstance(KeyError):
    pass


class Registry:
    def __init__(self) -> None:
        self.instances: dict[str, Instance] = {}
        self.version = 0

    def __iter__(self):
        return iter(list(self.instances.values()))

    def __len__(self) -> int:
        return len(self.instances)

    def get(self, instance_id: str) -> Instance:
        try:
            return self.instances[instance_id]
        except KeyError:
            raise UnknownInstance(instance_id) from None

    def add(self, inst: Instance) -> Instance:
        self.instances[inst.instance_id] = inst
        self.bump()
        return inst

    def register(self, instance_id: str, url: str, role: str, bootstrap_host: str,
                 bootstrap_port: int | None, gpus: Any = None, switching: bool = False,
                 switches: int | None = None) -> tuple[Instance, bool]:
        """An instance announces itself (again): (its entry, whether it is new). A known instance -- by id, or by URL
        under another id (one engine posted to ``POST /workers`` that also registers itself) -- keeps the state the
        controller tracks; its liveness (and the GPU count it reports, ``gpus``) is refreshed, and a role it took
        without this controller is adopted (``_adopt``). One URL is never two entries.

        ``switching`` / ``switches``: whether a switch of its own is running now, and how many it has completed. A
        controller restarted while it switched an instance learns the instance mid-switch (SWITCHING, out of every
        pool) or after (in the role it switched to): the roles as they are, not as the last controller meant them."""
        known = self.instances.get(instance_id) or self.by_url(url)
        if known is not None:
            known.last_seen = time.time()
            known.take_gpus(gpus)
            if known.state in (State.DEAD, State.UNHEALTHY) and known.url == url.rstrip("/"):
                # Back after a restart: its transfer endpoints are new (decode instances re-learn them).
                known.state, known.role, known.epoch = State.ACTIVE, role, known.epoch + 1
                known.missed_checks = 0
                self.bump()
            else:
                self._adopt(known, role, switching, switches)
            if switches is not None:
                known.reported_switches = max(switches, known.reported_switches or 0)
            return known, False
        inst = Instance(instance_id=instance_id, url=url.rstrip("/"), role=role, bootstrap_host=bootstrap_host,
                        bootstrap_port=bootstrap_port, state=State.SWITCHING if switching else State.ACTIVE,
                        last_seen=time.time(), reported_switches=switches, adopted_switch=switching)
        inst.take_gpus(gpus)
        return self.add(inst), True

    def _adopt(self, inst: Instance, role: str, switching: bool, switches: int | None) -> None:
        """A switch this controller did not run: one it adopted mid-way is over (``switching`` false: ACTIVE in the
        role reported), or an active instance reports another role after completing more switches than it last
        said (a report older than a switch of ours, arriving after it, has no more and changes nothing)."""
        if inst.adopted_switch:
            if not switching:
                inst.adopted_switch = False
                self._took_role(inst, role)
            return
        newer = switches is not None and inst.reported_switches is not None and switches > inst.reported_switches
        if inst.state is State.ACTIVE and not switching and role != inst.role and newer:
            self._took_role(inst, role)

    def _took_role(self, inst: Instance, role: str) -> None:
        inst.role, inst.state, inst.target_role = role, State.ACTIVE, None
        inst.epoch += 1  # rebuilt: its transfer endpoints are new
        inst.role_since = time.time()
        self.bump()

    def by_url(self, url: str) -> Instance | None:
        url = url.rstrip("/")
        return next((i for i in self.instances.values() if i.url == url), None)

    def remove(self, instance_id: str) -> Instance:
        inst = self.get(instance_id)
        del self.instances[instance_id]
        self.bump()
        return inst

    def set_state(self, inst: Instance, state: State, target_role: str | None = None) -> None:
        inst.state, inst.target_role = state, target_role
        self.bump()

    def set_role(self, inst: Instance, role: str) -> None:
        inst.role, inst.target_role, inst.state = role, None, State.ACTIVE
        inst.role_since = time.time()
        inst.switches += 1
        self.bump()

    def bump(self) -> None:
        self.version += 1

    def routable(self, role: str) -> list[Instance]:
        return [i for i in self.instances.values() if i.role == role and i.routable]

    def peers_payload(self, back_in: Instance | None = None) -> dict[str, Any]:
        """The peer list every instance is pushed; ``back_in`` is listed active already (a switch about to put it
        back, ``Orchestrator.switch``)."""
        listed = [{**i.peer_json(), "status": State.ACTIVE.value} if i is back_in else i.peer_json()
                  for i in self.instances.values()]
        return {"version": self.version, "instances": listed}

    def reports(self) -> list[InstanceReport]:
        return [r for r in (i.report() for i in self.instances.values()) if r is not None]
