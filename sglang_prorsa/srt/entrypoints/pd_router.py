"""PD routing with transparent resume of requests cancelled by a busy switch (paper Appendix C).

Each client request is sent, like SGLang's PD router does, to one prefill and one decode instance at once with a
shared bootstrap room; the front names every attempt (``rid``) so that a switch can say which attempts it cancelled.
When an attempt comes back aborted because its instance was switched, the switch's record holds the tokens generated
so far and the store keys of their KV: the router loads that prefix into the next prefill instance's prefix cache and
continues generation from the tokens already produced, so the caller sees one uninterrupted response. An attempt that
fails for any other reason is answered with that failure; nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sglang_prorsa.srt.entrypoints.instances import EngineInstance, InstancePool, NoInstance
from sglang_prorsa.srt.role_switch.capacity import InstanceStatus, Role
from sglang_prorsa.srt.role_switch.messages import MigratedRequest

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 6
MIGRATION_WAIT_S = 120.0


class RouteError(Exception):
    def __init__(self, status: int, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail


@dataclass
class Resume:
    """What the next attempt continues from."""

    input_ids: list[int]
    generated: list[int] = field(default_factory=list)  # tokens the caller already has from earlier attempts
    record: MigratedRequest | None = None


def _refused(status: int, payload: Any) -> bool:
    """The instance's admission gate said no: it is switching roles (engine_routes.install_admission_gate)."""
    return status == 503 and isinstance(payload, dict) and "switching roles" in str(payload.get("error", ""))


def _is_abort(payload: Any) -> bool:
    """SGLang answers a cancelled request with 200 and an "abort" finish reason (native or OpenAI shape)."""
    if not isinstance(payload, dict):
        return False
    reason = (payload.get("meta_info") or {}).get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        return True
    choices = payload.get("choices")
    return bool(choices) and isinstance(choices[0], dict) and choices[0].get("finish_reason") == "abort"


