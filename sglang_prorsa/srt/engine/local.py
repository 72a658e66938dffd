"""This instance as the engine extension drives it: its scheduler over the private channel (``LocalScheduler``),
SGLang's tokenizer manager (``TokenizerManagerView``), and whether it takes new requests (``Admission``).

Every request the scheduler takes off gets a record in the book first (pushed by the scheduler, or booked here for a
queued half whose other half is about to move), so the tokenizer manager continues it however it ends. The tokenizer
manager exists only once SGLang made it (``srt/instance/install.py`` sets it after the engine side is built), so the
view holds it and every collaborator asks the view.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Callable, Iterable, Sequence

from sglang_prorsa.srt.common.channel import EngineChannel
from sglang_prorsa.srt.common.messages import (
    ForgetPrefill,
    Inventory,
    InventoryResult,
    LoadPrefix,
    LoadPrefixResult,
    MigratedRequest,
    MigrateOut,
    MigrateOutResult,
    PeerLost,
    QueuedItem,
    ReleaseRooms,
    Stage,
    Status,
)
from sglang_prorsa.srt.engine import dp
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.peers import Peer

CONTROL_TIMEOUT_S = 60.0
CHANNEL_TIMEOUT_S = 120.0  # the channel's own default (``EngineChannel.call``)


class LocalScheduler:
    """This instance's scheduler, over the channel; records for what it takes off go into ``book``.

    ``channel`` is one channel, or one per data-parallel rank (``srt/engine/dp.py``): then every message goes to each
    rank and the answers are merged, except a prefix load, which one rank takes (round robin)."""

    def __init__(self, channel: EngineChannel | Sequence[EngineChannel], book: RecordBook,
                 counters: collections.Counter[str], role: Callable[[], str]) -> None:
        self.channels = list(channel) if isinstance(channel, (list, tuple)) else [channel]
        self.channel = self.channels[0]
        self.book = book
        self.counters = counters
        self.role = role
        self.statuses = dp.StatusMerger(len(self.channels))
        self._next_load = 0  # the DP rank the next prefix load goes to

    @property
    def dp_size(self) -> int:
        return len(self.channels)

    async def _call(self, message: Any, timeout_s: float, merge: Callable[[list[Any]], Any]) -> Any:
        if self.dp_size == 1:
            return await self.channel.call(message, timeout_s=timeout_s)
        return merge(await dp.call_all(self.channels, message, timeout_s))

    async def inventory(self, timeout_s: float = CHANNEL_TIMEOUT_S) -> InventoryResult:
        return await self._call(Inventory(), timeout_s, dp.merge_inventory)

    async def status(self, since: int = -1):
        if self.dp_size == 1:
            return await self.channel.call(Status(since=since), timeout_s=CHANNEL_TIMEOUT_S)
        asks = [Status(since=self.statuses.since(rank)) for rank in range(self.dp_size)]
        return self.statuses.merge(await dp.call_each(self.channels, asks, CHANNEL_TIMEOUT_S), since)

    async def migrate_out(self, queued_rids: frozenset[str], reason: str) -> MigrateOutResult:
        return await self._call(MigrateOut(queued_rids=queued_rids, reason=reason), CHANNEL_TIMEOUT_S,
                                dp.merge_migrate_out)

    async def release(self, rooms: list[int], only_not_started: bool = False) -> tuple[list[str], list[int]]:
        """Our halves of these PD rooms taken off (their other half moved); returns (rids, rooms) taken."""
        res = await self._call(ReleaseRooms(rooms=frozenset(rooms), only_not_started=only_not_started),
                               CONTROL_TIMEOUT_S, dp.merge_release)
        self.counters["rooms_released"] += len(res.rooms)
        return res.rids, res.rooms

    async def expect(self, rooms: list[int]) -> list[str]:
        """Book records for our queued halves of these rooms (their other half is about to move)."""
        inv = await self._call(Inventory(), CONTROL_TIMEOUT_S, dp.merge_inventory)
        wanted = set(rooms)
        items = [q for q in inv.queued if q.bootstrap_room in wanted]
        self.book_queued(items, inv.role)
        return [q.rid for q in items]

    def book_queued(self, items: Iterable[QueuedItem], role: str) -> None:
        """Records for queued requests about to lose their other half (see ``SwitchJob.sweep``)."""
        for item in items:
            self.book.put(MigratedRequest(rid=item.rid, role=role, stage=Stage.QUEUED, input_ids=list(item.input_ids),
                                          output_ids=[], sampling_params={}, bootstrap_room=item.bootstrap_room,
                                          bootstrap_host=item.bootstrap_host, bootstrap_port=item.bootstrap_port))

    async def forget_prefills(self, peers: list[Peer]) -> int:
        """Peers whose role was rebuilt: as a decode instance, drop what SGLang cached about them as prefills."""
        addresses = frozenset((p.bootstrap_host, p.bootstrap_port) for p in peers if p.bootstrap_port)
        if not addresses or self.role() != "decode":
            return 0
        return await self._call(ForgetPrefill(addresses=addresses), CONTROL_TIMEOUT_S, sum)

    async def load_prefix(self, token_ids: list[int], keys: list[str], block_tokens: int, hold_for_rid: str,
                          layout: str = "") -> LoadPrefixResult:
        """A persisted prefix into this scheduler's prefix cache, held for ``hold_for_rid`` (``/prorsa/kv/load``).
        With data parallelism one DP rank loads it and the result names that rank: the resumed request must be routed
        there (SGLang's ``routed_dp_rank``), where its prefix and hold are."""
        msg = LoadPrefix(token_ids=token_ids, keys=keys, block_tokens=block_tokens, hold_for_rid=hold_for_rid,
                         layout=layout)
        if self.dp_size == 1:
            return await self.channel.call(msg, timeout_s=CHANNEL_TIMEOUT_S)
        rank, self._next_load = self._next_load, (self._next_load + 1) % self.dp_size
        result = await self.channels[rank].call(msg, timeout_s=CHANNEL_TIMEOUT_S)
        result.dp_rank, result.dp_size = rank, self.dp_size
        return result

    async def peer_lost(self, host: str | None, port: int | None, dead: bool = True):
        """A prefill peer died (``dead``) or stopped answering: our halves waiting for its KV are taken off
        (continued elsewhere)."""
        return await self._call(PeerLost(host=host, port=port, dead=dead), CHANNEL_TIMEOUT_S, dp.merge_release)


_PROMPT_IDS = "_prorsa_prompt_ids"  # on SGLang's request object: its text prompt as SGLang tokenized it


def keep_prompt_ids(obj: Any, tokenized: Any) -> None:
    """Keeps SGLang's own ids of a text prompt on the request object (a reference, not a copy)."""
    if obj.input_ids is None and tokenized.input_ids is not None:  # (Tokenized)Generate/EmbeddingReqInput fields
        setattr(obj, _PROMPT_IDS, tokenized.input_ids)


def kept_prompt_ids(obj: Any) -> list[int] | None:
    return getattr(obj, _PROMPT_IDS, None)  # ours, set only on a text prompt SGLang tokenized here


class TokenizerManagerView:
    """What the engine extension reads from (and asks of) SGLang's tokenizer manager: its role, a request's prompt
    ids, output text as SGLang's detokenizer makes it, the weight version, and the role rebuild itself."""

    def __init__(self, tm: Any = None) -> None:
        self.tm = tm  # SGLang's TokenizerManager, once made

    def role(self) -> str:
        return str(self.tm.disaggregation_mode.value).lower()

    @property
    def incremental_streaming(self) -> bool:
        return bool(self.tm.incremental_streaming_output)

    def weight_version(self) -> str:
        """The weight version this instance serves, as SGLang reports it in each answer's meta."""
        return str(self.tm.config_value("weight_version")) if self.tm is not None else "default"

    def routed_experts_row_bytes(self) -> int:
        """One position's bytes in SGLang's ``routed_experts`` (int32, every hidden layer, ``num_experts_per_tok``
        each: ``RoutedExpertsCapturer``); 0 for a model without routed experts."""
        cfg = self.tm.model_config.hf_text_config
        return 4 * int(getattr(cfg, "num_hidden_layers", 0) or 0) * int(getattr(cfg, "num_experts_per_tok", 0) or 0)

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

    def decoder(self, obj: Any, prompt_ids: list[int]) -> Callable[[list[int]], str]:
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

    async def rebuild_role(self, new_role: str, cpu: bool) -> Any:
        """SGLang's own teardown/init of the scheduler in ``new_role`` (weights stay resident); SGLang's answer."""
        from sglang.srt.managers.io_struct import PdRoleSwitchReqInput

        req = PdRoleSwitchReqInput(new_role=new_role)
        if cpu and new_role == "decode":
            req.decode_cuda_graph_memory_gb = 0  # SGLang refuses the CPU flip to decode without it
        return await self.tm.pd_role_switch(req)


class Admission:
    """Whether this instance takes new generation requests, and what is on its way to the scheduler. A switch closes
    it (requests arriving are handed on at arrival), waits until nothing is ``entering`` (arrived but not yet with the
    scheduler), and marks the role ``rebuilding`` (arrivals wait for the rebuilt role)."""

    def __init__(self) -> None:
        self.admitting = True  # False: single requests are handed on at arrival (a switch, or POST /prorsa/admission)
        self.entering = 0  # generation requests inside the tokenizer manager, not yet handed to the scheduler
        self.rebuilding = False
        self._rebuilt = asyncio.Event()
        self._rebuilt.set()

    async def rebuilt(self) -> None:
        await self._rebuilt.wait()

    def set_rebuilding(self, on: bool) -> None:
        self.rebuilding = on
        (self._rebuilt.clear if on else self._rebuilt.set)()
