"""Lifecycle hints on the trainer's side: their configuration, the bounded buffer and the delivery rules.

A hint is queued in microseconds and delivered later, in batches, by a background sender (a thread for
``ProrsaClient``, an asyncio task for ``AsyncProrsaClient``; see ``senders.py``), so generation never waits for one.

Delivery rules (both senders):
- Each batch is ``POST {hints_url}/lifecycle {"events": [...]}`` with up to ``max_batch`` events, sent once
  ``flush_interval_s`` has passed since the first queued event (sooner when the batch is full or a flush is asked for).
- Every event carries ``ts``, the trainer's clock when the transition happened, so batching delay does not shift it.
- A connection error, a timeout, 408, 429 or 5xx is retried up to ``max_attempts`` times in all, waiting
  ``backoff_base_s * 2**k`` (at most ``backoff_max_s``) between attempts; then the batch is dropped and counted in
  ``failed``. Other 4xx answers are not retried: the batch is counted in ``rejected`` and the server's message kept in
  ``last_error``. A 404 means the server has no lifecycle route (plain SGLang): the sender stops sending and counts
  every hint from then on in ``unsupported``; generation is unaffected.
- ``report_requests=True`` makes the client report the engine's side of each request itself (``request_arrived``
  when it sends a ``/generate`` of a trajectory, ``prefill_end`` and ``decode_end`` when the answer comes, stamped
  with the answer time since the client cannot see when prefill ended). Use it where the hint endpoint does not see
  the requests: generation straight to engines or through sglang-router with hints to a separate control plane, or
  an engine that does not track trajectories. Leave it off behind our front, which reports these events itself (a
  double report is harmless but counted as rejected transitions).
- ``order_timeout_s`` (default 0: off) lets a trajectory's ``generate`` wait at most that long for the hints queued
  before it to be settled, so that e.g. ``tool_end`` reaches the server before the engine reports the next request
  (otherwise the server may see them in the other order and count the late hint as an invalid transition). With 0,
  generation never waits for a hint.
- The buffer holds at most ``capacity`` events waiting to be sent (plus the one batch being sent). When it is full,
  ``overflow="drop_oldest"`` (the default) drops the oldest waiting event and counts it in ``dropped_overflow``, so
  a hint call never blocks and never raises; ``overflow="error"`` refuses the new hint with ``HintBufferFull``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from sglang_prorsa.client.errors import HintBufferFull, HintError, InvalidArgument
from sglang_prorsa.policy.lifecycle.events import MAX_BATCH_EVENTS, EventValidationError, parse_event

OVERFLOW_POLICIES = ("drop_oldest", "error")


@dataclass(frozen=True)
class HintConfig:
    capacity: int = 10_000
    overflow: str = "drop_oldest"
    max_batch: int = 1_000
    flush_interval_s: float = 0.02
    max_attempts: int = 5
    backoff_base_s: float = 0.05
    backoff_max_s: float = 2.0
    request_timeout_s: float = 5.0
    close_timeout_s: float = 5.0  # how long close() waits for queued hints to be delivered
    report_requests: bool = False  # the client reports request_arrived / prefill_end / decode_end itself
    order_timeout_s: float = 0.0  # generate waits at most this long for earlier hints to be settled (0: never)

    def __post_init__(self) -> None:
        for name in ("capacity", "max_batch", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(name, f"must be a positive integer, got {value!r}")
        if self.max_batch > MAX_BATCH_EVENTS:
            raise InvalidArgument("max_batch", f"must be <= {MAX_BATCH_EVENTS} (the server's batch limit)")
        if self.overflow not in OVERFLOW_POLICIES:
            raise InvalidArgument("overflow", f"must be one of {list(OVERFLOW_POLICIES)}, got {self.overflow!r}")
        for name in ("flush_interval_s", "backoff_base_s", "backoff_max_s", "request_timeout_s", "close_timeout_s",
                     "order_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidArgument(name, f"must be a number >= 0, got {value!r}")
        if not isinstance(self.report_requests, bool):
            raise InvalidArgument("report_requests", f"must be true or false, got {self.report_requests!r}")
        if self.request_timeout_s == 0:
            raise InvalidArgument("request_timeout_s", "must be > 0")

    def backoff_s(self, attempt: int) -> float:
        """Wait after failed attempt ``attempt`` (1-based)."""
        return min(self.backoff_max_s, self.backoff_base_s * (2 ** (attempt - 1)))


@dataclass
class HintStats:
    """Counters of one client's hints. ``enqueued = sent + dropped_overflow + failed + rejected + unsupported +
    pending`` at any quiet moment."""

    enqueued: int = 0
    sent: int = 0
    batches: int = 0
    retries: int = 0
    dropped_overflow: int = 0
    failed: int = 0
    rejected: int = 0
    unsupported: int = 0
    pending: int = 0
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_event(trajectory_id: str, event: str, fields: dict[str, Any], ts: float | None = None) -> dict[str, Any]:
    """One wire event, checked with the server's validator so a bad hint fails here, at the call, naming the field."""
    obj: dict[str, Any] = {"trajectory_id": trajectory_id, "event": event,
                           "ts": time.time() if ts is None else ts}
    obj.update({k: v for k, v in fields.items() if v is not None})
    try:
        parse_event(obj)
    except EventValidationError as exc:
        raise HintError(str(exc).removeprefix("event 0, "), field=exc.field) from None
    return obj


