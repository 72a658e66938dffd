"""Keep an external sglang-router's PD worker pools in step with our roles (``--prorsa-router URL``).

Facts for sglang-router 0.3.2 (checked here against the installed wheel): ``GET /workers`` lists workers with their
``id``, ``url`` and ``worker_type``; ``POST /workers {url, worker_type, bootstrap_port}`` adds one and
``DELETE /workers/{id}`` removes one, both asynchronously (202), so each change is polled until it shows in
``GET /workers``. ``PUT`` cannot change a worker's type: moving an instance between pools is a removal then an add.
An add runs the router's health check against the worker (``GET /health``, which generates a token): a paused
instance cannot pass it, so an add that does not show in time is retried in the background until it does (or until
the next change of that worker supersedes it) instead of failing the switch that already happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import quote

from sglang_prorsa.srt.controller.http import Http

logger = logging.getLogger(__name__)

POLL_S = 0.1
RETRY_EVERY_S = 5.0
RETRY_FOR_S = 3600.0


class RouterPoolError(RuntimeError):
    pass


class RouterPools:
    def __init__(self, url: str, http: Http, timeout_s: float = 60.0, api_key: str = "") -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # the router's key, not ours
        self.pending: dict[str, asyncio.Task] = {}  # url -> background re-add (one per worker, newest wins)

    async def workers(self) -> list[dict[str, Any]]:
        status, body = await self.http.get(self.url + "/workers", headers=self.headers)
        if status != 200:
            raise RouterPoolError(f"GET /workers answered {status}: {body}")
        return list(body.get("workers") or [])

    async def _find(self, url: str) -> dict[str, Any] | None:
        for w in await self.workers():
            if str(w.get("url", "")).rstrip("/") == url.rstrip("/"):
                return w
        return None

    async def remove(self, url: str) -> None:
        """Take ``url`` out of its pool and wait until the router no longer lists it."""
        self._supersede(url)
        worker = await self._find(url)
        if worker is None:
            return
        wid = str(worker.get("id") or worker.get("worker_id") or url)
        status, body = await self.http.request("DELETE", f"{self.url}/workers/{quote(wid, safe='')}",
                                               headers=self.headers)
        if status not in (200, 202, 204):
            raise RouterPoolError(f"DELETE /workers/{wid} answered {status}: {body}")
        await self._until(lambda w: w is None, url, "removed")

    async def add_eventually(self, url: str, role: str, bootstrap_port: int | None) -> bool:
        """``add``; if the router does not list it in time, keep retrying in the background. True: listed now."""
        try:
            await self.add(url, role, bootstrap_port)
            return True
        except RouterPoolError as e:
            logger.warning("%s; retrying in the background every %.0f s", e, RETRY_EVERY_S)
            self.pending[url] = asyncio.get_running_loop().create_task(self._retry_add(url, role, bootstrap_port))
            return False

    async def place(self, url: str, role: str, bootstrap_port: int | None) -> bool:
        """``url`` in the ``role`` pool and no other, whatever the router lists now: left alone where it is right
        already; out of the other pool first (a controller that died between a switch and its pool change left it
        there; ``PUT`` cannot change a type). True: listed there now (``add_eventually``)."""
        worker = await self._find(url)
        if worker is not None and _type_of(worker) == role:
            self._supersede(url)
            return True
        if worker is not None:
            await self.remove(url)
        return await self.add_eventually(url, role, bootstrap_port)

    async def _retry_add(self, url: str, role: str, bootstrap_port: int | None) -> None:
        deadline = time.monotonic() + RETRY_FOR_S
        while time.monotonic() < deadline:
            await asyncio.sleep(RETRY_EVERY_S)
            try:
                worker = await self._find(url)
                if worker is not None and _type_of(worker) == role:
                    break
                await self._post(url, role, bootstrap_port)
            except (RouterPoolError, OSError, asyncio.TimeoutError) as e:
                logger.warning("re-adding %s as %s: %s", url, role, e)
        else:
            logger.error("gave up re-adding %s to the router's %s pool after %.0f s", url, role, RETRY_FOR_S)
        if self.pending.get(url) is asyncio.current_task():
            del self.pending[url]

    def _supersede(self, url: str) -> None:
        task = self.pending.pop(url, None)
        if task is not None:
            task.cancel()

    async def add(self, url: str, role: str, bootstrap_port: int | None) -> None:
        """Put ``url`` into the ``role`` pool and wait until the router lists it there."""
        self._supersede(url)
        await self._post(url, role, bootstrap_port)
        await self._until(lambda w: w is not None and _type_of(w) == role, url, f"added as {role}")

    async def _post(self, url: str, role: str, bootstrap_port: int | None) -> None:
        payload: dict[str, Any] = {"url": url, "worker_type": role}
        if role == "prefill":
            payload["bootstrap_port"] = bootstrap_port
        status, body = await self.http.post(self.url + "/workers", payload, headers=self.headers)
        if status not in (200, 201, 202):
            raise RouterPoolError(f"POST /workers answered {status}: {body}")

    async def _until(self, ok, url: str, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if ok(await self._find(url)):
                return
            if time.monotonic() > deadline:
                raise RouterPoolError(f"router did not show {url} {what} within {self.timeout_s} s")
            await asyncio.sleep(POLL_S)


def _type_of(worker: dict[str, Any]) -> str:
    t = worker.get("worker_type")
    if isinstance(t, dict):  # some versions nest it: {"Prefill": {"bootstrap_port": ...}}
        t = next(iter(t), "")
    return str(t or "").lower()
