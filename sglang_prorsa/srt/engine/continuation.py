"""Continue one request on another prefill+decode pair, from the tokens it already has (paper Appendix C).

Runs in the instance that holds the request's caller (its tokenizer manager), so the caller -- an HTTP client, a
router, an OpenAI-style route, or an in-process ``generate_request`` -- sees one response. Steps:

1. pick a pair from this instance's peer view;
2. load the persisted prefix into the prefill instance's prefix cache (``/prorsa/kv/load``, held until the request
   arrives there), so at most one page is computed again. A prefill instance of another parallel KV layout (TP size,
   dtype, heads) refuses the load (``"layout_refused"`` in the move) and the prefix is recomputed there; one with
   data parallelism loads it on one DP rank, and the prefill half is routed to that rank (``routed_dp_rank``);
3. send both halves with ``input_ids`` = prompt + tokens so far and the remaining budget, the decode half streaming;
4. stitch each output onto what the caller has (``stitch.py``) and pass it on.

If the continuation fails (its instance died, refused, or answered an error), the request is sent again from the
tokens it has by then on another pair, loading the persisted prefix there again (the tokens produced since are
recomputed); a prefix that fails to load is tried on another pair (``LOAD_RETRIES``) before it is recomputed. A
continuation that is itself moved by a switch is continued by the instance holding it, so this one just keeps reading
its stream.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import uuid
from typing import Any, AsyncIterator, Callable

import aiohttp
import orjson

from sglang_prorsa.srt.common.http_utils import died_serving
from sglang_prorsa.srt.common.messages import (
    LAYOUT_REFUSED,
    LOST_HEADER,
    MAX_DEATHS,
    RESUME_HEADER,
    ROLE_HEADER,
    Code,
    MigratedRequest,
)
from sglang_prorsa.srt.engine import aborts, routed_experts
from sglang_prorsa.srt.engine.peer_client import PeerClient, ResumeFailed
from sglang_prorsa.srt.engine.peers import NoPair, Peer, PeerView
from sglang_prorsa.srt.engine.stitch import Kept, Stitcher

logger = logging.getLogger(__name__)

MAX_MOVES = 16  # hand-backs under fast switching count as moves too
# A persisted prefix that failed to load on the chosen prefill instance (it was switching, or its scheduler did not
# answer in time) is tried on another pair this many times before the attempt recomputes it: recomputing a prefix
# the store holds is the duplicated work a busy switch must not cause.
LOAD_RETRIES = 2
# How long a request waits, in all, for an active prefill+decode pair to continue on. Waiting is not a move: a switch
# (or a restart after a crash) brings a role back within seconds, and a request failed meanwhile is work lost for
# an RL step. Only past this does the caller get an explicit error.
NO_PAIR_WAIT_S = 120.0
# Request fields a continuation carries over from the original (others are set here or meaningless for it). The
# continuation's prompt is the original prompt plus the tokens kept, so ``routed_experts_start_len`` (an absolute
# position) means the same there. ``session_id`` is not carried: with SGLang's session radix cache it would join a
# session on the new instance; ``routing_key`` and ``conversation_id`` only label the request.
CARRIED_FIELDS = ("return_logprob", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs", "lora_path",
            "custom_logit_processor", "return_hidden_states", "priority", "return_routed_experts",
            "routed_experts_start_len", "routing_key", "conversation_id")


class SuspectedPoison(ResumeFailed):
    """``MAX_DEATHS`` instances died serving this request: it is answered with ``Code.SUSPECTED_POISON``, not sent to
    another pair (issue 29: a request that crashes its scheduler would take down every pair it is continued on)."""


def continuation_rid() -> str:
    # Fixed length and never a prefix of another id: SGLang's abort matches rids by prefix.
    return "prorsa-" + uuid.uuid4().hex


def remaining_sampling(original: dict[str, Any], record: MigratedRequest, produced: int) -> dict[str, Any]:
    """The caller's sampling parameters with the budget left after ``produced`` tokens."""
    out = dict(original or {})
    budget = record.sampling_params.get("max_new_tokens")
    if budget is not None:  # the scheduler's own remaining budget when the record was made
        budget += len(record.output_ids)
    elif out.get("max_new_tokens") is not None:
        budget = int(out["max_new_tokens"])
    if budget is not None:
        out["max_new_tokens"] = max(0, budget - produced)
    if out.get("min_new_tokens"):
        out["min_new_tokens"] = max(0, int(out["min_new_tokens"]) - produced)
    return out


