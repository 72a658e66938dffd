"""The front's generation path: pick a prefill+decode pair (or one colocated instance) and relay bytes.

No resume logic lives here: a request moved by a switch is continued by the instance that holds it, so the caller
still gets one response through this relay. What routing needs, and nothing more, touches the body: it is parsed
once (to read the prompt size as the target route reads the prompt, the trajectory id and ``stream``), and the
bootstrap fields are spliced into the original bytes, which are forwarded as they came. The bootstrap fields are
always scalars: SGLang gives a batch's prompts rooms ``room + i`` itself, so they can never disagree with the batch
the route sees.

A request whose instance dies before answering is sent once more, to another instance, with the death counted
(``LOST_HEADER``); a second death answers it with ``suspected_poison`` (issue 29): a request that crashes its
scheduler reaches at most one instance after the first. Trajectory affinity: a trajectory's turns go to the prefill
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

from sglang_prorsa.policy.lifecycle.engine_api import TRAJECTORY_ID_FIELD, trajectory_id_of
from sglang_prorsa.srt.common.http_utils import UPSTREAM_KEEPALIVE_S, died_serving, post_fresh
from sglang_prorsa.srt.common.messages import LOST_HEADER, MAX_DEATHS, ROLE_HEADER, ROUTE_HEADER, Code
from sglang_prorsa.srt.common.registry import Instance, Registry

logger = logging.getLogger(__name__)

MAX_AFFINITY = 200_000  # trajectories remembered (LRU)
AFFINITY_SLACK_TOKENS = 2048  # an affine prefill instance is used unless it has this much more queued than the least
AFFINITY_SLACK_RATIO = 1.5
ATTEMPTS = 3  # instances tried for one request (refused connections; deaths are bounded by MAX_DEATHS)
ROOM_BITS = 62  # a random room leaves 2**62 rooms above it for a batch's room + i (request_guard.MAX_ROOM is 2**63)
_BOOTSTRAP_KEYS = (b'"bootstrap_host"', b'"bootstrap_port"', b'"bootstrap_room"', b'"bootstrap_pair_key"')
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
                      "prefill_halves_failed": 0, "suspected_poison": 0}

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
        tid = trajectory(request.url.path, body, request.headers)
        prompt = prompt_tokens(request.url.path, body)
        stream = bool(body.get("stream"))
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        headers["Content-Type"] = "application/json"
        self.stats["requests"] += 1
        tried: set[str] = set()
        deaths = 0
        for _attempt in range(ATTEMPTS):
            if deaths >= MAX_DEATHS:
                return self._poison(deaths)
            if deaths:
                headers[LOST_HEADER] = str(deaths)
            try:
                if self.pd:
                    first, decode = self._pick_first("prefill", tid, tried), self._pick_decode(tried)
                else:
                    first, decode = self._pick_first("null", tid, tried), None
            except NoRoute as e:
                self.stats["failed"] += 1
                return _error(503, Code.NO_INSTANCE, str(e))
            payload = _with_bootstrap(raw, body, first) if decode is not None else raw
            target = decode or first
            try:
                return await self._forward(request.url.path, payload, headers, first, decode, target, prompt, stream)
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                # Nothing reached the caller: the instance refused the connection or died before answering.
                died = died_serving(e)
                deaths += died
                logger.warning("instance %s %s (%s); %s", target.instance_id,
                               "died serving the request" if died else "unreachable", e,
                               "not sent again" if deaths >= MAX_DEATHS else "retrying on another")
                tried.add(target.instance_id)
                self.stats["retried"] += deaths < MAX_DEATHS
        if deaths >= MAX_DEATHS:
            return self._poison(deaths)
        self.stats["failed"] += 1
        return _error(502, Code.UPSTREAM, "no instance answered")

    def _poison(self, deaths: int) -> Response:
        self.stats["failed"] += 1
        self.stats["suspected_poison"] += 1
        return _error(502, Code.SUSPECTED_POISON, f"{deaths} instances died serving this request; it is not sent to "
                                                  "another (a request that crashes its scheduler would crash the next)")

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
            if resp.status == 502 and Code.SUSPECTED_POISON.value.encode() in content[:200]:
                self.stats["suspected_poison"] += 1  # stopped by the instance continuing it (its prefill died)
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


def trajectory(path: str, body: dict, headers: Any) -> str | None:
    """The request's trajectory id, for affinity: ``engine_api.trajectory_id_of`` over the fields the target route
    gives SGLang's ``GenerateReqInput``, so the front and the instance that reports the trajectory read the same id.
    ``/generate`` takes ``session_id``, ``routing_key`` and ``conversation_id`` from the body; SGLang's OpenAI routes
    take ``session_id`` only (their ``routing_key`` is the ``X-SMG-Routing-Key`` header, read as the header)."""
    names = ("session_id",) if path.startswith("/v1/") else ("session_id", "routing_key", "conversation_id")
    fields = {name: body.get(name) for name in (*names, TRAJECTORY_ID_FIELD)}
    if not path.startswith("/v1/"):  # /generate's sampling_params, where a verl-style caller carries the id
        fields["sampling_params"] = body.get("sampling_params")
    return trajectory_id_of(fields, headers)


def prompt_tokens(path: str, body: dict) -> int:
    """Prompt tokens for load accounting, read as the target route reads the prompt: ``/generate`` takes ``text``,
    else ``input_ids``, else ``input_embeds``; ``/v1/completions`` takes ``prompt`` (text, token ids, or lists of
    either); ``/v1/chat/completions`` takes ``messages``. Exact for token ids, ~4 characters a token for text.
    Fields another route would read are ignored (a ``/v1/completions`` body's ``input_ids`` is not its prompt)."""
    if path.endswith("/chat/completions"):
        msgs = body.get("messages")
        return sum(len(str(m.get("content", ""))) // 4 + 4 for m in msgs if isinstance(m, dict)) \
            if isinstance(msgs, list) else 0
    if path.endswith("/completions"):
        return _size(body.get("prompt"))
    for key in ("text", "input_ids", "input_embeds"):
        if body.get(key) is not None:
            return _size(body[key])
    return 0


def _size(prompt: Any) -> int:
    """A prompt's size: a string, a list of token ids, or a batch of either. Malformed values (the instance's to
    refuse with a 4xx) are counted without raising."""
    if isinstance(prompt, str):
        return len(prompt) // 4 + 1
    if not isinstance(prompt, list):
        return 0
    if all(type(t) is int for t in prompt):
        return len(prompt)
    return sum(_size(p) for p in prompt if isinstance(p, (str, list)) and not (
        isinstance(p, list) and p and isinstance(p[0], list)))


def _with_bootstrap(raw: bytes, body: dict, prefill: Instance) -> bytes:
    """The original bytes with the PD bootstrap fields spliced in (re-encoded only if the client sent its own).
    Always one host, port and room: SGLang expands them for a batch (room + i), whatever shape the route reads."""
    fields = {"bootstrap_host": prefill.bootstrap_host, "bootstrap_port": prefill.bootstrap_port,
              "bootstrap_room": random.getrandbits(ROOM_BITS)}
    if any(k in raw for k in _BOOTSTRAP_KEYS):
        return orjson.dumps({**{k: v for k, v in body.items() if k != "bootstrap_pair_key"}, **fields})
    head = orjson.dumps(fields)[:-1]  # '{...' without its closing brace
    rest = raw.lstrip()[1:].lstrip()  # the original object after its opening brace
    return head + b"}" if rest.startswith(b"}") else head + b"," + rest
