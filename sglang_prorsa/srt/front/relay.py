"""The front's generation path: pick a prefill+decode pair (or one colocated instance) and relay bytes.

No resume logic lives here: a request moved by a switch is continued by the instance that holds it, so the caller
still gets one response through this relay. What routing needs, and nothing more, touches the body: it is parsed
once (to read the prompt size, the trajectory id and ``stream``), and the bootstrap fields are spliced into the
original bytes, which are forwarded as they came. Trajectory affinity: a trajectory's turns go to the prefill
instance that served its previous turn (its prefix is cached there) unless that instance is much busier.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from typing import Any

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sglang_prorsa.srt.controller.registry import Instance, Registry
from sglang_prorsa.srt.http_utils import UPSTREAM_KEEPALIVE_S, post_fresh
from sglang_prorsa.srt.messages import ROLE_HEADER, ROUTE_HEADER
from sglang_prorsa.srt.lifecycle.events import MAX_ID_CHARS
from sglang_prorsa.srt.messages import Code

logger = logging.getLogger(__name__)

MAX_AFFINITY = 200_000  # trajectories remembered (LRU)
AFFINITY_SLACK_TOKENS = 2048  # an affine prefill instance is used unless it has this much more queued than the least
AFFINITY_SLACK_RATIO = 1.5
_BOOTSTRAP_KEYS = (b'"bootstrap_host"', b'"bootstrap_port"', b'"bootstrap_room"')
_FORWARD_HEADERS = ("x-trajectory-id", "x-smg-routing-key", "authorization", "x-api-key")


class NoRoute(Exception):
    pass


class Relay:
    def __init__(self, registry: Registry, pd: bool) -> None:
        self.registry = registry
        self.pd = pd
        self.affinity: OrderedDict[str, str] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None
        self.stats = {"requests": 0, "retried": 0, "failed": 0, "affinity_hits": 0, "streams_broken": 0,
                      "prefill_halves_failed": 0}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S),
                auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # -- picking --------------------------------------------------------------------------------------------------
    def _pick_first(self, role: str, tid: str | None, exclude: set[str]) -> Instance:
        cands = [i for i in self.registry.routable(role) if i.instance_id not in exclude]
        if not cands:
            raise NoRoute(f"no routable {role} instance")
        best = min(cands, key=lambda i: (i.inflight_prompt_tokens, i.inflight, i.instance_id))
        if tid is not None:
            aff = self.registry.instances.get(self.affinity.get(tid, ""))
            if aff is not None and aff in cands and aff.inflight_prompt_tokens <= (
                    best.inflight_prompt_tokens * AFFINITY_SLACK_RATIO + AFFINITY_SLACK_TOKENS):
                self.stats["affinity_hits"] += 1
                best = aff
            self.affinity[tid] = best.instance_id
            self.affinity.move_to_end(tid)
            if len(self.affinity) > MAX_AFFINITY:
                self.affinity.popitem(last=False)
        return best

    def _pick_decode(self, exclude: set[str]) -> Instance:
        cands = [i for i in self.registry.routable("decode") if i.instance_id not in exclude]
        if not cands:
            raise NoRoute("no routable decode instance")
        return min(cands, key=lambda i: (i.inflight, i.kv_footprint_tokens, i.instance_id))

    # -- relaying -------------------------------------------------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            return _error(400, Code.INVALID, f"field 'body': malformed JSON ({e})", "body")
        if not isinstance(body, dict):
            return _error(400, Code.INVALID, "field 'body': must be a JSON object", "body")
        tid = _trajectory(body, request)
        prompt = _prompt_size(body)
        batch = _batch_size(body)
        stream = bool(body.get("stream"))
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        headers["Content-Type"] = "application/json"
        self.stats["requests"] += 1
        tried: set[str] = set()
        for attempt in range(3):
            try:
                if self.pd:
                    first, decode = self._pick_first("prefill", tid, tried), self._pick_decode(tried)
                else:
                    first, decode = self._pick_first("null", tid, tried), None
            except NoRoute as e:
                self.stats["failed"] += 1
                return _error(503, Code.NO_INSTANCE, str(e))
            payload = _with_bootstrap(raw, body, first, batch) if decode is not None else raw
            target = decode or first
            try:
                return await self._forward(request.url.path, payload, headers, first, decode, target, prompt, stream)
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                # Nothing reached the caller: the instance refused the connection or died before answering.
                logger.warning("instance %s unreachable (%s); retrying on another", target.instance_id, e)
                tried.add(target.instance_id)
                self.stats["retried"] += 1
        self.stats["failed"] += 1
        return _error(502, Code.UPSTREAM, "no instance answered")

    async def _forward(self, path: str, payload: bytes, headers: dict[str, str], first: Instance,
                       decode: Instance | None, target: Instance, prompt: int, stream: bool) -> Response:
        session = self.session()
        prefill_task = None
        if decode is not None:
            prefill_task = asyncio.ensure_future(self._prefill_half(session, first, path, payload, headers, prompt))
            target_headers = {**headers, ROLE_HEADER: "decode"}
        else:
            target_headers = headers
            first.inflight_prompt_tokens += prompt
        target.inflight += 1
        try:
            resp = await post_fresh(session, target.url + path, data=payload, headers=target_headers)
        except BaseException:
            target.inflight -= 1
            if decode is None:
                first.inflight_prompt_tokens -= prompt
            if prefill_task is not None:
                prefill_task.cancel()
            raise
        media = resp.headers.get("Content-Type", "application/json")
        route = {ROUTE_HEADER: f"{first.instance_id}/{decode.instance_id}" if decode is not None else first.instance_id}
        if not stream or resp.status != 200:
            try:
                content = await resp.read()
            except aiohttp.ClientPayloadError as e:  # the instance died mid-answer: nothing reached the caller
                raise aiohttp.ServerDisconnectedError(str(e)) from e
            finally:
                resp.release()
                self._done(target, decode, first, prompt)
            return Response(content, status_code=resp.status, media_type=media, headers=route)

        async def relay():
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                # The instance holding this stream died after part of it was sent: say so, explicitly.
                self.stats["streams_broken"] += 1
                yield b"data: " + orjson.dumps({"error": {"message": f"instance {target.instance_id} lost: {e}",
                                                          "code": Code.UPSTREAM.value}}) + b"\n\n"
            finally:
                resp.release()
                self._done(target, decode, first, prompt)

        return StreamingResponse(relay(), status_code=resp.status, media_type=media, headers=route)

    def _done(self, target: Instance, decode: Instance | None, first: Instance, prompt: int) -> None:
        target.inflight -= 1
        if decode is None:
            first.inflight_prompt_tokens -= prompt

    async def _prefill_half(self, session: aiohttp.ClientSession, prefill: Instance, path: str, payload: bytes,
                            headers: dict[str, str], prompt: int) -> None:
        prefill.inflight += 1
        prefill.inflight_prompt_tokens += prompt
        try:
            async with await post_fresh(session, prefill.url + path, data=payload,
                                        headers={**headers, ROLE_HEADER: "prefill"}) as r:
                body = await r.read()  # the decode half carries the answer; this one only has to be drained
                if r.status != 200:
                    # Abnormal (a half handed on answers 200): its decode half may now wait for KV that will not
                    # come, until the orphan check or SGLang's transfer timeout. Said, so the wait can be traced.
                    self.stats["prefill_halves_failed"] += 1
                    logger.warning("prefill half on %s answered %d: %s", prefill.instance_id, r.status,
                                   body[:300].decode(errors="replace"))
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            # Its decode half then waits for KV until SGLang's own timeout: worth a warning.
            logger.warning("prefill half on %s failed: %s", prefill.instance_id, e)
        finally:
            prefill.inflight -= 1
            prefill.inflight_prompt_tokens -= prompt


def _error(status: int, code: Code, message: str, field: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message, "code": code.value}
    if field:
        body["field"] = field
    return JSONResponse(body, status_code=status)


def _trajectory(body: dict, request: Request) -> str | None:
    value = body.get("trajectory_id")
    if not isinstance(value, str) or not value:
        value = request.headers.get("x-trajectory-id") or request.headers.get("x-smg-routing-key")
    return value if value and len(value) <= MAX_ID_CHARS else None


def _batch_size(body: dict) -> int | None:
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    sp = body.get("sampling_params")
    if isinstance(sp, dict) and isinstance(sp.get("n"), int) and sp["n"] > 1:
        return None  # SGLang expands n samples itself under one room
    return None


def _prompt_size(body: dict) -> int:
    """Prompt tokens for load accounting: exact for token ids, ~4 characters a token otherwise."""
    ids = body.get("input_ids")
    if isinstance(ids, list):
        # A malformed batch ([[1], None], [[1], 2.5]) is SGLang's to refuse with a 4xx; counting must not raise.
        return sum(len(x) for x in ids if isinstance(x, list)) if ids and isinstance(ids[0], list) else len(ids)
    for key in ("text", "prompt"):
        v = body.get(key)
        if isinstance(v, str):
            return len(v) // 4 + 1
        if isinstance(v, list):
            return sum(len(x) // 4 + 1 if isinstance(x, str) else len(x) for x in v if isinstance(x, (str, list)))
    msgs = body.get("messages")
    if isinstance(msgs, list):
        return sum(len(str(m.get("content", ""))) // 4 + 4 for m in msgs if isinstance(m, dict))
    return 0


def _with_bootstrap(raw: bytes, body: dict, prefill: Instance, batch: int | None) -> bytes:
    """The original bytes with the PD bootstrap fields spliced in (re-encoded only if the client sent its own)."""
    if batch is None:
        fields = {"bootstrap_host": prefill.bootstrap_host, "bootstrap_port": prefill.bootstrap_port,
                  "bootstrap_room": random.getrandbits(63)}
    else:
        fields = {"bootstrap_host": [prefill.bootstrap_host] * batch,
                  "bootstrap_port": [prefill.bootstrap_port] * batch,
                  "bootstrap_room": [random.getrandbits(63) for _ in range(batch)]}
    if any(k in raw for k in _BOOTSTRAP_KEYS):
        return orjson.dumps({**body, **fields})
    head = orjson.dumps(fields)[:-1]  # '{...' without its closing brace
    rest = raw.lstrip()[1:].lstrip()  # the original object after its opening brace
    return head + b"}" if rest.startswith(b"}") else head + b"," + rest