class Continuation:
    """One request continued elsewhere: pairs from ``peers`` (whose in-flight counts it keeps), every call to them
    through ``client``; ``holder`` is this instance's id (reported in each move)."""

    def __init__(self, obj: Any, record: MigratedRequest, stitcher: Stitcher, headers: dict[str, str], *,
                 peers: PeerView, client: PeerClient, counters: collections.Counter[str], holder: str,
                 aborted: Callable[[], bool] = lambda: False,
                 decode_here: Callable[[], bool] = lambda: False) -> None:
        self.peers = peers
        # Whether this instance serves decode now (its role, admission open, no switch): a request it took off for a
        # reason other than its own switch (a KV transfer its prefill half's instance failed) may continue here when
        # no other decode instance is active, rather than wait for one that a small deployment may not have.
        self.decode_here = decode_here
        # The trainer aborted every request of the holder (abort_all, pause in abort mode) after this began: its
        # abort can reach the prefill instance first and fail the transfer that made this continuation, then reach
        # the holder while the continuation waits for a pair. Checked before each move: answered as aborted.
        self.aborted = aborted
        self.client = client
        self.counters = counters
        self.holder = holder
        self.obj = obj
        self.record = record
        self.stitcher = stitcher
        self.headers = headers
        # Every attempt loads the persisted prefix into its prefill instance again: an attempt whose prefill half was
        # handed on (its prefill instance switched before scheduling it) must not recompute what the store holds.
        self.kv_tokens = record.kv_tokens
        self.moves = 0
        self.failed_loads = 0
        self.deaths = record.deaths  # instances that died serving it, this continuation's attempts included

    async def run(self) -> AsyncIterator[dict[str, Any]]:
        failures: list[str] = []
        waited_s, streak = 0.0, 0  # waited for a pair, over all moves; pair-less picks in a row
        avoid: tuple[str, ...] = ()  # the prefill and decode instances the last attempt failed on
        while self.moves < MAX_MOVES:
            if self.aborted():
                self.counters["continuations_aborted"] += 1
                yield self.stitcher.final_without_continuation(
                    {"type": "abort", "message": "aborted by the trainer (abort_request abort_all or "
                                                 "pause_generation abort) while being continued"})
                return
            if self.deaths >= MAX_DEATHS:
                self.counters["suspected_poison"] += 1
                raise SuspectedPoison(f"{Code.SUSPECTED_POISON.value}: request {self.stitcher.rid} was on "
                                      f"{self.deaths} instances that died serving it; not sent to another "
                                      f"({failures[-2:]})")
            produced = len(self.stitcher.ids)
            sampling = remaining_sampling(self.obj.sampling_params, self.record, produced)
            if sampling.get("max_new_tokens") == 0:
                yield self.stitcher.final_without_continuation(
                    {"type": "length", "length": produced})
                return
            try:
                prefill, decode = self._pick(avoid)
            except NoPair as e:
                if waited_s >= NO_PAIR_WAIT_S:
                    failures.append(f"{e} for {waited_s:.0f} s")
                    break
                streak += 1
                pause = min(2.0, 0.1 * 2 ** streak, NO_PAIR_WAIT_S - waited_s)
                failures.append(str(e))
                await asyncio.sleep(pause)  # a switch may be bringing one back
                waited_s += pause
                continue
            streak = 0
            self.moves += 1
            failed_before = len(failures)
            async for out in self._attempt(prefill, decode, sampling, failures):
                yield out
            if self.stitcher.finished:
                return
            self.stitcher.rebase()  # continue from what this attempt produced
            avoid = ()
            if len(failures) > failed_before:  # the pair is switching or gone: let the registry catch up
                avoid = (prefill.instance_id, decode.instance_id)
                await asyncio.sleep(min(1.0, 0.05 * 2 ** len(failures)))
        raise ResumeFailed(f"request {self.stitcher.rid} could not be continued after {self.moves} moves: "
                           f"{failures[-3:]}")

    def _pick(self, avoid: tuple[str, ...]) -> tuple[Peer, Peer]:
        """A pair sharing as little as it can with the one the last attempt failed on (``avoid``: its prefill and
        decode instances): neither, else another prefill instance, else another decode instance, else the same pair.
        A pair that keeps failing (a restarted instance still slow, a transfer path that times out) would otherwise
        take every move while another one is active."""
        prefer, here = self._prompt_holder(), self.decode_here()
        if avoid:
            prefill, decode = avoid
            for exclude in ({prefill, decode}, {prefill}, {decode}):
                try:
                    return self.peers.pick_pair(exclude=exclude, prefer_prefill=prefer, decode_here=here)
                except NoPair:
                    continue
        return self.peers.pick_pair(prefer_prefill=prefer, decode_here=here)

    def _prompt_holder(self) -> Peer | None:
        """A request restarted from its prompt (no KV persisted) goes back to the prefill instance it was paired with
        while that instance still serves as prefill: whatever it computed of the prompt is in its prefix cache."""
        if self.kv_tokens > 0 or self.record.bootstrap_port is None:
            return None
        return self.peers.by_bootstrap(self.record.bootstrap_host, self.record.bootstrap_port)

    async def _attempt(self, prefill: Peer, decode: Peer, sampling: dict[str, Any],
                       failures: list[str]) -> AsyncIterator[dict[str, Any]]:
        client = self.client
        rid = continuation_rid()
        ids = list(self.record.input_ids) + list(self.stitcher.ids)
        move = {"from_instance": self.holder, "rid": rid, "stage": self.record.stage.value,
                "kv_tokens": self.kv_tokens, "tokens_kept": len(self.stitcher.ids),
                "to_prefill": prefill.instance_id, "to_decode": decode.instance_id}
        if self.kv_tokens > 0:  # where its KV is: each rank's keys follow from the tokens, the layout and the rank
            move.update(layout=self.record.layout, block_tokens=self.record.block_tokens)
        self.stitcher.migrations.append(move)
        self.peers.acquire(prefill, decode)
        try:
            if self.kv_tokens > 0:
                move.update(await client.load_prefix(prefill, ids[: self.kv_tokens], self.record, rid))
                if move["load_status"] != 200:
                    self.counters["prefix_loads_failed"] += 1
                    self.failed_loads += 1
                    if self.failed_loads <= LOAD_RETRIES:
                        raise ResumeFailed(f"prefix load on {prefill.instance_id} failed ({move['load_status']}): "
                                           "trying another pair rather than recomputing it")
                if move.get("refused") == LAYOUT_REFUSED:  # another TP size, dtype or head shape: recomputed there
                    move["layout_refused"] = True
                    self.counters["prefix_loads_layout_refused"] += 1
            body = {k: getattr(self.obj, k) for k in CARRIED_FIELDS if getattr(self.obj, k) is not None}  # GenerateReqInput's
            body.update(input_ids=ids, sampling_params=sampling, stream=True, rid=rid,
                        bootstrap_host=prefill.bootstrap_host, bootstrap_port=prefill.bootstrap_port,
                        bootstrap_room=random.getrandbits(63))
            if body.get("return_logprob"):
                body["logprob_start_len"] = -1  # input logprobs were the first attempt's; only new tokens here
            prefill_raw, decode_raw = halves(body, move.get("dp_rank"))
            prefill_task = asyncio.ensure_future(client.post_raw(prefill.url + "/generate", prefill_raw,
                                                                 self._headers("prefill")))
            finished = False
            try:
                async for chunk in client.stream(decode.url + "/generate", decode_raw, self._headers("decode")):
                    if "error" in chunk:
                        raise ResumeFailed(f"decode {decode.instance_id}: {chunk['error']}")
                    meta = chunk.get("meta_info") or {}
                    # Our own abort, which the instance holding it continues and never passes on: not an end but
                    # a move to retry (a trainer's abort carries no such code and ends the request).
                    if aborts.is_final_abort(chunk) and aborts.ours(chunk):
                        raise ResumeFailed(f"decode {decode.instance_id} took the continuation off without "
                                           "continuing it")
                    if "cached_tokens" not in move:  # how much of the resumed prompt was not computed again
                        move["cached_tokens"] = meta.get("cached_tokens")
                    nested = (meta.get("prorsa") or {}).get("migrations")
                    if nested:  # this attempt moved again, continued by its decode instance: its moves are ours
                        move["then"] = nested
                    out = self.stitcher.update(chunk)
                    if out is not None:
                        yield out
                    if self.stitcher.finished:
                        finished = True
                        if self.stitcher.straddle_stop:  # we matched a stop string the continuation cannot see
                            await client.abort_on((decode, prefill), rid)
                        break
            finally:
                if not finished:
                    await client.abort_on((decode, prefill), rid)
                await _settle(prefill_task)
            if not finished:
                raise ResumeFailed(f"decode {decode.instance_id} ended the stream without finishing")
        except (ResumeFailed, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            if Code.SUSPECTED_POISON.value in str(e):  # the attempt's holder stopped it: so does this one
                raise SuspectedPoison(f"{Code.SUSPECTED_POISON.value}: {e}") from e
            if died_serving(e) or aborts.INSTANCE_LOST in str(e):
                self.deaths += 1  # its decode instance died serving it, or handed it back when its prefill died
            failures.append(f"{type(e).__name__}: {e}")
            move["failed"] = str(e)[:300]
            logger.warning("continuation %s of %s on %s+%s failed: %s", rid, self.stitcher.rid,
                           prefill.instance_id, decode.instance_id, e)
            self.counters["resume_attempts_failed"] += 1
        finally:
            self.peers.release(prefill, decode)

    def _headers(self, role: str) -> dict[str, str]:
        return {**self.headers, ROLE_HEADER: role, RESUME_HEADER: "1", LOST_HEADER: str(self.deaths),
                "Content-Type": "application/json"}


def halves(body: dict[str, Any], dp_rank: int | None) -> tuple[bytes, bytes]:
    """The prefill and decode halves' bodies. A prefix loaded on one DP rank of the prefill instance pins the prefill
    half there (SGLang's ``routed_dp_rank``, which its DP controller obeys), and both halves name that rank as the
    prefill's (``disagg_prefill_dp_rank``: the decode half bootstraps with it, and the prefill half then does not
    expect the rank its bootstrap room would imply)."""
    if dp_rank is None:
        raw = orjson.dumps(body)
        return raw, raw
    decode = {**body, "disagg_prefill_dp_rank": dp_rank}
    return orjson.dumps({**decode, "routed_dp_rank": dp_rank}), orjson.dumps(decode)


async def _settle(task: asyncio.Future) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(task), 30)
    except Exception:
        task.cancel()