class PDRouter:
    def __init__(self, pool: InstancePool, tokenizer: Any = None, hooks: Any = None, timeout_s: float = 3600) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.hooks = hooks  # lifecycle / θ^P observers (see adaptive.py); may be None
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.migrations: dict[str, asyncio.Future] = {}
        self.attempts: dict[str, tuple[EngineInstance, EngineInstance]] = {}  # rid -> (prefill, decode) in flight
        self.stats = {"requests": 0, "attempts": 0, "resumed": 0, "restarted": 0, "refused_retries": 0, "failed": 0}

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout,
                                                  connector=aiohttp.TCPConnector(limit=0, force_close=False))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(self, url: str, payload: dict, timeout_s: float | None = None) -> tuple[int, Any]:
        s = await self.session()
        t = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        async with s.post(url, json=payload, timeout=t) as r:
            try:
                body = await r.json(content_type=None)
            except Exception:
                body = {"error": (await r.text())[:2000]}
            return r.status, body

    # -- migration bookkeeping (called by the switch executor) -----------------------------------------------------
    def expect_migrations(self, instance: EngineInstance) -> None:
        """Before an instance is told to migrate out: every attempt in flight there may come back cancelled."""
        loop = asyncio.get_running_loop()
        for rid in list(instance.rids):
            self.migrations.setdefault(rid, loop.create_future())

    def deliver(self, records: list[MigratedRequest]) -> None:
        loop = asyncio.get_running_loop()
        for rec in records:
            fut = self.migrations.setdefault(rec.rid, loop.create_future())
            if not fut.done():
                fut.set_result(rec)

    async def release_partners(self, records: list[MigratedRequest], switched: EngineInstance) -> None:
        """A request cancelled before its KV was complete is still expected by the other half of its pair (a decode
        instance waiting for KV that will never come, or a prefill instance about to send it); cancel it there too,
        so the attempt ends now instead of at that instance's transfer timeout."""
        calls = []
        for rec in records:
            pair = self.attempts.get(rec.rid)
            if rec.kv_tokens > 0 or pair is None:
                continue
            partner = pair[1] if pair[0] is switched else pair[0]
            calls.append(self.post(partner.url + "/abort_request", {"rid": rec.rid}, timeout_s=30))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                logger.warning("abort on the partner instance failed: %s", result)

    def settle(self, instance: EngineInstance) -> None:
        """After a switch: attempts there that were not migrated finished (or failed) on their own."""
        for rid in list(instance.rids):
            fut = self.migrations.get(rid)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def _migration_of(self, rid: str, prefill: EngineInstance, decode: EngineInstance) -> MigratedRequest | None:
        fut = self.migrations.get(rid)
        switching = {InstanceStatus.DRAINING, InstanceStatus.SWITCHING}
        if fut is None and prefill.status not in switching and decode.status not in switching:
            return None
        if fut is None:
            fut = self.migrations.setdefault(rid, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), MIGRATION_WAIT_S)
        except asyncio.TimeoutError:
            return None

    # -- one request --------------------------------------------------------------------------------------------
    async def generate(self, body: dict, trajectory_id: str | None = None) -> dict:
        """``/generate`` for one prompt (``text`` or ``input_ids``); returns SGLang's response shape."""
        self.stats["requests"] += 1
        front_id = uuid.uuid4().hex
        sampling = dict(body.get("sampling_params") or {})
        resume: Resume | None = None
        history: list[dict] = []
        for attempt in range(MAX_ATTEMPTS):
            rid = f"prorsa-{front_id}-{attempt}"
            payload = dict(body, rid=rid)
            if resume is not None:
                payload.pop("text", None)
                payload["input_ids"] = resume.input_ids
                payload["sampling_params"] = self._remaining(sampling, len(resume.generated))
                if payload["sampling_params"].get("max_new_tokens") == 0:
                    return self._assemble(None, resume, body, history)
            try:
                prefill, decode = self.pool.pick(Role.PREFILL), self.pool.pick(Role.DECODE)
            except NoInstance as e:
                self.stats["failed"] += 1
                raise RouteError(503, str(e)) from None
            if resume is not None and resume.record is not None and resume.record.kv_tokens > 0:
                history.append(await self._load_prefix(prefill, resume.record))
            status, answer, refused = await self._dispatch(rid, payload, prefill, decode, trajectory_id)
            if refused:  # picked just before the instance left the pool: nothing ran, try another pair
                self.migrations.pop(rid, None)
                self.stats["refused_retries"] += 1
                continue
            if status == 200 and not _is_abort(answer):
                if history:
                    history[-1]["cached_tokens"] = answer.get("meta_info", {}).get("cached_tokens")
                return self._assemble(answer, resume, body, history)
            record = await self._migration_of(rid, prefill, decode)
            self.migrations.pop(rid, None)
            if record is None:
                self.stats["failed"] += 1
                logger.warning("attempt %s on %s+%s failed (%s): %s", rid, prefill.instance_id, decode.instance_id,
                               status, str(answer)[:500])
                raise RouteError(status if status >= 400 else 502, "generation failed", answer)
            generated = (resume.generated if resume else []) + record.output_ids
            base = record.input_ids if resume is None else resume.input_ids
            resume = Resume(input_ids=list(base) + record.output_ids, generated=generated, record=record)
            if record.kv_tokens > 0:
                self.stats["resumed"] += 1
            else:
                self.stats["restarted"] += 1
            history.append({"from_instance": decode.instance_id if record.stage != "queued" else prefill.instance_id,
                            "rid": rid, "stage": record.stage, "kv_tokens": record.kv_tokens,
                            "tokens_kept": len(record.output_ids)})
        self.stats["failed"] += 1
        raise RouteError(503, f"request was moved {MAX_ATTEMPTS} times without finishing")

    async def passthrough(self, path: str, body: dict, trajectory_id: str | None = None) -> dict:
        """OpenAI-style endpoints: routed as they are. A request cancelled by a switch is sent again from its prompt
        (resuming from kept tokens is done for ``/generate``, whose answers carry token ids)."""
        self.stats["requests"] += 1
        front_id = uuid.uuid4().hex
        for attempt in range(MAX_ATTEMPTS):
            rid = f"prorsa-{front_id}-{attempt}"
            try:
                prefill, decode = self.pool.pick(Role.PREFILL), self.pool.pick(Role.DECODE)
            except NoInstance as e:
                self.stats["failed"] += 1
                raise RouteError(503, str(e)) from None
            status, answer, refused = await self._dispatch(rid, dict(body, rid=rid), prefill, decode, trajectory_id,
                                                           path)
            if refused:
                self.migrations.pop(rid, None)
                self.stats["refused_retries"] += 1
                continue
            if status == 200 and not _is_abort(answer):
                return answer
            record = await self._migration_of(rid, prefill, decode)
            self.migrations.pop(rid, None)
            if record is None:
                self.stats["failed"] += 1
                raise RouteError(status if status >= 400 else 502, "generation failed", answer)
            self.stats["restarted"] += 1
        self.stats["failed"] += 1
        raise RouteError(503, f"request was moved {MAX_ATTEMPTS} times without finishing")

    async def _dispatch(self, rid: str, payload: dict, prefill: EngineInstance, decode: EngineInstance,
                        trajectory_id: str | None, path: str = "/generate") -> tuple[int, Any, bool]:
        """Send one attempt to the pair; returns the decode side's (status, answer) and whether an instance refused
        it because it had started switching (the caller then simply tries another pair)."""
        body = dict(payload, bootstrap_host="127.0.0.1", bootstrap_port=prefill.bootstrap_port,
                    bootstrap_room=random.getrandbits(63))
        body.pop("trajectory_id", None)
        prompt = len(body["input_ids"]) if isinstance(body.get("input_ids"), list) else self._count(body.get("text"))
        for inst in (prefill, decode):
            inst.rids.add(rid)
            inst.inflight_requests += 1
        self.attempts[rid] = (prefill, decode)
        prefill.inflight_prompt_tokens += prompt
        self.stats["attempts"] += 1
        if self.hooks:
            self.hooks.dispatched(trajectory_id, rid, prefill, decode, prompt)
        p_task = asyncio.ensure_future(self._post_checked(prefill.url + path, body, "prefill"))
        d_task = asyncio.ensure_future(self._post_checked(decode.url + path, body, "decode"))
        p_status, p_answer = 0, None
        try:
            pending = {p_task, d_task}
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if p_task in done and p_status == 0:
                    p_status, p_answer = p_task.result()
                    prefill.inflight_prompt_tokens -= prompt
                    prefill.inflight_requests -= 1
                    prefill.rids.discard(rid)
                    ok = p_status == 200 and not _is_abort(p_answer)
                    if self.hooks:
                        self.hooks.prefilled(trajectory_id, rid, prefill, ok)
                    if not ok and d_task in pending:
                        await self._abort(decode, rid)  # the KV it waits for will never come
                if d_task in done:
                    d_status, d_answer = d_task.result()
                    if (d_status != 200 or _is_abort(d_answer)) and p_task in pending:
                        await self._abort(prefill, rid)  # nobody will take its KV
        finally:
            if p_status == 0:
                prefill.inflight_prompt_tokens -= prompt
                prefill.inflight_requests -= 1
                prefill.rids.discard(rid)
            decode.inflight_requests -= 1
            decode.rids.discard(rid)
            self.attempts.pop(rid, None)
        if self.hooks:
            self.hooks.decoded(trajectory_id, rid, d_status == 200 and not _is_abort(d_answer))
        refused = _refused(p_status, p_answer) or _refused(d_status, d_answer)
        # The decode instance's answer is the request's answer; a prefill failure shows up there as a failed transfer.
        return d_status, d_answer, refused

    async def _post_checked(self, url: str, body: dict, side: str) -> tuple[int, Any]:
        try:
            return await self.post(url, body)
        except aiohttp.ClientError as e:
            return 502, {"error": f"{side} instance unreachable: {e}"}

    async def _abort(self, instance: EngineInstance, rid: str) -> None:
        try:
            await self.post(instance.url + "/abort_request", {"rid": rid}, timeout_s=30)
        except Exception as e:  # the attempt still ends, at that instance's own timeout
            logger.warning("abort of %s on %s failed: %s", rid, instance.instance_id, e)

    async def _load_prefix(self, prefill: EngineInstance, record: MigratedRequest) -> dict:
        tokens = (record.input_ids + record.output_ids)[: record.kv_tokens]
        status, answer = await self.post(prefill.url + "/prorsa/kv/load", {
            "token_ids": tokens, "keys": record.keys, "block_tokens": record.block_tokens})
        info = {"to_instance": prefill.instance_id, "load_status": status}
        if status == 200:
            info.update(answer)
        else:
            logger.warning("prefix load on %s failed (%s): %s; the prefix will be recomputed",
                           prefill.instance_id, status, answer)
        return info

    # -- helpers ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _remaining(sampling: dict, generated: int) -> dict:
        out = dict(sampling)
        if out.get("max_new_tokens") is not None:
            out["max_new_tokens"] = max(0, int(out["max_new_tokens"]) - generated)
        if out.get("min_new_tokens"):
            out["min_new_tokens"] = max(0, int(out["min_new_tokens"]) - generated)
        return out

    def _count(self, text: Any) -> int:
        if not isinstance(text, str):
            return 0
        if self.tokenizer is None:
            return max(1, len(text) // 4)
        return len(self.tokenizer(text)["input_ids"])

    def _assemble(self, answer: dict | None, resume: Resume | None, body: dict, history: list[dict]) -> dict:
        if resume is None:
            return answer  # untouched by any switch: exactly what the decode instance said
        answer = dict(answer or {"meta_info": {"finish_reason": {"type": "length"}}})
        new_ids = list(answer.get("output_ids") or [])
        output_ids = resume.generated + new_ids
        answer["output_ids"] = output_ids
        if self.tokenizer is not None:
            skip = (body.get("sampling_params") or {}).get("skip_special_tokens", True)
            answer["text"] = self.tokenizer.decode(output_ids, skip_special_tokens=skip)
        meta = dict(answer.get("meta_info") or {})
        prompt = len(body["input_ids"]) if isinstance(body.get("input_ids"), list) else self._count(body.get("text"))
        meta.update({"prompt_tokens": prompt, "completion_tokens": len(output_ids),
                     "prorsa": {"migrations": history}})
        answer["meta_info"] = meta
        return answer
