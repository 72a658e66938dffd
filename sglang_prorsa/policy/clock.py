"""Injectable clocks: the control plane never reads wall time directly.

The server passes ``WallClock()``; tests and the cluster simulator pass a ``ManualClock`` they advance themselves,
so the same tracker, predictor and allocator code runs in all three.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds (unix epoch for the wall clock; arbitrary origin for simulated clocks)."""


class WallClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to (tests, trace replay, simulation)."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError(f"cannot move a clock backwards (dt={dt})")
        self._t += dt
        return self._t

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"cannot move a clock backwards ({t} < {self._t})")
        self._t = float(t)


class TraceClock:
    """A clock that follows a replayed trace (``python -m sglang_prorsa.control_plane --clock trace``): it stands at
    the latest time the replay has shown -- an event's ``ts``, a forecast's ``at`` -- and never moves back, so an
    hour of trace replays over HTTP in seconds and every window closes at its scheduled end."""

    def __init__(self) -> None:
        self._t = 0.0
        self.started = False  # the trace's first time is not known until it shows one

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> bool:
        """Move to ``t`` if it is later (or the first time shown; a finite time); whether it moved."""
        if (t > self._t or not self.started) and abs(t) < float("inf"):
            self._t, self.started = float(t), True
            return True
        return False

    def reset(self) -> None:
        self._t, self.started = 0.0, False
