"""``PeerClient``: every HTTP call this instance makes to its peers and to the controller, over one session; and
``PairHalves``: the other halves of this instance's PD pairs, asked about through it.

Continuations (``continuation.py``), the release of PD pairs' other halves, the orphan checks (``watchdog.py``) and
the lifecycle reports (``events.py``) all go through the client, so keys, timeouts and the
retry-on-a-closed-connection rule (``http_utils.post_fresh``) live in one place.

A PD request has two halves on two instances; when one half moves (a switch, an orphan, a lost transfer) the other
must follow. The prefill side decides which requests move (it alone knows whether their prefill began), so none is
prefilled twice; each side books a record before its half can fail, so no half fails without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Iterable
from urllib.parse import urlsplit

import aiohttp
import orjson

from sglang_prorsa.srt.common.auth import AuthKeys
from sglang_prorsa.srt.common.http_utils import UPSTREAM_KEEPALIVE_S, post_fresh
from sglang_prorsa.srt.common.messages import MigratedRequest, QueuedItem
from sglang_prorsa.srt.engine.peers import Peer, PeerView

logger = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 3600.0  # a continuation streams for as long as the request generates
CONTROL_TIMEOUT_S = 60.0
HELD_ROOMS_TIMEOUT_S = 10.0  # a prefill instance that does not answer within this is treated as lost (watchdog.py)


class ResumeFailed(RuntimeError):
    """A continuation attempt (or the whole continuation) failed; raised here when a peer refuses a stream."""


class PeerClient:
    def __init__(self, keys: AuthKeys = AuthKeys()) -> None:
        self.keys = keys
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S, sock_connect=10),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S))
        return self._session

    async def post_json(self, url: str, payload: Any, timeout_s: float = CONTROL_TIMEOUT_S,
                        generation: bool = False) -> tuple[int, Any]:
        """POST to a peer or the controller, with this deployment's admin key (or its generation key)."""
        auth = self.keys.generation_headers() if generation else self.keys.admin_headers()
        async with self.session().post(url, data=orjson.dumps(payload),
                                       headers={"Content-Type": "application/json", **auth},
                                       timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            raw = await r.read()
            try:
                return r.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return r.status, {"error": raw[:2000].decode(errors="replace")}

    async def fan_out(self, path: str, calls: list[tuple[Peer, dict]]) -> dict[str, dict]:
        """``path`` POSTed to each peer with its body, at once; the answers of those that answered 200, by peer id."""
        results = await asyncio.gather(*(self.post_json(p.url + path, body) for p, body in calls),
                                       return_exceptions=True)
        out: dict[str, dict] = {}
        for (peer, _), r in zip(calls, results):
            if isinstance(r, BaseException) or r[0] != 200:
                logger.warning("%s on %s failed: %s", path, peer.instance_id, r)
                continue
            out[peer.instance_id] = r[1]
        return out

    # -- the halves of a continuation ---------------------------------------------------------------------------------
    async def post_raw(self, url: str, raw: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        async with await post_fresh(self.session(), url, data=raw,
                                    headers={**headers, **self.keys.generation_headers()}) as r:
            return r.status, await r.read()

    async def stream(self, url: str, raw: bytes, headers: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """POST a streaming /generate and yield each server-sent event's JSON (stops at [DONE])."""
        async with await post_fresh(self.session(), url, data=raw,
                                    headers={**headers, **self.keys.generation_headers()}) as r:
            if r.status != 200:
                body = (await r.read())[:2000].decode(errors="replace")
                raise ResumeFailed(f"{url} answered {r.status}: {body}")
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                yield orjson.loads(payload)

    async def abort_on(self, peers: Iterable[Peer], rid: str) -> None:
        calls = [self.post_json(p.url + "/abort_request", {"rid": rid}, timeout_s=10) for p in peers]
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, BaseException):
                logger.info("abort of %s failed: %s", rid, r)

    async def load_prefix(self, prefill: Peer, tokens: list[int], record: MigratedRequest, rid: str) -> dict:
        """The persisted prefix into ``prefill``'s prefix cache, held there for ``rid``; ``load_status`` says how (a
        load refused for another KV layout answers 200 with ``refused``; one on a DP rank names it in ``dp_rank``)."""
        status, answer = await self.post_json(prefill.url + "/prorsa/kv/load", {
            "token_ids": tokens, "keys": record.keys, "block_tokens": record.block_tokens, "hold_for_rid": rid,
            "layout": record.layout})
        if status != 200:
            logger.warning("prefix load on %s failed (%s): %s; it will be recomputed", prefill.instance_id, status,
                           answer)
            return {"load_status": status}
        return {"load_status": status, **answer}

    # -- liveness -------------------------------------------------------------------------------------------------
    @staticmethod
    async def refuses_connections(peer: Peer, within_s: float = 0.0) -> bool:
        """Whether ``peer``'s HTTP port refuses connections (it is dead; a slow but live instance still accepts
        them), checked every 0.5 s for ``within_s`` while it still accepts them (a crashed instance's process takes a
        moment to go)."""
        url = urlsplit(peer.url)
        deadline = time.monotonic() + within_s
        while True:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(url.hostname, url.port or 80), 2.0)
            except OSError as e:  # refused, unreachable; a timeout (an OSError too) is a slow instance, not a dead one
                if not isinstance(e, TimeoutError):
                    return True
            else:
                writer.close()
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.5)


