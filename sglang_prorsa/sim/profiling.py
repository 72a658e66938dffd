"""The real control plane's CPU inside a simulation, split by part (for bench_sim_breakdown.py and
bench_sim_scale.py): lifecycle ingest, forecast refresh, role-switch controller.

``install`` wraps the control plane's entry points in the process that runs the simulation (their child processes
call it first), so what is measured is the code a deployment runs, on the simulator's clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.role_switch.controller import RoleSwitchController

PARTS = ("ingest", "refresh", "controller")


@dataclass
class ControlPlaneTimer:
    """CPU seconds per part, and the lifecycle events ingested and refreshes made (under ``events_key``)."""

    events_key: str = "lifecycle_events"
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    counted: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.counted = {self.events_key: 0, "refreshes": 0}

    def install(self) -> ControlPlaneTimer:
        self._wrap(LifecycleControlPlane, "ingest", "ingest", self.events_key)
        self._wrap(LifecycleControlPlane, "tick", "refresh", "refreshes")
        self._wrap(LifecycleControlPlane, "forecast", "refresh")
        self._wrap(RoleSwitchController, "tick", "controller")
        self._wrap(RoleSwitchController, "observe", "controller")
        return self

    def _wrap(self, cls: type, name: str, part: str, count: str | None = None) -> None:
        inner = getattr(cls, name)

        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[part] += time.process_time() - start
                if count == self.events_key:
                    self.counted[count] += len(args[1])  # ingest(self, events)
                elif count:
                    self.counted[count] += 1

        setattr(cls, name, wrapper)

    def report(self) -> dict:
        return self.spent | self.counted
