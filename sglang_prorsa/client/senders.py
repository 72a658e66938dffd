"""The background hint senders: a thread (``ThreadHintSender``) and an asyncio task (``AsyncHintSender``).

Both take batches from a ``HintBuffer`` and follow the delivery rules in ``hints.py``; they differ only in how they
wait and post. Neither is ever awaited by a hint call: the caller queues and returns.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

import aiohttp
import requests

from sglang_prorsa.client.errors import error_message
from sglang_prorsa.client.hints import HintBuffer, HintConfig, classify

logger = logging.getLogger("sglang_prorsa.client")

LIFECYCLE_PATH = "/lifecycle"


def _describe(status: int, text: str) -> str:
    return f"POST {LIFECYCLE_PATH} -> HTTP {status}: {error_message(text)[0]}"


class _Sender:
    """Where the hints go, and what a delivery attempt's outcome does to the buffer."""

    def __init__(self, hints_url: str, config: HintConfig, buffer: HintBuffer,
                 headers: dict[str, str] | None = None) -> None:
        self.url = hints_url.rstrip("/") + LIFECYCLE_PATH
        self.config = config
        self.buffer = buffer
        self.headers = dict(headers or {})

    def _settle_unless_retry(self, batch: list[dict[str, Any]], outcome: str, error: str | None) -> bool:
        """Settle ``batch`` unless the attempt is to be retried (then False)."""
        if outcome == "retry":
            return False
        if outcome != "ok":
            logger.warning("lifecycle hints %s: %s", outcome, error)
        self.buffer.settle(len(batch), outcome, error)
        return True

    def _give_up(self, batch: list[dict[str, Any]], attempts: int, error: str | None) -> None:
        logger.warning("dropped %d lifecycle hints after %d attempts: %s", len(batch), attempts, error)
        self.buffer.settle(len(batch), "failed", error)


class ThreadHintSender(_Sender):
    def __init__(self, hints_url: str, config: HintConfig, buffer: HintBuffer,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(hints_url, config, buffer, headers)
        self._cv = threading.Condition()
        self._urgent = False
        self._closing = False
        self._abandon = threading.Event()  # set when close() gives up: stop retrying, drop what is left
        self._thread: threading.Thread | None = None

    def notify(self, urgent: bool = False) -> None:
        """A hint was queued (``urgent``: send without waiting for the batching window)."""
        with self._cv:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="prorsa-hint-sender", daemon=True)
                self._thread.start()
            self._urgent = self._urgent or urgent
            self._cv.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Send everything queued now; True once all of it is settled (sent, rejected or dropped) within the time."""
        return self._send_now_and_wait(lambda: self.buffer.drained, timeout_s)

    def wait_settled(self, count: int, timeout_s: float) -> bool:
        """Send now and wait until the first ``count`` events queued are settled, at most ``timeout_s``."""
        return self._send_now_and_wait(lambda: self.buffer.settled_total >= count, timeout_s)

    def _send_now_and_wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._urgent = True
            self._cv.notify_all()
            while not done():
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return done()
                self._cv.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued within ``timeout_s``, then stop; whatever is left is counted as failed."""
        self.flush(timeout_s)
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._abandon.set()
        if self._thread is not None:
            self._thread.join(self.config.request_timeout_s + 1.0)
        self.buffer.abandon("client closed before these hints were delivered")

    def _run(self) -> None:
        session = requests.Session()
        try:
            while True:
                with self._cv:
                    while not len(self.buffer) and not self._closing:
                        self._cv.wait()
                    if self._closing:
                        return
                    window_end = time.monotonic() + self.config.flush_interval_s
                    while (len(self.buffer) < self.config.max_batch and not self._urgent and not self._closing
                           and time.monotonic() < window_end):
                        self._cv.wait(window_end - time.monotonic())
                    self._urgent = self._urgent and len(self.buffer) > self.config.max_batch
                batch = self.buffer.take(self.config.max_batch)
                if batch:
                    self._deliver(session, batch)
                with self._cv:
                    self._cv.notify_all()  # wake flush() waiters
        finally:
            session.close()

    def _deliver(self, session: requests.Session, batch: list[dict[str, Any]]) -> None:
        error = None
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                r = session.post(self.url, json={"events": batch}, headers=self.headers,
                                 timeout=self.config.request_timeout_s)
                outcome = classify(r.status_code)
                error = None if outcome == "ok" else _describe(r.status_code, r.text)
            except requests.RequestException as exc:
                outcome, error = "retry", f"POST {LIFECYCLE_PATH}: {type(exc).__name__}: {exc}"
            if self._settle_unless_retry(batch, outcome, error):
                return
            if attempt == self.config.max_attempts or self._abandon.wait(self.config.backoff_s(attempt)):
                break
            self.buffer.stats.retries += 1
        self._give_up(batch, attempt, error)


class AsyncHintSender(_Sender):
    """The same loop as an asyncio task on the client's event loop."""

    def __init__(self, hints_url: str, config: HintConfig, buffer: HintBuffer,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(hints_url, config, buffer, headers)
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()
        self._settled = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    def notify(self, urgent: bool = False) -> None:
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="prorsa-hint-sender")
        if urgent:
            self._urgent.set()
        self._wake.set()

    async def flush(self, timeout_s: float) -> bool:
        return await self._send_now_and_wait(lambda: self.buffer.drained, timeout_s)

    async def wait_settled(self, count: int, timeout_s: float) -> bool:
        return await self._send_now_and_wait(lambda: self.buffer.settled_total >= count, timeout_s)

    async def _send_now_and_wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        self._urgent.set()
        self._wake.set()
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or self._task is None or self._task.done():
                return done()
            self._settled.clear()
            try:
                await asyncio.wait_for(self._settled.wait(), timeout=min(left, 0.05))
            except asyncio.TimeoutError:
                pass
        return True

    async def close(self, timeout_s: float) -> None:
        await self.flush(timeout_s)
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._session is not None:
            await self._session.close()
        self.buffer.abandon("client closed before these hints were delivered")

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout)
        while not self._closing:
            if not len(self.buffer):
                self._wake.clear()
                await self._wake.wait()
                continue
            if len(self.buffer) < self.config.max_batch and not self._urgent.is_set():
                try:
                    await asyncio.wait_for(self._urgent.wait(), timeout=self.config.flush_interval_s)
                except asyncio.TimeoutError:
                    pass
            if len(self.buffer) <= self.config.max_batch:
                self._urgent.clear()
            batch = self.buffer.take(self.config.max_batch)
            if batch:
                try:
                    await self._deliver(batch)
                except asyncio.CancelledError:
                    self.buffer.settle(len(batch), "failed", "client closed while these hints were being sent")
                    raise
            self._settled.set()

    async def _deliver(self, batch: list[dict[str, Any]]) -> None:
        error = None
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                async with self._session.post(self.url, json={"events": batch}, headers=self.headers) as r:
                    text = await r.text()
                    outcome = classify(r.status)
                    error = None if outcome == "ok" else _describe(r.status, text)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcome, error = "retry", f"POST {LIFECYCLE_PATH}: {type(exc).__name__}: {exc}"
            if self._settle_unless_retry(batch, outcome, error):
                return
            if attempt == self.config.max_attempts:
                break
            self.buffer.stats.retries += 1
            await asyncio.sleep(self.config.backoff_s(attempt))
        self._give_up(batch, attempt, error)
