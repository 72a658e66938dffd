"""``AsyncProrsaClient``: the asyncio trainer client (aiohttp + a background hint task on the same loop).

    async with AsyncProrsaClient("http://127.0.0.1:30000") as client:
        async with client.trajectory(task="swe") as t:
            g = await t.generate(input_ids=[...], max_new_tokens=64, temperature=0)

Use one client per event loop: its HTTP session and hint task live on the loop of its first call.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable, Mapping, Sequence

import aiohttp

from sglang_prorsa.client import grpo
from sglang_prorsa.client.base import ClientBase
from sglang_prorsa.client.errors import ProrsaClientError, ProrsaConnectionError, ProrsaHTTPError
from sglang_prorsa.client.generation import Generation
from sglang_prorsa.client.hints import HintConfig
from sglang_prorsa.client.senders import AsyncHintSender
from sglang_prorsa.client.trajectory import AsyncTrajectory


class AsyncProrsaClient(ClientBase):
    def __init__(self, url: str, *, hints_url: str | None = None, hints: HintConfig | None = None,
                 timeout_s: float = 600.0, headers: Mapping[str, str] | None = None, pool_size: int = 256) -> None:
        super().__init__(url, hints_url, hints, timeout_s, headers)
        self._sender = AsyncHintSender(self.hints_url, self.hint_config, self._buffer, self.headers)
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ----- generation -----
    async def generate(self, input_ids: Sequence[int] | None = None, *, text: str | None = None,
                       sampling_params: Mapping[str, Any] | None = None, max_new_tokens: int | None = None,
                       temperature: float | None = None, return_logprob: bool = True,
                       trajectory_id: str | None = None, rid: str | None = None,
                       extra: Mapping[str, Any] | None = None, timeout_s: float | None = None) -> Generation:
        body, headers, report = self._generation_request(
            input_ids, text, sampling_params, trajectory_id, max_new_tokens=max_new_tokens, temperature=temperature,
            return_logprob=return_logprob, rid=rid, extra=extra)
        if self._must_send_hints_first(trajectory_id):
            self._bind_loop()
            self._sender.notify(urgent=True)
            if self.hint_config.order_timeout_s > 0:
                await self._sender.wait_settled(self._stats.enqueued, self.hint_config.order_timeout_s)
        t0 = time.perf_counter()
        answer = await self.post_json("/generate", body, headers=headers, timeout_s=timeout_s)
        return self._generation_answered(answer, trajectory_id, report, time.perf_counter() - t0)

    # ----- hints -----
    def trajectory(self, task: str | None = None, *, trajectory_id: str | None = None, group_id: str | None = None,
                   prompt_tokens: int | None = None) -> AsyncTrajectory:
        return AsyncTrajectory(self, trajectory_id=trajectory_id, task=task, group_id=group_id,
                               prompt_tokens=prompt_tokens)

    async def run_group(self, n: int, fn: Callable[[AsyncTrajectory], Awaitable[Any]], **kwargs: Any) -> list[Any]:
        """GRPO: ``await fn(trajectory)`` for ``n`` members sharing a group id, concurrently."""
        return await grpo.run_group_async(self, n, fn, **kwargs)

    async def flush_hints(self, timeout_s: float | None = None) -> bool:
        return await self._sender.flush(self.hint_config.close_timeout_s if timeout_s is None else timeout_s)

    # ----- control plane and engine routes -----
    async def forecast(self) -> dict:
        return await self.get_json("/prorsa/forecast", base=self.hints_url)

    async def lifecycle_status(self) -> dict:
        return await self.get_json("/lifecycle/status", base=self.hints_url)

    async def decision(self) -> dict:
        return await self.get_json("/prorsa/decision")

    async def instances(self) -> dict:
        return await self.get_json("/prorsa/instances")

    async def metrics(self) -> str:
        return await self._call("GET", "/prorsa/metrics", raw=True)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                       **extra: Any) -> dict:
        body = self._weights_body(model_path, weight_version, extra)
        return await self.post_json("/update_weights_from_disk", body)

    async def get_json(self, path: str, *, params: Mapping[str, Any] | None = None,
                       base: str | None = None) -> Any:
        return await self._call("GET", path, params=params, base=base)

    async def post_json(self, path: str, body: Any, *, headers: Mapping[str, str] | None = None,
                        timeout_s: float | None = None, base: str | None = None) -> Any:
        return await self._call("POST", path, body=body, headers=headers, timeout_s=timeout_s, base=base)

    # ----- lifecycle of the client -----
    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._sender.close(self.hint_config.close_timeout_s)
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> "AsyncProrsaClient":
        self._bind_loop()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ----- internals -----
    def _bind(self) -> None:
        self._bind_loop()

    def _bind_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ProrsaClientError("AsyncProrsaClient must be used inside a running event loop "
                                    "(use ProrsaClient from synchronous code)") from None
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise ProrsaClientError("AsyncProrsaClient is bound to another event loop; create one client per loop")

    async def _call(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
                    headers: Mapping[str, str] | None = None, timeout_s: float | None = None,
                    base: str | None = None, raw: bool = False) -> Any:
        self._bind_loop()
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._pool_size))
        url = (base or self.url) + path
        all_headers = {**self.headers, **(headers or {})}
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._session.request(method, url, json=body, params=params, headers=all_headers,
                                             timeout=timeout) as r:
                text = await r.text()
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise ProrsaConnectionError(method, url, exc) from exc
        if not 200 <= status < 300:
            raise ProrsaHTTPError(method, url, status, text)
        if raw:
            return text
        try:
            return json.loads(text)
        except ValueError:
            return text
