"""Orphaned decode halves (issue 14: nothing waits on a timeout for something that already happened).

A decode half waits for its prefill half's KV. Every protocol here releases both halves together, but a release can
be lost (a peer unreachable for a moment, a race nobody foresaw), and SGLang would then hold the decode half until
its transfer timeout (300 s by default) and fail it. So a decode instance asks, every few seconds, the prefill
instance of each half queued longer than ``STALE_S`` whether it still holds that room (its tokenizer manager still
has the request); a half whose prefill side let go -- on two checks in a row, since a transfer that just completed
also lets go -- is taken off here and continued elsewhere from its prompt. A prefill instance that does not answer is
treated as lost (``PeerLost``). Prefill halves whose decode half nobody holds are answered as handed on likewise.

A pair can also wait on itself: the decode half has sent its KV indices and waits for the KV, while the prefill half
still waits in its scheduler's bootstrap queue for that very handshake (seen once in a full rollout: 300 s, no switch
involved, cause not traced). The prefill instance reports such a half as ``stuck`` -- only when its scheduler has
nothing else to do (no other request computing, transferring or waiting for compute, so it is not a backlog or a
shortage of transfer slots) and it has waited ``STALE_S`` -- and the decode instance, on two checks in a row,
releases the pair as a switch would: the prefill half is answered as handed on, the decode half continued elsewhere.

This loop stands aside while the instance switches roles; the switch runs the same check itself, sooner
(``switch.ORPHAN_STALE_S``), because its quiesce waits on exactly these halves: a 5,000-request soak saw one orphaned
decode half hold a switch -- and every switch after it -- for SGLang's 300 s transfer timeout.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Callable

from sglang_prorsa.srt.common.messages import InventoryResult
from sglang_prorsa.srt.engine.local import LocalScheduler
from sglang_prorsa.srt.engine.peer_client import PairHalves

logger = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0
STALE_S = 20.0


def held_rooms(tokenizer_manager: Any, rooms: set[int]) -> list[int]:
    """The rooms this instance still holds: requests its tokenizer manager has not finished (any stage)."""
    held = set()
    for state in list(tokenizer_manager.rid_to_state.values()):
        room = getattr(state.obj, "bootstrap_room", None)  # getattr: an EmbeddingReqInput has no bootstrap_room
        if isinstance(room, int) and room in rooms:
            held.add(room)
    return sorted(held)


def stuck_rooms(inv: InventoryResult, rooms: set[int], stale_s: float = STALE_S) -> list[int]:
    """A prefill scheduler's halves of ``rooms`` still bootstrapping after ``stale_s`` while it has nothing else to
    do. Anything else on it (computing, transferring, waiting for compute) may be what holds them: none reported."""
    if inv.role != "prefill" or inv.with_kv or any(q.stage != "bootstrapping" for q in inv.queued):
        return []
    return sorted(q.bootstrap_room for q in inv.queued if q.bootstrap_room in rooms and q.waited_s > stale_s)


class OrphanWatch:
    """The checks above, on this instance: asks peers through ``pairs``, takes halves off through ``scheduler``;
    remembers the rooms found unheld at the last check (a suspect is taken only on its second check in a row)."""

    def __init__(self, scheduler: LocalScheduler, pairs: PairHalves, counters: collections.Counter[str]) -> None:
        self.scheduler = scheduler
        self.pairs = pairs
        self.counters = counters
        self.suspects: set[int] = set()  # rooms the last check found unheld

    async def watch_forever(self, role: Callable[[], str], switching: Callable[[], bool]) -> None:
        """Every ``CHECK_EVERY_S`` while this instance serves a PD role and is not switching (a switch checks
        itself, sooner)."""
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            if role() not in ("prefill", "decode") or switching():
                continue
            try:
                await self.check_once()
            except Exception:  # a missed check is retried; serving goes on
                logger.exception("orphan check failed")

    async def check_once(self, stale_s: float = STALE_S) -> list[int]:
        """One check of the halves queued longer than ``stale_s``; returns the rooms taken off here."""
        inv = await self.scheduler.inventory()
        stale = [q for q in inv.queued if q.waited_s > stale_s and q.bootstrap_room is not None]
        if not stale:
            self.suspects = set()
            return []
        if inv.role == "prefill":
            return await self._prefill_orphans(stale)
        return await self._decode_orphans(stale)

    def _confirmed(self, unheld: list) -> list:
        """Those also unheld at the previous check (a room let go just now may be a transfer that just completed)."""
        rooms = {q.bootstrap_room for q in unheld}
        confirmed = [q for q in unheld if q.bootstrap_room in self.suspects]
        self.suspects = rooms
        return confirmed

    async def _prefill_orphans(self, stale: list) -> list[int]:
        """Prefill halves not started after ``STALE_S`` whose decode half no instance holds: answered as handed on."""
        held = await self.pairs.held_by_decodes([q.bootstrap_room for q in stale])
        if held is None:
            return []  # a decode instance did not answer: it may hold them; ask again next time
        gone = self._confirmed([q for q in stale if q.bootstrap_room not in held])
        if not gone:
            return []
        self.scheduler.book_queued(gone, "prefill")
        _, taken = await self.scheduler.release([q.bootstrap_room for q in gone], only_not_started=True)
        self.counters["orphans_handed_on"] += len(taken)
        if taken:
            logger.warning("%d prefill halves waited %.0f+ s for a decode half nobody holds: answered as handed on",
                           len(taken), STALE_S)
        return taken

    async def _decode_orphans(self, stale: list) -> list[int]:
        orphaned: list[int] = []
        unheld: list = []
        stuck: list = []
        by_peer: dict[str, tuple[Any, list]] = {}
        for q in stale:
            peer = self.pairs.prefill_of(q)
            if peer is None:
                continue
            by_peer.setdefault(peer.instance_id, (peer, []))[1].append(q)
        for peer, items in by_peer.values():
            answer = await self.pairs.held_by_prefill(peer, [q.bootstrap_room for q in items])
            if answer is None:
                dead = await self.pairs.prefill_gone(peer.bootstrap_host, peer.bootstrap_port)
                logger.warning("prefill %s does not answer for %d waiting halves (%s): continued elsewhere",
                               peer.instance_id, len(items), "dead" if dead else "alive, slow")
                await self.scheduler.peer_lost(peer.bootstrap_host, peer.bootstrap_port, dead)
                continue
            held, stuck_there = set(answer.get("held", [])), set(answer.get("stuck", []))
            unheld += [q for q in items if q.bootstrap_room not in held]
            stuck += [q for q in items if q.bootstrap_room in stuck_there and q.stage == "transfer"]
        confirmed = {q.bootstrap_room for q in self._confirmed(unheld + stuck)}
        orphaned += await self._release_stuck_pairs([q for q in stuck if q.bootstrap_room in confirmed])
        gone = [q for q in unheld if q.bootstrap_room in confirmed]
        if gone:
            self.scheduler.book_queued(gone, "decode")
            _, taken = await self.scheduler.release([q.bootstrap_room for q in gone])
            self.counters["orphans_continued"] += len(taken)
            if taken:
                logger.warning("%d decode halves waited %.0f+ s for KV their prefill instance no longer holds: "
                               "continued elsewhere", len(taken), STALE_S)
            orphaned += taken
        return orphaned

    async def _release_stuck_pairs(self, pairs: list) -> list[int]:
        """Both halves released, in the order a decode switch uses (``SwitchJob.sweep``): records booked here, the
        prefill half taken off there unless its prefill began meanwhile, then this half taken off and continued."""
        if not pairs:
            return []
        self.scheduler.book_queued(pairs, "decode")
        released = await self.pairs.release_prefill_halves(pairs, only_not_started=True)
        rooms = [room for rs in released.values() for room in rs]
        if not rooms:
            return []
        _, taken = await self.scheduler.release(rooms)
        self.counters["stuck_pairs_continued"] += len(taken)
        logger.warning("%d decode halves waited %.0f+ s for KV while their prefill halves waited for the handshake "
                       "(rooms %s): both released, continued elsewhere", len(taken), STALE_S, taken)
        return taken
