"""The controller's HTTP client to instances and routers (one aiohttp session, JSON in and out)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson


class Http:
    def __init__(self, headers: dict[str, str] | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._headers = headers or {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60), headers=self._headers)
        return self._session

    async def request(self, method: str, url: str, payload: Any = None, timeout_s: float = 30.0,
                      headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = None if payload is None else orjson.dumps(payload)
        hdrs = {"Content-Type": "application/json", **(headers or {})} if data is not None else headers
        async with self.session().request(method, url, data=data, headers=hdrs,
                                          timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            raw = await r.read()
            try:
                return r.status, orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                return r.status, {"error": raw[:2000].decode(errors="replace")}

    async def get(self, url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return await self.request("GET", url, timeout_s=timeout_s, headers=headers)

    async def post(self, url: str, payload: Any = None, timeout_s: float = 30.0,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return await self.request("POST", url, payload if payload is not None else {}, timeout_s, headers)

    async def get_text(self, url: str, timeout_s: float = 5.0) -> tuple[int, str]:
        async with self.session().get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return r.status, await r.text()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
