"""Records of the requests the scheduler took off this instance, by rid, until their resume claims them.

The scheduler pushes a record *before* it aborts the request (``srt/common/channel.py``), usually here or waiting in the
channel by the time the abort reaches the tokenizer manager; ``claim`` drains the channel before it answers, and a
record still on its way is waited for by the caller (``aborts.late_record``).
Unclaimed records (a request whose caller went away) expire, so the book stays bounded.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Callable

from sglang_prorsa.srt.common.messages import MigratedRequest

RECORD_TTL_S = 600.0
MAX_RECORDS = 100_000
RECENT = 4096


class RecordBook:
    def __init__(self, drain: Callable[[], object] = lambda: None, clock: Callable[[], float] = time.monotonic):
        self._drain = drain
        self._clock = clock
        self._records: OrderedDict[str, tuple[float, MigratedRequest]] = OrderedDict()
        self.recent: deque[MigratedRequest] = deque(maxlen=RECENT)  # for reports (claimed or not)
        self.put_total = 0
        self.claimed_total = 0
        self.expired_total = 0

    def put(self, record: MigratedRequest) -> None:
        old = self._records.get(record.rid)
        if old is not None:  # taken off twice before its abort was processed: an instance death stays counted
            record.deaths = max(record.deaths, old[1].deaths)
        self._records[record.rid] = (self._clock(), record)
        self.recent.append(record)
        self._records.move_to_end(record.rid)
        self.put_total += 1
        self._expire()

    def claim(self, rid: str) -> MigratedRequest | None:
        entry = self._records.pop(rid, None)
        if entry is None:
            self._drain()  # records pushed before the abort but not yet read
            entry = self._records.pop(rid, None)
        if entry is None:
            return None
        self.claimed_total += 1
        return entry[1]

    def peek(self, rid: str) -> MigratedRequest | None:
        entry = self._records.get(rid)
        return entry[1] if entry else None

    def __len__(self) -> int:
        return len(self._records)

    def _expire(self) -> None:
        cutoff = self._clock() - RECORD_TTL_S
        while self._records:
            rid, (t, _) = next(iter(self._records.items()))
            if t >= cutoff and len(self._records) <= MAX_RECORDS:
                return
            del self._records[rid]
            self.expired_total += 1
