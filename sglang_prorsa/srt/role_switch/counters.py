"""Per-instance counters kept in the scheduler process, reported as JSON and as Prometheus text.

Busy intervals feed θ^P (paper §4.2): an interval runs from the first step with work on an idle instance until the
instance is idle again; prompt tokens computed are the tokens the model actually ran in extend (prefill) passes, so
tokens loaded from the store or matched in the prefix cache are not in it.
"""

from __future__ import annotations

import time
from collections import defaultdict


class InstanceCounters:
    def __init__(self) -> None:
        self._c: dict[str, float] = defaultdict(float)
        self._busy_since: float | None = None

    def add(self, name: str, value: float = 1) -> None:
        self._c[name] += value

    def observe_busy(self, busy: bool, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            self._c["busy_intervals"] += 1
            self._c["busy_seconds"] += now - self._busy_since
            self._busy_since = None

    def snapshot(self) -> dict[str, float]:
        out = dict(self._c)
        if self._busy_since is not None:
            out["busy_seconds_open_interval"] = time.monotonic() - self._busy_since
        return out


def prometheus_text(instance: str, role: str, counters: dict[str, float], gauges: dict[str, float]) -> str:
    """Prometheus exposition format, one sample per line, labelled by instance and role."""
    lines = []
    labels = f'instance="{instance}",role="{role}"'
    for name, value in sorted(counters.items()):
        metric = f"prorsa_{name}_total" if not name.endswith("_open_interval") else f"prorsa_{name}"
        lines.append(f"# TYPE {metric} {'counter' if metric.endswith('_total') else 'gauge'}")
        lines.append(f"{metric}{{{labels}}} {value}")
    for name, value in sorted(gauges.items()):
        lines.append(f"# TYPE prorsa_{name} gauge")
        lines.append(f"prorsa_{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"
