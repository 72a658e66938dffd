"""Which record continues a request SGLang ended with an abort (called from ``hooks.wrap_stream_one_response``).

An abort reaches the tokenizer manager as a final output (no HTTP status: ours, a trainer's) or raised (a status:
a failed KV transfer, ...). It is continued elsewhere when a record says how:

- the scheduler took it off (our abort): the record it pushed first -- waited for, since the record and the abort
  travel on different sockets and are not ordered -- else one made from the tokens held here;
- SGLang failed its KV transfer (a decode half nobody took off, nothing delivered, not a trainer's abort): a record
  that restarts it from its prompt.

A continuation taken off here before it began goes back to its holder instead (``HandedBack``). Anything else --
a trainer's abort, a client's error -- is answered as SGLang answers it (``None``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable

from sglang_prorsa.srt.common.messages import (
    LOST_HEADER,
    MAX_DEATHS,
    RESUME_HEADER,
    Code,
    MigratedRequest,
    QueuedItem,
    Stage,
)
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.local import TokenizerManagerView
from sglang_prorsa.srt.engine.peer_client import PairHalves
from sglang_prorsa.srt.engine.stitch import continuation_spans

logger = logging.getLogger(__name__)

# How long a request our scheduler aborted waits for its record (see late_record).
RECORD_WAIT_S = 5.0
INSTANCE_LOST = "instance_lost"  # in a hand-back's message: the continuation's prefill instance died
# A prefill instance SGLang's heartbeat declared lost is checked this long for being dead (its port refusing
# connections): the process may take a moment to go; a live one that answered late keeps accepting them.
GONE_CHECK_S = 3.0


class HandedBack(ValueError):
    """A continuation's half moved before it started here: its holder (which knows the persisted KV) picks a new pair.
    A ValueError, so SGLang's route answers it as an error (an error event in a stream), which the holder retries."""


def is_final_abort(out: dict) -> bool:
    reason = (out.get("meta_info") or {}).get("finish_reason")
    return isinstance(reason, dict) and reason.get("type") == "abort"


def ours(out: dict) -> bool:
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    return reason.get("err_type") in (Code.MIGRATED.value, Code.HANDED_ON.value)


def is_abort_exception(e: BaseException, state: Any) -> bool:
    """SGLang's raise for a finished request whose abort carries an HTTP status (``_handle_abort_finish_reason``:
    ValueError for 400, HTTPException otherwise). Any other error -- a client disconnect (the request unfinished),
    a validation error -- is not an abort to continue from."""
    import fastapi

    return bool(state.finished) and isinstance(e, (fastapi.HTTPException, ValueError))


def lost_before(request: Any) -> int:
    """Instances that died serving this request before it came here (``LOST_HEADER``, set by the front's retry or
    the continuation that sent it)."""
    value = request.headers.get(LOST_HEADER) if request is not None else None
    try:
        return max(0, min(MAX_DEATHS, int(value))) if value is not None else 0
    except ValueError:
        return 0


def _hand_back_if_queued(counters: collections.Counter[str], request: Any,
                         record: MigratedRequest | None) -> MigratedRequest | None:
    """A continuation (sent by the instance holding its caller) that was taken off here before it began is not
    continued by this instance from its tokens: that would recompute a prefix its holder can load from the KV store.
    The record counts the instance deaths the request met before it came here; one that reached ``MAX_DEATHS`` is
    not handed back but answered here as a suspected poison request (``Continuation`` refuses to send it again), so
    its holder stops too."""
    if record is None:
        return None
    died_here = record.deaths > 0  # its prefill instance died while this half waited for the KV
    record.deaths += lost_before(request)
    resumed = request is not None and request.headers.get(RESUME_HEADER) is not None
    if record.stage is Stage.QUEUED and resumed and record.deaths < MAX_DEATHS:
        counters["continuations_handed_back"] += 1
        # The holder counts the death too (``INSTANCE_LOST`` in the message): its next attempt is its last.
        lost = f", {INSTANCE_LOST}" if died_here else ""
        logger.info("continuation %s handed back to its holder (instance deaths: %d here, %d before)", record.rid,
                    int(died_here), lost_before(request))
        raise HandedBack(f"prorsa: continuation {record.rid} handed back to its holder ({Code.HANDED_ON.value}"
                         f"{lost})")
    return record


