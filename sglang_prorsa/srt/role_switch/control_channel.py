"""A private request/reply channel between an engine's HTTP process and its scheduler process.

SGLang's own control messages go through the tokenizer manager and only carry SGLang's types; a busy-instance switch
needs to hand structured records (request tokens, sampling parameters, store keys) back to the HTTP side. The scheduler
binds a ZMQ REP socket at an ipc address given by the environment and answers between batches, from inside its event
loop (so it never races the model forward); the HTTP side sends one pickled message at a time and waits with a
timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import tempfile
import uuid
from typing import Any, Callable

import zmq
import zmq.asyncio

logger = logging.getLogger(__name__)

ENV_ADDRESS = "SGLANG_PRORSA_CONTROL_IPC"


def new_address() -> str:
    return f"ipc://{tempfile.gettempdir()}/prorsa-ctl-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ControlServer:
    """Scheduler side: non-blocking; ``poll()`` answers every waiting message with ``handler(message)``."""

    def __init__(self, address: str, handler: Callable[[Any], Any]) -> None:
        self._ctx = zmq.Context.instance()
        self.socket = self._ctx.socket(zmq.REP)
        self.socket.bind(address)
        self._handler = handler

    def poll(self) -> int:
        handled = 0
        while True:
            try:
                raw = self.socket.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return handled
            try:
                reply: Any = self._handler(pickle.loads(raw))
            except Exception as e:  # the reply carries the failure; the scheduler keeps running
                logger.exception("prorsa control message failed")
                reply = ControlError(f"{type(e).__name__}: {e}")
            self.socket.send(pickle.dumps(reply))
            handled += 1


class ControlError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (ControlError, (self.message,))


class ControlClient:
    """HTTP side: one outstanding message at a time (REQ sockets are strictly send/recv); a timed-out socket is
    replaced, since a REQ socket that missed its reply cannot send again."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._ctx = zmq.asyncio.Context.instance()
        self._lock = asyncio.Lock()
        self._socket: zmq.asyncio.Socket | None = None

    def _connect(self) -> zmq.asyncio.Socket:
        s = self._ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.address)
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
                raise TimeoutError(f"scheduler did not answer {type(message).__name__} within {timeout_s} s")
        reply = pickle.loads(raw)
        if isinstance(reply, ControlError):
            raise reply
        return reply
