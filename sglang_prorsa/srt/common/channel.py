"""The private channel between an instance's engine side (tokenizer-manager process) and its scheduler process.

SGLang's own control messages go through the tokenizer manager and only carry SGLang's types; a busy switch needs to
hand structured records (tokens, sampling parameters, store keys) to the engine side. Two ZMQ sockets over ipc:

- control (REQ/ROUTER): the engine sends one typed message from ``srt/common/messages.py`` at a time; the scheduler
  answers between two forward passes, from inside its event loop, so it never races the model (a ROUTER, not a REP:
  with tensor parallelism rank 0 drains every waiting message first, hands them to the other ranks, then answers
  each; ``srt/scheduler/ranks.py``);
- records (PUSH/PULL): the scheduler pushes a ``MigratedRequest`` for each request it takes off the instance
  *before* it aborts it; and a ``Decoding`` note when requests start decoding (the lifecycle's prefill_end). Two
  sockets are not ordered with each other nor with SGLang's: an abort can reach the engine side before its record
  (0.1 s before, seen on a loaded machine), so the engine side waits for it (``aborts.late_record``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import zmq
import zmq.asyncio

from sglang_prorsa.srt.common.messages import ChannelError, Decoding, MigratedRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChannelAddresses:
    control: str
    records: str

    @classmethod
    def fresh(cls) -> ChannelAddresses:
        base = f"ipc://{tempfile.gettempdir()}/prorsa-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        return cls(control=base + "-ctl", records=base + "-rec")

    def for_dp_rank(self, dp_rank: int | None, dp_size: int) -> ChannelAddresses:
        """The channel of one data-parallel rank's scheduler group: the instance's own addresses without data
        parallelism, else each DP rank's with its suffix."""
        if dp_rank is None or dp_size <= 1:
            return self
        return ChannelAddresses(control=f"{self.control}-dp{dp_rank}", records=f"{self.records}-dp{dp_rank}")


def answer(handler: Callable[[Any], Any], raw: bytes) -> Any:
    """``handler``'s reply to one pickled message; a failure becomes a ``ChannelError`` reply (the scheduler keeps
    running)."""
    try:
        return handler(pickle.loads(raw))
    except Exception as e:
        logger.exception("prorsa control message failed")
        return ChannelError(f"{type(e).__name__}: {e}")


class SchedulerChannel:
    """Scheduler side, non-blocking: ``poll()`` answers every waiting message with ``handler(message)``;
    ``receive()`` and ``reply()`` split that for a caller that hands the messages on before answering them."""

    def __init__(self, addresses: ChannelAddresses, handler: Callable[[Any], Any]) -> None:
        ctx = zmq.Context.instance()
        self.control = ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.bind(addresses.control)
        self.records = ctx.socket(zmq.PUSH)
        self.records.setsockopt(zmq.LINGER, 0)
        self.records.bind(addresses.records)
        self._handler = handler

    def receive(self) -> list[tuple[list[bytes], bytes]]:
        """Every message waiting now, in arrival order: (its envelope, the pickled message)."""
        out = []
        while True:
            try:
                *envelope, raw = self.control.recv_multipart(flags=zmq.NOBLOCK)  # REQ's: identity, empty, payload
            except zmq.Again:
                return out
            out.append((envelope, raw))

    def reply(self, envelope: list[bytes], reply: Any) -> None:
        self.control.send_multipart([*envelope, pickle.dumps(reply)])

    def poll(self) -> int:
        handled = 0
        while True:
            waiting = self.receive()
            if not waiting:
                return handled
            for envelope, raw in waiting:
                self.reply(envelope, answer(self._handler, raw))
            handled += len(waiting)

    def push(self, record: MigratedRequest | Decoding) -> None:
        self.records.send(pickle.dumps(record))


class EngineChannel:
    """Engine side: ``call`` sends one message and awaits its reply (one outstanding at a time: REQ sockets are
    strictly send/recv; a timed-out socket is replaced, since a REQ that missed its reply cannot send again).

    Records arrive on a plain (synchronous) socket: ``drain()`` reads every record already delivered, without
    blocking, and ``attach(loop, on_record)`` calls ``on_record`` from the event loop as records arrive (ZMQ's FD is
    edge-triggered, so each wake-up drains fully)."""

    def __init__(self, addresses: ChannelAddresses) -> None:
        self.addresses = addresses
        self._ctx = zmq.asyncio.Context.instance()
        self._lock = asyncio.Lock()
        self._socket: zmq.asyncio.Socket | None = None
        self._records = zmq.Context.instance().socket(zmq.PULL)
        self._records.setsockopt(zmq.LINGER, 0)
        self._records.connect(addresses.records)
        self._on_record: Callable[[MigratedRequest], None] | None = None
        self._on_decoding: Callable[[Decoding], None] | None = None

    def _connect(self) -> zmq.asyncio.Socket:
        s = self._ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.addresses.control)
        return s

    async def call(self, message: Any, timeout_s: float = 120.0) -> Any:
        async with self._lock:
            if self._socket is None:
                self._socket = self._connect()
            await self._socket.send(pickle.dumps(message))
            try:
                raw = await asyncio.wait_for(self._socket.recv(), timeout_s)
            except asyncio.TimeoutError:
                self._socket.close()
                self._socket = None
                raise TimeoutError(
                    f"scheduler did not answer {type(message).__name__} within {timeout_s} s") from None
        reply = pickle.loads(raw)
        if isinstance(reply, ChannelError):
            raise reply
        return reply

    def attach(self, loop: asyncio.AbstractEventLoop, on_record: Callable[[MigratedRequest], None],
               on_decoding: Callable[[Decoding], None] | None = None) -> None:
        self._on_record, self._on_decoding = on_record, on_decoding
        loop.add_reader(self._records.getsockopt(zmq.FD), self.drain)
        self.drain()

    def drain(self) -> list[MigratedRequest]:
        """Every record already delivered (``Decoding`` notes go to their own callback, never into the list)."""
        out = []
        while True:
            try:
                raw = self._records.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            record = pickle.loads(raw)
            if isinstance(record, Decoding):
                if self._on_decoding is not None:
                    self._on_decoding(record)
                continue
            out.append(record)
            if self._on_record is not None:
                self._on_record(record)
        return out


class EngineChannels:
    """The engine side's channels, one per data-parallel rank's scheduler group (one without data parallelism):
    records from every rank go to the same callbacks and into the same ``drain``."""

    def __init__(self, channels: list[EngineChannel]) -> None:
        if not channels:
            raise ValueError("at least one channel")
        self.ranks = channels

    @classmethod
    def connect(cls, addresses: ChannelAddresses, dp_size: int = 1) -> EngineChannels:
        size = max(1, int(dp_size))
        return cls([EngineChannel(addresses.for_dp_rank(rank if size > 1 else None, size)) for rank in range(size)])

    def attach(self, loop: asyncio.AbstractEventLoop, on_record: Callable[[MigratedRequest], None],
               on_decoding: Callable[[Decoding], None] | None = None) -> None:
        for channel in self.ranks:
            channel.attach(loop, on_record, on_decoding)

    def drain(self) -> list[MigratedRequest]:
        return [record for channel in self.ranks for record in channel.drain()]
