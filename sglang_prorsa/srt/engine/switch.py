"""``SwitchJob``: this instance's side of one busy role switch (paper Appendix C), and the one owner of its state.

The controller has already taken the instance out of every routing pool. Then, until the scheduler is quiet:

1. *inventory*: which requests have their KV here, which are queued (with their PD rooms);
2. *release the other halves* of the queued ones: on a decode instance, their prefill halves (they answer as handed
   on instead of transferring); on a prefill instance, their decode halves (each decode instance takes its half off
   and its holder continues the request elsewhere);
3. *migrate out*: the scheduler pushes a record for each request it takes off and aborts it; on this instance the
   tokenizer manager continues each decode request on another pair from its persisted KV (``hooks.py``,
   ``continuation.py``), and answers each prefill half as handed on;
4. when quiet (scheduler idle, nothing on its way in), *rebuild* the role through SGLang's own teardown/init
   (weights stay resident).

Requests arriving meanwhile are handed on at arrival (``Resumer.hand_on_at_arrival``). The job works through the
collaborators it is given: this instance's scheduler, the other halves of its PD pairs, its admission, the orphan
check, and SGLang's tokenizer manager (the rebuild).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sglang_prorsa.srt.engine.local import Admission, LocalScheduler, TokenizerManagerView
from sglang_prorsa.srt.engine.peer_client import PairHalves
from sglang_prorsa.srt.engine.watchdog import OrphanWatch

logger = logging.getLogger(__name__)

QUIET_POLL_S = 0.02
SWEEP_EVERY_S = 0.5  # a straggler that reached the scheduler after the last sweep is taken off within this
# Requests the front or a router dispatched before the instance left the pools may still be on the wire: quiet must
# hold this long before the rebuild, so they arrive while the sweep can still take them (a decode half arriving
# during the rebuild would cost its prefill half's work).
ARRIVAL_GRACE_S = 0.3
# A queued half whose other half let go (an orphan) would hold the quiesce until SGLang's transfer timeout (300 s):
# while sweeping, the watchdog's check runs on halves queued this long, every ORPHAN_CHECK_EVERY_S; an orphan is
# taken off on its second check in a row (a transfer that completed just now also lets go of its room).
ORPHAN_STALE_S = 3.0
ORPHAN_CHECK_EVERY_S = 1.5


class SwitchFailed(RuntimeError):
    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class SwitchJob:
    def __init__(self, new_role: str, timeout_s: float, cpu: bool, *, old_role: str, scheduler: LocalScheduler,
                 pairs: PairHalves, admission: Admission, orphans: OrphanWatch,
                 tm: TokenizerManagerView | None = None) -> None:
        self.scheduler = scheduler
        self.pairs = pairs
        self.admission = admission
        self.orphan_watch = orphans
        self.tm = tm
        self.new_role = new_role
        self.old_role = old_role
        self.timeout_s = timeout_s
        self.cpu = cpu
        self.taken: list[str] = []  # rids taken off here (continued elsewhere, or handed on)
        self.released: dict[str, list[int]] = {}  # peer id -> rooms whose other half was released there
        self.sweeps = 0
        self.orphans: list[int] = []  # rooms of orphaned halves taken off during the switch
        self.persisted_bytes = 0
        self.timings: dict[str, float] = {}

    async def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.admission.admitting = False
        try:
            persist_s = await self._sweep_until_quiet(t0)
            t_quiet = time.perf_counter()
            await self._rebuild()
            t_done = time.perf_counter()
        finally:
            self.admission.admitting = True
        self.timings = {"quiesce_s": t_quiet - t0 - persist_s, "persist_s": persist_s,
                        "rebuild_s": t_done - t_quiet, "total_s": t_done - t0}
        return self.report()

    def report(self) -> dict[str, Any]:
        return {"old_role": self.old_role, "new_role": self.new_role, "taken": len(self.taken),
                "sweeps": self.sweeps, "released_elsewhere": {k: len(v) for k, v in self.released.items()},
                "orphans_taken": len(self.orphans), "persisted_bytes": self.persisted_bytes, "timings": self.timings}

    async def _sweep_until_quiet(self, t0: float) -> float:
        persist_s = 0.0
        next_orphan_check = t0 + ORPHAN_CHECK_EVERY_S
        while True:
            persist_s += await self.sweep()
            if time.perf_counter() >= next_orphan_check:
                next_orphan_check = time.perf_counter() + ORPHAN_CHECK_EVERY_S
                await self._take_orphans()
            deadline = time.perf_counter() + SWEEP_EVERY_S
            while time.perf_counter() < deadline:
                if await self._quiet():
                    await asyncio.sleep(ARRIVAL_GRACE_S)
                    if await self._quiet():
                        return persist_s
                    break  # something arrived meanwhile: sweep again
                await asyncio.sleep(QUIET_POLL_S)
            if time.perf_counter() - t0 > self.timeout_s:
                raise SwitchFailed(f"instance did not quiesce within {self.timeout_s} s", status=503)

    async def sweep(self) -> float:
        """One pass of steps 1-3; returns the scheduler's persist time.

        The prefill side of each pair decides which queued requests move (only it knows whether their prefill
        began), so none is prefilled twice; both sides book a record before either half can fail."""
        self.sweeps += 1
        inv = await self.scheduler.inventory()
        self.scheduler.book_queued(inv.queued, inv.role)
        rooms = [q.bootstrap_room for q in inv.queued if q.bootstrap_room is not None]
        reason = f"switch to {self.new_role}"
        if inv.role == "decode":
            released = await self.pairs.release_prefill_halves(inv.queued)  # taken there only if not begun there
            taken_there = {room for rs in released.values() for room in rs}
            move = frozenset(q.rid for q in inv.queued if q.bootstrap_room in taken_there)
            if not move and not inv.with_kv:
                return 0.0
            res = await self.scheduler.migrate_out(move, reason)
        else:
            if not rooms:
                return 0.0
            await self.pairs.expect_decode_halves(rooms)
            res = await self.scheduler.migrate_out(frozenset(q.rid for q in inv.queued), reason)
            released = await self.pairs.release_decode_halves(res.rooms)
        for peer, rs in released.items():
            self.released.setdefault(peer, []).extend(rs)
        logger.info("switch sweep %d (%s): %d with KV, %d queued (rooms %s); released elsewhere %s; taken off %d %s",
                    self.sweeps, inv.role, len(inv.with_kv), len(inv.queued), rooms, released, len(res.rids),
                    res.rooms)
        self.taken += res.rids
        self.persisted_bytes += res.persisted_bytes
        return res.persist_s

    async def _take_orphans(self) -> None:
        try:
            taken = await self.orphan_watch.check_once(stale_s=ORPHAN_STALE_S)
        except Exception:  # a missed check is made again at the next one; the switch goes on
            logger.exception("orphan check during the switch failed")
            return
        if taken:
            logger.warning("switch: %d orphaned halves taken off (rooms %s)", len(taken), taken)
            self.orphans += taken

    async def _quiet(self) -> bool:
        st = await self.scheduler.status()
        return st.idle and self.admission.entering == 0

    async def _rebuild(self) -> None:
        self.admission.set_rebuilding(True)
        try:
            out = await self.tm.rebuild_role(self.new_role, self.cpu)
        finally:
            self.admission.set_rebuilding(False)
        if not out.success:
            raise SwitchFailed(f"SGLang refused the role rebuild: {out.message}",
                               status=409 if out.safe_to_restore else 502)
