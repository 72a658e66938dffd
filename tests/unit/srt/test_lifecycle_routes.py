"""POST /lifecycle on the event loop that serves requests (srt/lifecycle_routes.py): a batch never waits there for the
forecast refresher, which holds the control plane's state while it computes."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from fastapi import FastAPI

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.srt.lifecycle_routes import make_router

HOLD_S = 1.5  # a refresh this slow happens on a loaded machine


def test_a_batch_posted_during_a_slow_refresh_is_applied_without_stalling_the_loop():
    cp = LifecycleControlPlane(ManualClock(0.0))
    slow = threading.Event()
    real_forecast = cp.predictor.forecast

    def slow_forecast(at):
        if not slow.is_set():  # the first refresh only
            slow.set()
            time.sleep(HOLD_S)
        return real_forecast(at)

    cp.predictor.forecast = slow_forecast
    app = FastAPI()
    app.include_router(make_router(cp))
    events = {"events": [{"trajectory_id": "t1", "event": "sampled", "ts": 0.0},
                         {"trajectory_id": "t1", "event": "request_arrived", "ts": 0.0, "prompt_tokens": 10}]}

    async def scenario():
        refresher = threading.Thread(target=cp.refresh_now)  # the refresher's step: the lock held for HOLD_S
        refresher.start()
        assert await asyncio.to_thread(slow.wait, 10)
        gaps, done = [], False

        async def ticker():
            last = time.perf_counter()
            while not done:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front") as client:
            t0 = time.perf_counter()
            response = await client.post("/lifecycle", json=events)
            waited = time.perf_counter() - t0
        done = True
        await tick
        refresher.join()
        return response, waited, max(gaps, default=waited)  # no gap at all: the loop never ran while it waited

    response, waited, worst_gap = asyncio.run(scenario())
    assert response.status_code == 200 and response.json()["applied"] == 2
    assert cp.tracker.live_count == 1
    assert waited > HOLD_S / 2  # it did wait for the state ...
    assert worst_gap < HOLD_S / 2  # ... in a thread: the loop kept running meanwhile
