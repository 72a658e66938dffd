"""The engine instances behind the adaptive front: their roles, states and loads, and the routing pick."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_prorsa.srt.role_switch.capacity import InstanceReport, InstanceStatus, Role


@dataclass
class EngineInstance:
    instance_id: str
    url: str
    bootstrap_port: int
    role: Role
    status: InstanceStatus = InstanceStatus.ACTIVE
    gpus: int = 1
    role_since: float | None = None
    target_role: Role | None = None  # while draining/switching: the role it is switching to
    # Loads the front sees itself (requests it sent and has not had back).
    inflight_requests: int = 0
    inflight_prompt_tokens: int = 0
    # Last report from the instance (GET /prorsa/status).
    kv_footprint_tokens: int = 0
    kv_capacity_tokens: int = 0
    switches: int = 0
    rids: set[str] = field(default_factory=set)

    @property
    def routable(self) -> bool:
        return self.status is InstanceStatus.ACTIVE

    def report(self) -> InstanceReport:
        role = self.target_role or self.role
        decode = role is Role.DECODE
        return InstanceReport(
            instance_id=self.instance_id, role=role, status=self.status, gpus=self.gpus,
            inflight_prompt_tokens=0 if decode else self.inflight_prompt_tokens,
            decode_kv_used=self.kv_footprint_tokens if decode else 0,
            decode_kv_capacity=self.kv_capacity_tokens if decode else 0,
            role_since=self.role_since,
        )

    def describe(self) -> dict:
        return {
            "instance": self.instance_id, "url": self.url, "role": self.role.value, "status": self.status.value,
            "bootstrap_port": self.bootstrap_port, "inflight_requests": self.inflight_requests,
            "inflight_prompt_tokens": self.inflight_prompt_tokens, "kv_footprint_tokens": self.kv_footprint_tokens,
            "kv_capacity_tokens": self.kv_capacity_tokens, "switches": self.switches, "role_since": self.role_since,
        }


class NoInstance(RuntimeError):
    pass


class InstancePool:
    def __init__(self, instances: list[EngineInstance]) -> None:
        self.instances = {i.instance_id: i for i in instances}

    def __iter__(self):
        return iter(self.instances.values())

    def get(self, instance_id: str) -> EngineInstance:
        try:
            return self.instances[instance_id]
        except KeyError:
            raise KeyError(f"no instance {instance_id!r}; have {sorted(self.instances)}") from None

    def pick(self, role: Role, exclude: set[str] = frozenset()) -> EngineInstance:
        """Least-loaded routable instance of ``role``: prefill by prompt tokens in flight, decode by KV footprint
        plus requests in flight (the footprint report lags by one status poll)."""
        cands = [i for i in self if i.role is role and i.routable and i.instance_id not in exclude]
        if not cands:
            raise NoInstance(f"no routable {role.value} instance")
        if role is Role.PREFILL:
            return min(cands, key=lambda i: (i.inflight_prompt_tokens, i.inflight_requests, i.instance_id))
        return min(cands, key=lambda i: (i.inflight_requests, i.kv_footprint_tokens, i.instance_id))

    def set_role(self, instance: EngineInstance, role: Role, now: float | None = None) -> None:
        instance.role = role
        instance.target_role = None
        instance.role_since = time.time() if now is None else now
        instance.switches += 1

    def reports(self) -> list[InstanceReport]:
        return [i.report() for i in self]