def request_arrived_tokens(body: dict[str, Any]) -> int:
    """Prompt length for a client-side ``request_arrived``: exact for token ids, ~4 bytes a token for text."""
    if "input_ids" in body:
        return len(body["input_ids"])
    return max(1, len(body["text"].encode()) // 4)


def classify(status: int) -> str:
    """'ok' | 'retry' | 'unsupported' | 'rejected' for an HTTP status of ``POST /lifecycle``."""
    if 200 <= status < 300:
        return "ok"
    if status in (408, 429) or status >= 500:
        return "retry"
    if status == 404:
        return "unsupported"
    return "rejected"


class HintBuffer:
    """The bounded FIFO between hint calls and the sender; thread-safe, never blocks the caller."""

    def __init__(self, config: HintConfig, stats: HintStats) -> None:
        self.config = config
        self.stats = stats
        self.disabled = False  # set on 404: hints are counted, not kept
        self._events: deque[dict[str, Any]] = deque()
        self._in_flight = 0  # events taken by the sender whose fate is not settled yet
        self._lock = threading.Lock()

    def put(self, event: dict[str, Any]) -> None:
        with self._lock:
            if self.disabled:
                self.stats.enqueued += 1
                self.stats.unsupported += 1
                return
            if len(self._events) >= self.config.capacity:
                if self.config.overflow == "error":
                    raise HintBufferFull(self.config.capacity)
                self._events.popleft()
                self.stats.dropped_overflow += 1
            self._events.append(event)
            self.stats.enqueued += 1
            self._count_pending()

    def take(self, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            n = min(limit, len(self._events))
            batch = [self._events.popleft() for _ in range(n)]
            self._in_flight += n
            self._count_pending()
            return batch

    def settle(self, n: int, outcome: str, error: str | None = None) -> None:
        """Record the fate of a batch of ``n`` events taken earlier (``outcome`` from ``classify`` or 'failed')."""
        with self._lock:
            s = self.stats
            self._in_flight -= n
            if outcome == "ok":
                s.sent += n
                s.batches += 1
            elif outcome == "unsupported":
                s.unsupported += n + len(self._events)
                self.disabled = True
                self._events.clear()
            elif outcome == "rejected":
                s.rejected += n
            else:
                s.failed += n
            if error is not None:
                s.last_error = error
            self._count_pending()

    def abandon(self, error: str) -> int:
        """Count every waiting event as failed (the client is closing and gave up on them); returns how many."""
        with self._lock:
            n = len(self._events)
            self._events.clear()
            self.stats.failed += n
            if n:
                self.stats.last_error = error
            self._count_pending()
            return n

    def _count_pending(self) -> None:
        self.stats.pending = len(self._events) + self._in_flight

    @property
    def settled_total(self) -> int:
        """Events whose fate is known (sent, dropped, failed, rejected, unsupported). Events are settled in the order
        they were queued, so once this reaches n, the first n events queued are all settled."""
        with self._lock:
            s = self.stats
            return s.sent + s.dropped_overflow + s.failed + s.rejected + s.unsupported

    @property
    def drained(self) -> bool:
        """Nothing waiting and nothing in flight."""
        with self._lock:
            return not self._events and self._in_flight == 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)