def handed_on_output(rid: str, prompt_tokens: int, weight_version: str = "default") -> dict[str, Any]:
    """A prefill half whose request moved to another pair: answered, successfully, with nothing to add (the decode
    half holds the caller; a router reading this half only looks for input logprobs). Its meta has every key SGLang's
    OpenAI routes read (a chat answer built from it without ``weight_version`` was a 500)."""
    return {"text": "", "output_ids": [], "meta_info": {"weight_version": weight_version,
        "id": rid, "finish_reason": {"type": "abort", "message": "prorsa: handed on to another pair",
                                     "err_type": Code.HANDED_ON.value},
        "prompt_tokens": prompt_tokens, "completion_tokens": 0, "cached_tokens": 0,
        "input_token_logprobs": [], "output_token_logprobs": [], "prorsa": {"handed_on": True}}}


def aborted_output(rid: str, prompt_tokens: int, message: str, weight_version: str = "default") -> dict[str, Any]:
    """A request aborted by the trainer (``pause_generation`` in abort mode) while it waited for its KV: answered as
    SGLang answers an aborted request on a colocated server (finish reason ``abort``), not as a failed transfer."""
    return {"text": "", "output_ids": [], "meta_info": {"weight_version": weight_version,
        "id": rid, "finish_reason": {"type": "abort", "message": message},
        "prompt_tokens": prompt_tokens, "completion_tokens": 0, "cached_tokens": 0,
        "input_token_logprobs": [], "output_token_logprobs": [], "weight_versions": []}}


