"""The controller's HTTP client to instances and routers (one aiohttp session, JSON in and out).

Reads (GET) carry the deployment's generation key and writes (POST) its admin key, the levels SGLang's middleware
asks for; a caller may pass its own headers instead (the external router's key)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from sglang_prorsa.srt.common.auth import AuthKeys
from sglang_prorsa.srt.common.http_utils import UPSTREAM_KEEPALIVE_S


class Http:
    def __init__(self, keys: AuthKeys = AuthKeys()) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._read = keys.generation_headers()
        self._write = keys.admin_headers()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S))
        return self._session

    async def request(self, method: str, url: str, payload: Any = None, timeout_s: float = 30.0,
                      headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = None if payload is None else orjson.dumps(payload)
        if headers is None:
            headers = self._read if method == "GET" else self._write
        hdrs = {"Content-Type": "application/json", **headers} if data is not None else headers
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
        async with self.session().get(url, headers=self._read, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return r.status, await r.text()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