class AbortRecords:
    """Finds the record that continues an aborted request: claimed from ``book`` (waited for when late), made from
    what the tokenizer manager holds (``tm``), or a restart from the prompt whose prefill half ``pairs`` releases.
    ``user_aborts`` reads how many trainer aborts this instance has seen (``control_guard.py``, ``middleware.py``)."""

    def __init__(self, book: RecordBook, counters: collections.Counter[str], tm: TokenizerManagerView,
                 pairs: PairHalves, user_aborts: Callable[[], int]) -> None:
        self.book = book
        self.counters = counters
        self.tm = tm
        self.pairs = pairs
        self.user_aborts = user_aborts

    async def record_for_output(self, obj: Any, state: Any, out: dict, request: Any, delivered_ids: int,
                                aborts_at_entry: int) -> MigratedRequest | None:
        """The record continuing a request whose final output ``out`` is an abort, or None to answer it."""
        record = self.book.claim(obj.rid)
        lost = _server_error(out) and self._lost_transfer(obj, delivered_ids, aborts_at_entry)
        if record is None and (ours(out) or lost):
            record = await self.late_record(obj.rid)
        if record is None and ours(out):
            if self.tm.role() == "prefill":  # its decode half holds the caller: the abort reads as handed on
                logger.error("prefill half %s was taken off without a record; answered as handed on", obj.rid)
            else:
                record = await self.record_from_state(obj, state, out)
        if record is None and lost:
            record = await self._restart_lost(obj)  # a stream gets SGLang's abort as an output
        return _hand_back_if_queued(self.counters, request, record)

    async def record_for_raise(self, obj: Any, request: Any, delivered_ids: int,
                               aborts_at_entry: int) -> MigratedRequest | None:
        """The record continuing a request SGLang's abort raised for (a non-streamed one with a status), or None."""
        record = self.book.claim(obj.rid)
        if record is None and self._lost_transfer(obj, delivered_ids, aborts_at_entry):
            record = await self.late_record(obj.rid) or await self._restart_lost(obj)
        return _hand_back_if_queued(self.counters, request, record)

    async def late_record(self, rid: str) -> MigratedRequest | None:
        """The record of a request our scheduler took off, waited for when its abort came first.

        The scheduler pushes the record before it aborts, but on its own socket: the abort reaches this process on
        SGLang's, and the two are not ordered. On a loaded machine records were seen 0.1 s behind their aborts;
        answering the abort meanwhile handed a caller a truncated output with status 200 (a CI run of the
        fast-switch test)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < RECORD_WAIT_S:
            await asyncio.sleep(0.005)
            record = self.book.claim(rid)
            if record is not None:
                self.counters["records_late"] += 1
                logger.info("the record of %s came %.3f s after its abort", rid, time.monotonic() - t0)
                return record
        return None

    async def record_from_state(self, obj: Any, state: Any, out: dict) -> MigratedRequest:
        """A request our scheduler took off whose record never came: continued from the tokens this tokenizer
        manager holds, its KV computed again (counted), rather than answered with what it had."""
        produced = list(state.output_ids or (out.get("output_ids") or []))
        self.counters["records_missing_continued"] += 1
        logger.error("request %s was taken off without a record; continuing it from its %d tokens (KV recomputed)",
                     obj.rid, len(produced))
        meta = out.get("meta_info") or {}
        return MigratedRequest(rid=obj.rid, role=self.tm.role(), stage=Stage.RUNNING if produced else Stage.QUEUED,
                               input_ids=await self.tm.prompt_ids(obj), output_ids=produced, sampling_params={},
                               bootstrap_room=obj.bootstrap_room,
                               bootstrap_host=obj.bootstrap_host,
                               bootstrap_port=obj.bootstrap_port,
                               weight_versions=continuation_spans(meta, len(produced)))

    async def queued_record(self, obj: Any) -> MigratedRequest:
        """A decode half that never received its KV, as a record to start again from its prompt."""
        return MigratedRequest(rid=obj.rid, role="decode", stage=Stage.QUEUED,
                               input_ids=await self.tm.prompt_ids(obj), output_ids=[], sampling_params={},
                               bootstrap_room=obj.bootstrap_room, bootstrap_host=obj.bootstrap_host,
                               bootstrap_port=obj.bootstrap_port)

    def _lost_transfer(self, obj: Any, delivered_ids: int, aborts_at_entry: int) -> bool:
        """A decode half whose KV transfer SGLang failed (its heartbeat declared the prefill instance lost -- on a
        loaded machine also a live one that answered late) before our watchdog or peer_lost took it off, not by a
        trainer's abort, with nothing delivered: it starts again elsewhere from its prompt."""
        return (not delivered_ids and self.user_aborts() == aborts_at_entry and self.tm.role() == "decode"
                and obj.bootstrap_room is not None)

    async def _restart_lost(self, obj: Any) -> MigratedRequest:
        """The record that restarts a decode half whose transfer was lost from its prompt (counted, with its prompt
        tokens: the prefill instance may have computed them already). Its prefill half is released, so a live
        prefill instance ends it and keeps its prompt in the prefix cache; the restart prefers that instance
        (``Continuation``), where it then recomputes little or nothing."""
        record = await self.queued_record(obj)
        if record.bootstrap_port is not None and await self.pairs.prefill_gone(
                record.bootstrap_host, record.bootstrap_port, GONE_CHECK_S):
            record.deaths = 1  # its prefill instance died (not one that answered late): counted against a poison one
        self.counters["transfers_failed_continued"] += 1
        self.counters["transfers_failed_prompt_tokens"] += len(record.input_ids)
        if record.bootstrap_room is not None:
            await self.pairs.release_prefill_halves([QueuedItem(obj.rid, record.bootstrap_room, record.bootstrap_host,
                                                                record.bootstrap_port)], only_not_started=False)
        return record


def _server_error(out: dict) -> bool:
    """SGLang's abort with a 5xx status (a failed KV transfer), not a client's or a trainer's abort."""
    status = ((out.get("meta_info") or {}).get("finish_reason") or {}).get("status_code")
    return isinstance(status, int) and status >= 500