class PairHalves:
    """This instance asking its peers about the other halves of its PD pairs (the peer view says where each half's
    partner is; the client carries the calls)."""

    def __init__(self, peers: PeerView, client: PeerClient) -> None:
        self.peers = peers
        self.client = client

    def decode_peers(self) -> list[Peer]:
        return [p for p in self.peers.of_role("decode") if p.status != "dead"]

    def prefill_of(self, item: Any) -> Peer | None:
        """The prefill peer a queued half (or request) bootstrapped with, if this instance knows it."""
        return self.peers.by_bootstrap(item.bootstrap_host, item.bootstrap_port)

    async def release_prefill_halves(self, items: list[QueuedItem],
                                     only_not_started: bool = True) -> dict[str, list[int]]:
        """This (decode) instance gives up requests still waiting for their KV: each prefill peer takes its half off
        (answered as handed on) unless its prefill began; returns the rooms taken, by peer."""
        by_peer: dict[str, tuple[Peer, list[int]]] = {}
        for item in items:
            peer = self.prefill_of(item)
            if peer is None or item.bootstrap_room is None:
                continue
            by_peer.setdefault(peer.instance_id, (peer, []))[1].append(item.bootstrap_room)
        answers = await self.client.fan_out("/prorsa/release", [
            (p, {"rooms": rooms, "only_not_started": only_not_started}) for p, rooms in by_peer.values()])
        return {peer: a.get("rooms", []) for peer, a in answers.items() if a.get("rooms")}

    async def expect_decode_halves(self, rooms: list[int]) -> None:
        """Before this (prefill) instance takes requests off: each decode peer books a record for its half, so the
        half is continued elsewhere however it ends."""
        if rooms:
            await self.client.fan_out("/prorsa/expect", [(p, {"rooms": rooms}) for p in self.decode_peers()])

    async def release_decode_halves(self, rooms: list[int]) -> dict[str, list[int]]:
        """Requests this (prefill) instance handed on: each decode peer takes its half off and continues it."""
        if not rooms:
            return {}
        answers = await self.client.fan_out("/prorsa/release", [(p, {"rooms": rooms}) for p in self.decode_peers()])
        return {peer: a.get("rooms", []) for peer, a in answers.items() if a.get("rooms")}

    async def held_by_decodes(self, rooms: list[int]) -> set[int] | None:
        """The rooms some decode peer still holds, or None when one of them did not answer (it may hold them)."""
        asked = self.decode_peers()
        answers = await self.client.fan_out("/prorsa/held_rooms", [(p, {"rooms": rooms}) for p in asked])
        if len(answers) < len(asked):
            return None
        return {room for a in answers.values() for room in a.get("held", [])}

    async def held_by_prefill(self, peer: Peer, rooms: list[int]) -> dict[str, Any] | None:
        """What a prefill peer answers about these rooms (``held``, ``stuck``), or None when it does not answer."""
        try:
            status, answer = await self.client.post_json(peer.url + "/prorsa/held_rooms", {"rooms": rooms},
                                                         timeout_s=HELD_ROOMS_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            return None
        return answer if status == 200 else None

    async def prefill_gone(self, host: str | None, port: int | None, within_s: float = 0.0) -> bool:
        """Whether the prefill instance at this bootstrap address is dead (``PeerClient.refuses_connections``).
        Unknown addresses are not declared dead."""
        peer = self.peers.by_bootstrap(host, port)
        if peer is None:
            return False
        return await self.client.refuses_connections(peer, within_s)
