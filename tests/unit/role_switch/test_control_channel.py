"""The scheduler control channel: replies, errors carried back, and recovery after a timeout."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sglang_prorsa.srt.role_switch.control_channel import ControlClient, ControlError, ControlServer, new_address
from sglang_prorsa.srt.role_switch.messages import Status


def _serve(server: ControlServer, stop: threading.Event) -> None:
    while not stop.is_set():
        server.poll()
        time.sleep(0.005)


def test_round_trip_and_error_propagation():
    calls = []

    def handler(msg):
        calls.append(msg)
        if isinstance(msg, str):
            raise ValueError(f"bad message {msg}")
        return {"echo": msg}

    address = new_address()
    server = ControlServer(address, handler)
    stop = threading.Event()
    t = threading.Thread(target=_serve, args=(server, stop), daemon=True)
    t.start()

    async def run():
        client = ControlClient(address)
        assert await client.call(Status()) == {"echo": Status()}
        with pytest.raises(ControlError, match="ValueError: bad message x"):
            await client.call("x")
        assert await client.call(7) == {"echo": 7}  # the channel survives a failed handler

    try:
        asyncio.run(run())
    finally:
        stop.set()
        t.join()
    assert calls == [Status(), "x", 7]


def test_timeout_then_recovery():
    address = new_address()
    server = ControlServer(address, lambda m: m * 2)

    async def run():
        client = ControlClient(address)
        with pytest.raises(TimeoutError):
            await client.call(1, timeout_s=0.2)  # nobody polls yet
        stop = threading.Event()
        t = threading.Thread(target=_serve, args=(server, stop), daemon=True)
        t.start()
        try:
            # A fresh socket replaces the one that missed its reply; the late reply to the first call is dropped.
            assert await client.call(21, timeout_s=5) == 42
        finally:
            stop.set()
            t.join()

    asyncio.run(run())
