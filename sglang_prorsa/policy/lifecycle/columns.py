"""Per-slot numeric columns of the live trajectories, for a vectorised forecast refresh (issue 10, item 5).

Each live trajectory owns one slot (a row); a finished one frees it for reuse, so the columns are bounded by the peak
number of live trajectories, not by the history. Columns are ``array.array`` (fast per-item writes from the event
path, ~40 ns) and are read as zero-copy numpy views (``view``) by the refresh. A column never resizes in place: it
grows by copying into a new array, so a numpy view that is still alive can never make a write fail.

String-valued attributes (task, tool, instance) become small integers through ``Interner``s with a hard cap, so a
trainer that sends a new tool name with every event cannot grow any table without bound.
"""

from __future__ import annotations

from array import array

import numpy as np

FREE = -1  # state code of an unused slot


class Interner:
    """name -> small int, at most ``cap`` names; later names share the id ``cap`` ("other")."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, name: str | None) -> int:
        if name is None:
            return -1
        i = self._ids.get(name)
        if i is None:
            if len(self.names) >= self.cap:
                return self.cap
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i

    def __len__(self) -> int:
        return len(self.names) + 1  # the overflow id included

    def get(self, name: str) -> int | None:
        return self._ids.get(name)


class SlotColumns:
    """Numeric columns indexed by slot. ``state`` is ``FREE`` on unused slots."""

    # entered: when the trajectory entered its state; prompt / next_prompt: -1 unknown; the phase starts below let a
    # later state still count as running in an earlier phase (e.g. tool_done is still in tool -> next request)
    FLOATS = ("entered", "prompt", "next_prompt", "launched", "sandbox", "decoded", "tool_start")
    INTS = ("state", "task", "tool", "turn", "group", "instance", "mode")

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = 0
        self.entered = array("d")
        self.prompt = array("d")  # -1: unknown
        self.next_prompt = array("d")  # -1: no trainer estimate
        self.launched = array("d")  # sampled (-1: not seen)
        self.sandbox = array("d")  # sandbox_start
        self.decoded = array("d")  # the last decode_end, while its turn continues
        self.tool_start = array("d")
        self.state = array("b")
        self.task = array("i")
        self.tool = array("i")
        self.turn = array("i")
        self.group = array("i")
        self.instance = array("i")
        self.mode = array("b")
        self._free: list[int] = []
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        for name in self.FLOATS:
            col = array("d", getattr(self, name))  # a copy: a live numpy view of the old array stays valid
            col.extend([-1.0] * extra)
            setattr(self, name, col)
        for name in self.INTS:
            old = getattr(self, name)
            col = array(old.typecode, old)
            col.extend([FREE] * extra)
            setattr(self, name, col)
        self._free.extend(range(capacity - 1, self.capacity - 1, -1))  # pop() hands out low slots first
        self.capacity = capacity

    def allocate(self) -> int:
        """A slot with every column reset (floats -1, ids -1)."""
        if not self._free:
            self._grow(self.capacity * 2)
        slot = self._free.pop()
        self.prompt[slot] = self.next_prompt[slot] = self.launched[slot] = -1.0
        self.sandbox[slot] = self.decoded[slot] = self.tool_start[slot] = -1.0
        self.tool[slot] = self.instance[slot] = self.mode[slot] = self.group[slot] = FREE
        self.turn[slot] = 0
        return slot  # state, entered and task are written by the tracker at once

    def release(self, slot: int) -> None:
        self.state[slot] = FREE
        self.group[slot] = -1
        self._free.append(slot)

    @property
    def used(self) -> int:
        return self.capacity - len(self._free)

    def view(self, name: str) -> np.ndarray:
        """A zero-copy numpy view of column ``name`` (valid until the column next grows; read it, don't keep it)."""
        col = getattr(self, name)
        dtype = {"d": np.float64, "b": np.int8, "i": np.int32}[col.typecode]
        return np.frombuffer(col, dtype=dtype)

    def nbytes(self) -> int:
        return sum(getattr(self, n).itemsize * self.capacity for n in self.FLOATS + self.INTS)
