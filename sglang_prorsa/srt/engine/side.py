"""``EngineSide``: the one object of the engine extension in an instance's main process.

It owns the channel to the scheduler, the book of records the scheduler pushes, this instance's view of its peers,
the switch in progress (if any), and the HTTP session used to continue requests elsewhere. SGLang's tokenizer
manager calls into it through the wrappers in ``hooks.py``.
"""

from __future__ import annotations

import asyncio
import time
import collections
import logging
from typing import Any, AsyncIterator, Iterable

import aiohttp
import orjson

from sglang_prorsa.config import InstanceSpec
from sglang_prorsa.srt.common.auth import AuthKeys
from sglang_prorsa.srt.common.channel import EngineChannel
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.continuation import (Continuation, ResumeFailed, SuspectedPoison, handed_on_output,
                                                   kept_from)
from sglang_prorsa.srt.engine.events import EngineEvents
from sglang_prorsa.srt.engine.peers import Peer, PeerView
from sglang_prorsa.srt.engine.stitch import Shape, Stitcher
from sglang_prorsa.srt.common.http_utils import UPSTREAM_KEEPALIVE_S, post_fresh
from sglang_prorsa.srt.common.messages import (
    RESUME_HEADER,
    Code,
    ForgetPrefill,
    Inventory,
    MigratedRequest,
    QueuedItem,
    ReleaseRooms,
    Stage,
)

logger = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 3600.0  # a continuation streams for as long as the request generates
CONTROL_TIMEOUT_S = 60.0


