"""One instance with data parallelism (SGLang's ``--dp-size``): several scheduler groups under one tokenizer manager,
each answering on its own channel (``ChannelAddresses.for_dp_rank``). What the engine side asks of "the scheduler"
goes to every DP rank and the answers are merged -- sums of counts and counters, concatenations of lists -- except a
prefix load, which goes to one rank (its resumed request is then routed there: ``LoadPrefixResult.dp_rank``).

A rank that fails is reported, never hidden: the call raises (``DPRankFailed``, or a ``TimeoutError`` when every
failure was a timeout) naming each failed rank, with what the others answered in ``answered``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Sequence

from sglang_prorsa.srt.common.messages import (
    BusyInterval,
    ChannelError,
    InventoryResult,
    MigrateOutResult,
    ReleaseResult,
    StatusResult,
)

MAX_MERGED_INTERVALS = 256  # as many as one scheduler keeps (counters.MAX_KEPT_INTERVALS)


class DPRankFailed(ChannelError):
    """Some DP ranks failed a message the others answered (``answered``: rank -> reply)."""

    def __init__(self, message: str, failures: dict[int, BaseException], answered: dict[int, Any]) -> None:
        super().__init__(message)
        self.failures = failures
        self.answered = answered


class DPRankTimeout(TimeoutError):
    """Some DP ranks did not answer in time (and none failed otherwise)."""

    def __init__(self, message: str, failures: dict[int, BaseException], answered: dict[int, Any]) -> None:
        super().__init__(message)
        self.failures = failures
        self.answered = answered


async def call_all(channels: Sequence[Any], message: Any, timeout_s: float) -> list[Any]:
    """``message`` to every DP rank at once; their replies in rank order, or the failure of those that failed."""
    return await call_each(channels, [message] * len(channels), timeout_s)


async def call_each(channels: Sequence[Any], messages: Sequence[Any], timeout_s: float) -> list[Any]:
    """``messages[r]`` to DP rank ``r``, all at once (see ``call_all``)."""
    results = await asyncio.gather(*(c.call(m, timeout_s=timeout_s) for c, m in zip(channels, messages)),
                                   return_exceptions=True)
    failures = {rank: r for rank, r in enumerate(results) if isinstance(r, BaseException)}
    if not failures:
        return results
    answered = {rank: r for rank, r in enumerate(results) if rank not in failures}
    text = (f"{type(messages[0]).__name__} failed on {len(failures)} of {len(channels)} DP ranks: "
            + "; ".join(f"dp rank {rank}: {type(e).__name__}: {e}" for rank, e in failures.items()))
    if all(isinstance(e, TimeoutError) for e in failures.values()):
        raise DPRankTimeout(text, failures, answered)
    raise DPRankFailed(text, failures, answered)


def merge_inventory(parts: Sequence[InventoryResult]) -> InventoryResult:
    return InventoryResult(role=parts[0].role, with_kv=[r for p in parts for r in p.with_kv],
                           queued=[q for p in parts for q in p.queued])


def merge_migrate_out(parts: Sequence[MigrateOutResult]) -> MigrateOutResult:
    """The ranks took their requests off at once: the sweep took as long as the slowest."""
    return MigrateOutResult(role=parts[0].role, rids=[r for p in parts for r in p.rids],
                            rooms=[r for p in parts for r in p.rooms], persist_s=max(p.persist_s for p in parts),
                            persisted_bytes=sum(p.persisted_bytes for p in parts),
                            persisted_blocks=sum(p.persisted_blocks for p in parts),
                            left_running=sum(p.left_running for p in parts))


def merge_release(parts: Sequence[ReleaseResult]) -> ReleaseResult:
    return ReleaseResult(rids=[r for p in parts for r in p.rids], rooms=[r for p in parts for r in p.rooms])


class StatusMerger:
    """The instance's status from its DP ranks' statuses. Each rank numbers its busy intervals on its own, so the
    intervals are renumbered here, in the order they were collected, into one sequence a reader pages through with
    ``since`` as it does with one scheduler; each rank is asked only for the intervals it has not handed over yet."""

    def __init__(self, dp_size: int) -> None:
        self.cursors = [-1] * dp_size  # per rank: the last interval seq collected
        self.log: deque[BusyInterval] = deque(maxlen=MAX_MERGED_INTERVALS)
        self.seq = 0

    def since(self, rank: int) -> int:
        return self.cursors[rank]

    def merge(self, parts: Sequence[StatusResult], since: int) -> StatusResult:
        for rank, part in enumerate(parts):
            for interval in sorted(part.busy_intervals, key=lambda i: i.seq):
                if interval.seq <= self.cursors[rank]:
                    continue
                self.cursors[rank] = interval.seq
                self.log.append(BusyInterval(seq=self.seq, role=interval.role, seconds=interval.seconds,
                                             new_tokens=interval.new_tokens, cached_tokens=interval.cached_tokens,
                                             requests=interval.requests))
                self.seq += 1
        counters: dict[str, float] = {}
        for part in parts:
            for name, value in part.counters.items():
                counters[name] = counters.get(name, 0.0) + value
        return StatusResult(
            role=parts[0].role, idle=all(p.idle for p in parts), running=sum(p.running for p in parts),
            queued=sum(p.queued for p in parts), counters=counters,
            kv_footprint_tokens=sum(p.kv_footprint_tokens for p in parts),
            kv_capacity_tokens=sum(p.kv_capacity_tokens for p in parts),
            prefix_cache_tokens=sum(p.prefix_cache_tokens for p in parts),
            busy_intervals=[i for i in self.log if i.seq > since])