def kept_from(record: MigratedRequest, state: Any, last_out: dict[str, Any] | None, delivered: tuple[int, int],
              routed_row_bytes: int = 0) -> Kept:
    """What the continuation keeps: the record's tokens, their logprobs from the tokenizer manager's state, and the
    routed experts the taken-off request's final output reported (``routed_row_bytes``: one position's bytes)."""
    k = len(record.output_ids)
    per_token: dict[str, list] = {}
    meta = (last_out or {}).get("meta_info") or {}
    for key in ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
        values = meta.get(key) if key in meta else getattr(state, key)  # ReqState's (or side._NoState's)
        if values:
            per_token[key] = list(values)[:k]
        elif state.obj.return_logprob and key == "output_token_logprobs":
            per_token[key] = []
    base = {key: meta[key] for key in ("cached_tokens",) if key in meta}
    obj = state.obj
    return Kept(prompt_tokens=len(record.input_ids), ids=list(record.output_ids), per_token=per_token,
                weight_spans=list(record.weight_versions), base_meta=base, delivered_ids=delivered[0],
                delivered_text=delivered[1], routed_experts=routed_experts.decoded(meta.get("routed_experts")),
                routed_row_bytes=routed_row_bytes, routed_start=int(getattr(obj, "routed_experts_start_len", 0) or 0))
