"""Where a turn's time goes in the engines, measured: prefill, the wait for a decode slot, decode.

For each request the cluster reports four moments: it joined a prefill queue, its prefill ended, a decode rank
pre-allocated its KV (``admitted``; a colocated rank decodes where it prefilled, so it has no such wait), and its
response was complete. A turn's three stage times are the spans between them:

    prefill_s   = prefill end - arrival        (the prefill queue and the prefill itself)
    slot_wait_s = admitted - prefill end        (waiting for a decode rank with a slot and KV for it)
    decode_s    = decode end - admitted         (KV transfer and generation)

These are the realised counterparts of the waits the planner's wait rule estimates (policy/role_switch/waits.py:
prefill's queued and in-flight tokens over n^P θ^P, decode's queue over its completion rate), so static runs at
adjacent splits show how each stage's time really moves with one instance more or less
(benchmarks/bench_stage_times.py). A request a weight update sent back through prefill (``reprefilled``) has no
clean split between the stages; it is counted apart and left out of the stage means. A prefill's end is its
iteration's end, which the simulator may compute ahead of the event it is handling, so a single span can dip below
zero by a fraction of an iteration; means over many turns are what it is for.

Recording is off unless a clock is handed to ``runner.simulate``: the cluster calls it only when it has one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class TurnTimes:
    arrived_at: float
    prefill_s: float
    slot_wait_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.slot_wait_s + self.decode_s


class StageClock:
    """The moments of each request in flight, and the finished turns' stage times (module docstring)."""

    def __init__(self) -> None:
        self._arrived: dict[object, float] = {}
        self._prefilled: dict[object, float] = {}
        self._admitted: dict[object, float] = {}
        self._reprefilled: set[object] = set()
        self.turns: list[TurnTimes] = []
        self.reprefilled_turns = 0

    def arrived(self, req: object, t: float) -> None:
        self._arrived[req] = t

    def prefilled(self, req: object, t: float) -> None:
        self._prefilled.setdefault(req, t)  # a re-prefill's end is not the turn's prefill end

    def admitted(self, req: object, t: float) -> None:
        self._admitted[req] = t

    def reprefilled(self, req: object) -> None:
        self._reprefilled.add(req)

    def dropped(self, req: object) -> None:
        """The request will not finish (its trajectory was aborted)."""
        for moments in (self._arrived, self._prefilled, self._admitted):
            moments.pop(req, None)
        self._reprefilled.discard(req)

    def decoded(self, req: object, t: float) -> None:
        arrived, prefilled = self._arrived.pop(req, None), self._prefilled.pop(req, None)
        admitted = self._admitted.pop(req, prefilled)  # colocated: decoding starts where prefill ends
        if req in self._reprefilled:
            self._reprefilled.discard(req)
            self.reprefilled_turns += 1
            return
        if arrived is None or prefilled is None or admitted is None:
            return  # arrived before the clock was attached
        self.turns.append(TurnTimes(arrived, prefilled - arrived, admitted - prefilled, t - admitted))

    def means(self, since: float = 0.0) -> dict:
        """Mean stage times of the turns that arrived at or after ``since`` (the end of a warm-up)."""
        turns = [x for x in self.turns if x.arrived_at >= since]
        if not turns:
            return {"turns": 0}
        return {"turns": len(turns), "prefill_s": statistics.fmean(x.prefill_s for x in turns),
                "slot_wait_s": statistics.fmean(x.slot_wait_s for x in turns),
                "decode_s": statistics.fmean(x.decode_s for x in turns),
                "total_s": statistics.fmean(x.total_s for x in turns)}