class EngineSide:
    def __init__(self, spec: InstanceSpec, channel: EngineChannel, tokenizer_manager: Any,
                 keys: AuthKeys = AuthKeys()) -> None:
        self.spec = spec
        self.keys = keys
        self.instance_id = spec.instance_id
        self.channel = channel
        self.tm = tokenizer_manager
        self.book = RecordBook(drain=channel.drain)
        self.peers = PeerView(spec.instance_id)
        self.events = EngineEvents(spec.controller_url, self)
        self.admitting = True  # False: single requests are handed on at arrival (a switch, or POST /prorsa/admission)
        self.rebuilding = False
        self._rebuilt = asyncio.Event()
        self._rebuilt.set()
        self.user_aborts = 0  # pause_generation(mode=abort) and abort-all calls seen (control_guard, middleware)
        self.entering = 0  # generation requests inside the tokenizer manager, not yet handed to the scheduler
        self.ops_lock = asyncio.Lock()  # a busy switch and SGLang's control operations never interleave here
        self.held: set[str] = set()  # control states that hold switches (generation paused, memory released)
        self.switch = None  # the SwitchJob in progress
        self.switches = 0
        self.last_switch: dict[str, Any] | None = None
        self.counters: collections.Counter[str] = collections.Counter()
        self.resuming = 0
        self.orphan_suspects: set[int] = set()  # rooms the last orphan check found unheld (watchdog.py)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        from sglang_prorsa.srt.engine.watchdog import watch_orphans

        loop = asyncio.get_running_loop()
        self.channel.attach(loop, self.book.put, self.events.decoding)
        self.events.start()
        self._watchdog = loop.create_task(watch_orphans(self))

    @property
    def role(self) -> str:
        return str(self.tm.disaggregation_mode.value).lower()

    # -- HTTP to peers --------------------------------------------------------------------------------------------
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
        status, answer = await self.post_json(prefill.url + "/prorsa/kv/load", {
            "token_ids": tokens, "keys": record.keys, "block_tokens": record.block_tokens, "hold_for_rid": rid})
        if status != 200:
            logger.warning("prefix load on %s failed (%s): %s; it will be recomputed", prefill.instance_id, status,
                           answer)
            return {"load_status": status}
        return {"load_status": status, **answer}

    # -- releasing the other halves of PD pairs -----------------------------------------------------------------------
    # The prefill side decides which requests move (it alone knows whether their prefill began), so none is
    # prefilled twice; each side books a record before its half can fail, so no half fails without one.
    async def release_prefill_halves(self, items: list[QueuedItem],
                                     only_not_started: bool = True) -> dict[str, list[int]]:
        """This (decode) instance gives up requests still waiting for their KV: each prefill peer takes its half off
        (answered as handed on) unless its prefill began; returns the rooms taken, by peer."""
        by_peer: dict[str, tuple[Peer, list[int]]] = {}
        for item in items:
            peer = self.peers.by_bootstrap(item.bootstrap_host, item.bootstrap_port)
            if peer is None or item.bootstrap_room is None:
                continue
            by_peer.setdefault(peer.instance_id, (peer, []))[1].append(item.bootstrap_room)
        answers = await self._fan_out("/prorsa/release", [(p, {"rooms": rooms, "only_not_started": only_not_started})
                                                          for p, rooms in by_peer.values()])
        return {peer: a.get("rooms", []) for peer, a in answers.items() if a.get("rooms")}

    async def expect_decode_halves(self, rooms: list[int]) -> None:
        """Before this (prefill) instance takes requests off: each decode peer books a record for its half, so the
        half is continued elsewhere however it ends."""
        if rooms:
            await self._fan_out("/prorsa/expect", [(p, {"rooms": rooms}) for p in self.decode_peers()])

    async def release_decode_halves(self, rooms: list[int]) -> dict[str, list[int]]:
        """Requests this (prefill) instance handed on: each decode peer takes its half off and continues it."""
        if not rooms:
            return {}
        answers = await self._fan_out("/prorsa/release", [(p, {"rooms": rooms}) for p in self.decode_peers()])
        return {peer: a.get("rooms", []) for peer, a in answers.items() if a.get("rooms")}

    def decode_peers(self) -> list[Peer]:
        return [p for p in self.peers.of_role("decode") if p.status != "dead"]

    async def _fan_out(self, path: str, calls: list[tuple[Peer, dict]]) -> dict[str, dict]:
        results = await asyncio.gather(*(self.post_json(p.url + path, body) for p, body in calls),
                                       return_exceptions=True)
        out: dict[str, dict] = {}
        for (peer, _), r in zip(calls, results):
            if isinstance(r, BaseException) or r[0] != 200:
                logger.warning("%s on %s failed: %s", path, peer.instance_id, r)
                continue
            out[peer.instance_id] = r[1]
        return out

    async def release_here(self, rooms: list[int], only_not_started: bool = False) -> tuple[list[str], list[int]]:
        res = await self.channel.call(ReleaseRooms(rooms=frozenset(rooms), only_not_started=only_not_started),
                                      timeout_s=CONTROL_TIMEOUT_S)
        self.counters["rooms_released"] += len(res.rooms)
        return res.rids, res.rooms

    async def expect_here(self, rooms: list[int]) -> list[str]:
        """Book records for our queued halves of these rooms (their other half is about to move)."""
        inv = await self.channel.call(Inventory(), timeout_s=CONTROL_TIMEOUT_S)
        wanted = set(rooms)
        items = [q for q in inv.queued if q.bootstrap_room in wanted]
        self.expect_queued(items, inv.role)
        return [q.rid for q in items]

    async def forget_prefills(self, peers: list[Peer]) -> int:
        """Peers whose role was rebuilt: as a decode instance, drop what SGLang cached about them as prefills."""
        addresses = frozenset((p.bootstrap_host, p.bootstrap_port) for p in peers if p.bootstrap_port)
        if not addresses or self.role != "decode":
            return 0
        return await self.channel.call(ForgetPrefill(addresses=addresses), timeout_s=CONTROL_TIMEOUT_S)

    def expect_queued(self, items: list[QueuedItem], role: str) -> None:
        """Records for queued requests about to lose their other half (see ``SwitchJob.sweep``)."""
        for item in items:
            self.book.put(MigratedRequest(rid=item.rid, role=role, stage=Stage.QUEUED, input_ids=list(item.input_ids),
                                          output_ids=[], sampling_params={}, bootstrap_room=item.bootstrap_room,
                                          bootstrap_host=item.bootstrap_host, bootstrap_port=item.bootstrap_port))

    # -- continuing requests --------------------------------------------------------------------------------------
    def decoder(self, obj: Any, prompt_ids: list[int]):
        """Output text as SGLang's detokenizer makes it: decoded after the prompt's last few tokens, so a character
        whose bytes straddle the prompt and the output is not emitted as a replacement character."""
        from sglang.srt.managers.schedule_batch import INIT_INCREMENTAL_DETOKENIZATION_OFFSET

        sp = obj.sampling_params or {}
        skip = sp.get("skip_special_tokens", True)
        spaces = sp.get("spaces_between_special_tokens", True)
        tok = self.tm.tokenizer
        context = list(prompt_ids[-INIT_INCREMENTAL_DETOKENIZATION_OFFSET:])
        before = tok.decode(context, skip_special_tokens=skip, spaces_between_special_tokens=spaces)

        def decode(ids: list[int]) -> str:
            text = tok.decode(context + list(ids), skip_special_tokens=skip, spaces_between_special_tokens=spaces)
            return text[len(before):]

        return decode

    async def resume(self, obj: Any, state: Any, record: MigratedRequest, last_out: dict | None,
                     delivered: tuple[int, int], headers: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Continue ``obj`` (taken off here as ``record``) elsewhere, giving the caller the stitched outputs."""
        if record.role == "prefill":  # the decode half holds the caller and continues it
            self.counters["handed_on"] += 1
            yield handed_on_output(obj.rid, len(record.input_ids), self.weight_version())
            return
        kept = kept_from(record, state, last_out, delivered)
        sp = obj.sampling_params or {}
        stop = sp.get("stop") or []
        stitcher = Stitcher(obj.rid, kept, Shape(bool(obj.stream), bool(self.tm.incremental_streaming_output)),
                            self.decoder(obj, record.input_ids), stop=[stop] if isinstance(stop, str) else list(stop),
                            no_stop_trim=bool(sp.get("no_stop_trim", False)))
        self.counters["resumed" if record.stage is Stage.RUNNING else "restarted"] += 1
        self.resuming += 1
        try:
            async for out in Continuation(self, obj, record, stitcher, headers).run():
                yield out
        except SuspectedPoison as e:
            import fastapi

            raise fastapi.HTTPException(status_code=502, detail=str(e)) from None  # the message leads with the code
        except ResumeFailed as e:
            self.counters["resume_failed"] += 1
            import fastapi

            # SGLang's error handler takes a string detail (a dict made it fail with a 500): the code leads it.
            raise fastapi.HTTPException(status_code=503, detail=f"{Code.RESUME_FAILED.value}: {e}")
        finally:
            self.resuming -= 1

    async def hand_on_at_arrival(self, obj: Any, request: Any, role_header: str | None) -> AsyncIterator[dict]:
        """A single request this instance will not serve (a switch is running, admission is closed, or it was
        meant for the other role): a prefill half is answered as handed on after the decode peers released it; a
        decode half (or a colocated request) is continued elsewhere from its prompt, its prefill half released."""
        half = role_header or self.role
        input_ids = await self.prompt_ids(obj)
        room = obj.bootstrap_room
        if half == "prefill":
            if room is not None:
                await self.release_decode_halves([room])
            self.counters["handed_on"] += 1
            yield handed_on_output(obj.rid, len(input_ids), self.weight_version())
            return
        if room is not None:  # its prefill half answers as handed on (even if it began: we cannot receive its KV)
            await self.release_prefill_halves([QueuedItem(obj.rid, room, obj.bootstrap_host, obj.bootstrap_port)],
                                              only_not_started=False)
        if request is not None and request.headers.get(RESUME_HEADER) is not None:
            # A continuation: its holder knows the persisted KV and retries elsewhere, loading it (aborts.HandedBack).
            self.counters["continuations_handed_back"] += 1
            raise ValueError(f"prorsa: continuation {obj.rid} handed back to its holder ({Code.HANDED_ON.value})")
        record = MigratedRequest(rid=obj.rid, role="decode", stage=Stage.QUEUED, input_ids=input_ids,
                                 output_ids=[], sampling_params={}, bootstrap_room=room,
                                 bootstrap_host=obj.bootstrap_host, bootstrap_port=obj.bootstrap_port)
        state = _NoState(obj)
        async for out in self.resume(obj, state, record, None, (0, 0), forwarded_headers(request)):
            yield out

    def weight_version(self) -> str:
        """The weight version this instance serves, as SGLang reports it in each answer's meta."""
        return str(self.tm.config_value("weight_version")) if self.tm is not None else "default"

    async def prefill_gone(self, host: str | None, port: int | None, within_s: float = 0.0) -> bool:
        """Whether the prefill instance at this bootstrap address is dead: its HTTP port refuses connections (a
        slow but live instance still accepts them), checked every 0.5 s for ``within_s`` while it still accepts
        them (a crashed instance's process takes a moment to go). Unknown addresses are not declared dead."""
        from urllib.parse import urlsplit

        peer = self.peers.by_bootstrap(host, port)
        if peer is None:
            return False
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

    async def queued_record(self, obj: Any) -> MigratedRequest:
        """A decode half that never received its KV, as a record to start again from its prompt."""
        return MigratedRequest(rid=obj.rid, role="decode", stage=Stage.QUEUED, input_ids=await self.prompt_ids(obj),
                               output_ids=[], sampling_params={}, bootstrap_room=obj.bootstrap_room,
                               bootstrap_host=obj.bootstrap_host, bootstrap_port=obj.bootstrap_port)

    async def prompt_ids(self, obj: Any) -> list[int]:
        """The request's prompt as token ids, as SGLang tokenizes it -- without SGLang's per-request state, which
        does not exist yet at arrival and is already deleted after an abort that carries a status. A text prompt's
        ids are those SGLang's tokenization kept on the request (hooks.wrap_tokenize_one_request); tokenized here
        only for a request that never went through it."""
        if obj.input_ids is not None:
            return list(obj.input_ids)
        kept = kept_prompt_ids(obj)
        if kept is not None:
            return list(kept)
        ids, _ = await self.tm._tokenize_texts(obj.text)
        return list(ids)

    async def rebuilt(self) -> None:
        await self._rebuilt.wait()

    def set_rebuilding(self, on: bool) -> None:
        self.rebuilding = on
        (self._rebuilt.clear if on else self._rebuilt.set)()

    def status(self) -> dict[str, Any]:
        return {"admitting": self.admitting, "rebuilding": self.rebuilding, "switching": self.switch is not None,
                "held_by": sorted(self.held),
                "switches": self.switches, "last_switch": self.last_switch, "resuming": self.resuming,
                "entering": self.entering, "records_waiting": len(self.book), "engine_counters": dict(self.counters),
                "peers_version": self.peers.version}


_PROMPT_IDS = "_prorsa_prompt_ids"  # on SGLang's request object: its text prompt as SGLang tokenized it


def keep_prompt_ids(obj: Any, tokenized: Any) -> None:
    """Keeps SGLang's own ids of a text prompt on the request object (a reference, not a copy)."""
    if getattr(obj, "input_ids", None) is None and getattr(tokenized, "input_ids", None) is not None:
        setattr(obj, _PROMPT_IDS, tokenized.input_ids)


def kept_prompt_ids(obj: Any) -> list[int] | None:
    return getattr(obj, _PROMPT_IDS, None)


class _NoState:
    """The tokenizer manager's state of a request that never reached the scheduler here."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj


_FORWARDED = ("x-trajectory-id", "x-smg-routing-key")


def forwarded_headers(request: Any) -> dict[str, str]:
    if request is None:
        return {}
    return {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}

