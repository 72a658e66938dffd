"""The simulator's time line: a heap of (time, sequence, action). Ties run in scheduling order, so runs are
deterministic for a given seed."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heappop, heappush

Action = Callable[[float], None]


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Action]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.processed = 0
        self.stopped = False

    def __len__(self) -> int:
        """Actions pending."""
        return len(self._heap)

    def stop(self) -> None:
        """End ``run`` after the current event."""
        self.stopped = True

    def at(self, t: float, action: Action) -> None:
        """Run ``action(t)`` at ``t`` (never before the current time)."""
        if t < self.now:
            t = self.now
        heappush(self._heap, (t, next(self._seq), action))

    def run(self, until: float) -> None:
        """Process events in time order until ``stop()`` is called, the queue empties or the time passes ``until``."""
        heap = self._heap
        while heap and not self.stopped:
            if heap[0][0] > until:  # leave it queued: a later run() continues from here
                self.now = until
                return
            t, _, action = heappop(heap)
            self.now = t
            action(t)
            self.processed += 1
