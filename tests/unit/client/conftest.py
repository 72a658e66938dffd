"""A scriptable local HTTP server standing in for an engine where a real one is not needed, and the real standalone
control plane (``python -m sglang_prorsa.control_plane``) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from sglang_prorsa.srt.utils import processes


@dataclass
class FakeState:
    """What the fake server answers and what it saw."""

    lifecycle_statuses: list[int] = field(default_factory=list)  # answered in order, then 200
    lifecycle_gate: threading.Event | None = None  # when set: /lifecycle waits until the event is set
    batches: list[list[dict]] = field(default_factory=list)  # accepted /lifecycle batches
    lifecycle_calls: int = 0
    lifecycle_answered: int = 0
    generate_bodies: list[dict] = field(default_factory=list)
    generate_headers: list[dict] = field(default_factory=list)
    events_seen_by_generate: list[int] = field(default_factory=list)  # hints received when each /generate came
    weights: list[dict] = field(default_factory=list)

    @property
    def events(self) -> list[dict]:
        return [e for b in self.batches for e in b]


def fake_generation(body: dict) -> dict:
    """Deterministic SGLang-shaped answer: output token i is (last prompt id + i + 1) % 1000, logprob -(i+1)/8."""
    ids = body.get("input_ids") or [len(body.get("text", ""))]
    n = body.get("sampling_params", {}).get("max_new_tokens", 4)
    out = [(ids[-1] + i + 1) % 1000 for i in range(n)]
    meta = {"id": "r", "prompt_tokens": len(ids), "completion_tokens": n, "cached_tokens": 1,
            "finish_reason": {"type": "length", "length": n}, "weight_version": "default"}
    if body.get("return_logprob"):
        meta["output_token_logprobs"] = [[-(i + 1) / 8, t, None] for i, t in enumerate(out)]
    return {"text": " ".join(map(str, out)), "output_ids": out, "meta_info": meta}


def _app(state: FakeState) -> web.Application:
    async def lifecycle(request: web.Request) -> web.Response:
        state.lifecycle_calls += 1
        body = await request.json()
        if state.lifecycle_gate is not None:
            await asyncio.get_running_loop().run_in_executor(None, state.lifecycle_gate.wait, 30)
        state.lifecycle_answered += 1
        if state.lifecycle_statuses:
            status = state.lifecycle_statuses.pop(0)
            if status != 200:
                return web.json_response({"error": f"scripted {status}", "index": None, "field": "events"},
                                         status=status)
        state.batches.append(body["events"])
        n = len(body["events"])
        return web.json_response({"received": n, "applied": n, "duplicates": 0, "rejected": 0, "rejections": []})

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        state.generate_bodies.append(body)
        state.events_seen_by_generate.append(len(state.events))
        state.generate_headers.append(dict(request.headers))
        if body.get("sampling_params", {}).get("max_new_tokens") == 999:
            return web.json_response({"error": "field 'sampling_params.max_new_tokens': too many for this test",
                                      "field": "sampling_params.max_new_tokens"}, status=422)
        return web.json_response(fake_generation(body))

    async def weights(request: web.Request) -> web.Response:
        state.weights.append(await request.json())
        return web.json_response({"success": True, "message": "ok"})

    async def text(request: web.Request) -> web.Response:
        return web.Response(text="prorsa_busy_seconds_total{instance=\"0\",role=\"prefill\"} 1.5\n")

    app = web.Application()
    app.router.add_post("/lifecycle", lifecycle)
    app.router.add_post("/generate", generate)
    app.router.add_post("/update_weights_from_disk", weights)
    app.router.add_get("/prorsa/metrics", text)
    return app


class FakeServer:
    def __init__(self) -> None:
        self.state = FakeState()
        self.port = processes.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(_app(self.state))
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> "FakeServer":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.state.lifecycle_gate is not None:
            self.state.lifecycle_gate.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


@pytest.fixture
def dead_url() -> str:
    """A loopback port nobody listens on: connection refused at once."""
    return f"http://127.0.0.1:{processes.free_port()}"


@pytest.fixture(scope="module")
def control_plane():
    port = processes.free_port()
    srv = processes.start(["--host", processes.LOOPBACK, "--port", str(port), "--log-level", "warning"],
                          name=f"control-plane-{port}", port=port, module="sglang_prorsa.control_plane")
    try:
        srv.wait_ready(timeout=60)
        yield srv
    finally:
        srv.stop(grace_s=3)
