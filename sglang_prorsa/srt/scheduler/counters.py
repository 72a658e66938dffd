"""Per-instance counters kept in the scheduler process, reported as JSON and as Prometheus text.

Busy intervals feed θ (paper §4.2): an interval runs from the first step with work on an idle instance until the
instance is idle again, or, beyond the paper, for about ``theta.MAX_SAMPLE_S`` of a longer busy period (slices); ``new_tokens`` are the prompt tokens the model actually ran in extend (prefill) passes, so
tokens loaded from the store or matched in the prefix cache are not in them (they are in ``cached_tokens``).

Beyond the paper, two counters account for prompt work a busy switch could waste (issue 14's "none duplicated"):
``prompt_tokens_discarded`` (prompt tokens computed here for a request then taken off before its KV left), and
``resume_prompt_tokens_computed`` (tokens computed for resumed requests: one page each when their KV loaded whole).

``kv_layout_refused`` counts prefix loads refused because the source's parallel KV layout (model, dtype, heads per
rank, tensor-parallel size...) is not this instance's: those prefixes are recomputed, not loaded as bytes of the
wrong shape. It is reported from the start (as 0), so a dashboard can tell "none" from "not reported".
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict, deque
from typing import Any, Iterable

from sglang_prorsa.policy.role_switch.theta import MAX_SAMPLE_S
from sglang_prorsa.srt.common.messages import BusyInterval

MAX_KEPT_INTERVALS = 256  # the most recent completed intervals, numbered; a reader asks for those after its last
MAX_TRACKED_REQUESTS = 16384  # per-request prompt work, newest kept: bounded whatever the traffic
ALWAYS_REPORTED = ("kv_layout_refused",)  # in every snapshot, 0 until counted


class InstanceCounters:
    def __init__(self) -> None:
        self._c: dict[str, float] = defaultdict(float)
        for name in ALWAYS_REPORTED:
            self._c[name] = 0.0
        self._busy_since: float | None = None
        self._new = self._cached = self._requests = 0
        self._seen: OrderedDict[str, None] = OrderedDict()  # rids counted in this busy period (bounded)
        self._done: deque[BusyInterval] = deque(maxlen=MAX_KEPT_INTERVALS)
        self._seq = 0
        self._computed: OrderedDict[str, int] = OrderedDict()  # rid -> prompt tokens computed here so far
        self._resumes: OrderedDict[str, None] = OrderedDict()  # rids whose prefix was loaded here for a resume

    def add(self, name: str, value: float = 1) -> None:
        self._c[name] += value

    def observe_extend(self, new_tokens: int, reqs: Iterable[Any], lens: Iterable[int] = ()) -> None:
        """One extend (prefill) pass: ``new_tokens`` computed (``lens``: per request); each request counts once per
        interval."""
        self._c["prompt_tokens_computed"] += new_tokens
        self._new += new_tokens
        reqs = list(reqs)
        for req, n in zip(reqs, lens):
            self._count_for(req.rid, int(n))
        for req in reqs:
            if req.rid not in self._seen:
                self._seen[req.rid] = None
                if len(self._seen) > MAX_TRACKED_REQUESTS:  # a busy period's slices can go on for hours
                    self._seen.popitem(last=False)
                self._cached += int(req.cached_tokens)
                self._requests += 1

    def _count_for(self, rid: str, n: int) -> None:
        self._computed[rid] = self._computed.pop(rid, 0) + n
        if len(self._computed) > MAX_TRACKED_REQUESTS:
            self._computed.popitem(last=False)
        if rid in self._resumes:
            self._c["resume_prompt_tokens_computed"] += n

    def expect_resume(self, rid: str) -> None:
        """A prefix was loaded here for ``rid``: what its prefill still computes is counted apart."""
        self._resumes[rid] = None
        self._resumes.move_to_end(rid)
        if len(self._resumes) > MAX_TRACKED_REQUESTS:
            self._resumes.popitem(last=False)

    def discard(self, rid: str) -> int:
        """``rid`` was taken off here before its KV left: the prompt tokens computed for it are wasted."""
        n = self._computed.pop(rid, 0)
        self._resumes.pop(rid, None)
        self._c["prompt_tokens_discarded"] += n
        return n

    def observe_busy(self, busy: bool, role: str, now: float | None = None) -> None:
        """Called at every poll. An idle instance that gets work opens an interval; idle again, it closes it. A busy
        period longer than ``MAX_SAMPLE_S`` is closed in slices at the first poll past that long after a request was
        seen, the next slice starting there (theta.py says why); a request spanning two slices counts in the first."""
        now = time.monotonic() if now is None else now
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            self._close(role, now)
            self._busy_since = None
            self._seen.clear()
        elif busy and self._busy_since is not None and self._requests and now - self._busy_since >= MAX_SAMPLE_S:
            self._close(role, now)
            self._busy_since = now

    def _close(self, role: str, now: float) -> None:
        seconds = now - self._busy_since if self._busy_since is not None else 0.0
        self._c["busy_intervals"] += 1
        self._c["busy_seconds"] += seconds
        self._done.append(BusyInterval(seq=self._seq, role=role, seconds=seconds, new_tokens=self._new,
                                       cached_tokens=self._cached, requests=self._requests))
        self._seq += 1
        self._new = self._cached = self._requests = 0

    def intervals_since(self, seq: int) -> list[BusyInterval]:
        return [i for i in self._done if i.seq > seq]

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
