"""The KV side of the scheduler extension: persist a request's KV to the store, load a persisted prefix into the
prefix cache (and hold it there until its request is scheduled), report the pool's occupancy.

Each tensor-parallel rank has one and handles the same messages: it persists its own shard of the heads under its own
keys and, for a load that names the source's layout, recomputes its own keys from the tokens -- so rank ``r`` loads
what rank ``r`` of the source persisted. A load from a source of another parallel layout is refused (counted in
``kv_layout_refused``): its bytes would have another shape here, and the prefix is recomputed instead."""

from __future__ import annotations

import logging
import time
from array import array
from dataclasses import dataclass
from typing import Any, Callable

import torch

from sglang_prorsa.srt.common.messages import LAYOUT_REFUSED, LoadPrefix, LoadPrefixResult, MigratedRequest
from sglang_prorsa.srt.disaggregation.kv_persist import (
    KVStoreConfig,
    keys_for,
    layout_of,
    load_blocks,
    persist_request_kv,
)
from sglang_prorsa.srt.scheduler.counters import InstanceCounters
from sglang_prorsa.srt.scheduler.ranks import Ranks, tp_min

logger = logging.getLogger(__name__)


@dataclass
class _Hold:
    lock: Any  # SGLang's TreeLock on the loaded prefix's last node
    root: Any  # the tree's root handle when locked: a reset (flush, role rebuild) mints a new one
    deadline: float
    seen: bool = False  # the request was seen waiting here


class KVSide:
    def __init__(self, scheduler: Any, store_config: KVStoreConfig, counters: InstanceCounters,
                 ranks: Ranks = Ranks(), agree: Callable[[int], int] | None = None) -> None:
        self.s = scheduler
        self.store_config = store_config
        self.counters = counters
        self.ranks = ranks
        # The fewest tokens any TP rank found intact for a load (``ranks.tp_min``); the value itself with one rank.
        self.agree = agree or ((lambda n: tp_min(scheduler, n)) if ranks.tp_size > 1 else (lambda n: n))
        self._store = None
        self._codec = None
        self._codec_pool = None
        self.holds: dict[str, _Hold] = {}
        try:
            self.codec()  # load (or build once) the export/import kernels now, not during the first switch
        except ImportError as e:  # a broken install: every switch of this instance would fail, so do not start
            raise RuntimeError(f"prorsa: the KV export/import kernels cannot be imported ({e}); the package install "
                               "is broken (an editable install pointing at a removed checkout?): reinstall it") from e
        except (TypeError, ValueError):  # a pool layout the kernels do not support: switches fail, serving goes on
            logger.exception("prorsa: KV export kernels unavailable for this pool")

    @property
    def store(self):
        if self._store is None:
            self._store = self.store_config.open()
        return self._store

    def codec(self):
        pool = self.s.token_to_kv_pool_allocator.get_kvcache()
        if self._codec is None or self._codec_pool is not pool:
            from sglang_prorsa.kernels import KVPageCodec

            self._codec = KVPageCodec.from_sglang_pool(pool)
            self._codec_pool = pool
        return self._codec

    def layout(self) -> str:
        """This instance's parallel KV layout (``kv_persist.layout_of``): what a resume's source must match."""
        return layout_of(self.s, self.codec(), self.ranks.tp_size)

    def occupancy(self) -> tuple[int, int, int]:
        """(KV tokens requests hold, KV capacity, tokens held by the prefix cache).

        The footprint (the paper's K^D_t on a decode instance) leaves out the prefix cache's evictable tokens: no
        request holds them and SGLang frees them on demand. Counted in, an idle decode instance whose cache is full
        reported a pool's worth of decode demand and the controller switched on it."""
        capacity = int(self.s.max_total_num_tokens or 0)
        tree = self.s.tree_cache
        evictable = 0 if tree.disable else int(tree.evictable_size())
        allocated = capacity - int(self.s.token_to_kv_pool_allocator.available_size()) if capacity else 0
        footprint = max(0, allocated - evictable)
        cached = 0 if tree.disable else evictable + int(tree.protected_size())
        return footprint, capacity, cached

    # -- persist ----------------------------------------------------------------------------------------------------
    def persist(self, req: Any, record: MigratedRequest) -> tuple[MigratedRequest, int, int]:
        """Export the KV of every token but the newest (it has none yet: it is the next forward's input)."""
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        kv_tokens = len(tokens) - 1
        if kv_tokens <= 0 or req.kv.req_pool_idx is None:
            return record, 0, 0
        slots = self.s.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :kv_tokens]
        layout = self.layout()
        keys, block_tokens, nbytes = persist_request_kv(self.codec(), self.store, tokens[:kv_tokens], slots, layout,
                                                        self.store_config.block_tokens, self.ranks.tp_rank)
        record.kv_tokens, record.keys, record.block_tokens, record.layout = kv_tokens, keys, block_tokens, layout
        self.counters.add("kv_blocks_persisted", len(keys))
        self.counters.add("kv_tokens_persisted", kv_tokens)
        self.counters.add("kv_bytes_persisted", nbytes)
        return record, len(keys), nbytes

    # -- load -------------------------------------------------------------------------------------------------------
    def load_prefix(self, msg: LoadPrefix) -> LoadPrefixResult:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        t0 = time.perf_counter()
        s = self.s
        if msg.layout and msg.layout != self.layout():
            # Another parallel layout (TP size, dtype, heads, page size...): its shards do not fit this pool.
            self.counters.add("kv_layout_refused", 1)
            logger.warning("prorsa: prefix load refused: the source's KV layout %s is not this instance's %s; "
                           "it will be recomputed", msg.layout, self.layout())
            return LoadPrefixResult(0, 0, 0, 0, time.perf_counter() - t0, refused=LAYOUT_REFUSED)
        page = int(s.page_size or 1)
        n = (len(msg.token_ids) // page) * page  # the radix tree holds whole pages only
        tokens = list(msg.token_ids[:n])
        if n == 0 or s.tree_cache.disable:
            return LoadPrefixResult(0, 0, len(msg.keys), 0, time.perf_counter() - t0)
        match = s.tree_cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        have = (int(match.device_prefix_len) // page) * page
        if have >= n:
            held = self._hold(msg, tokens[:have])
            return LoadPrefixResult(0, have, 0, 0, time.perf_counter() - t0, held)
        # The matched path is locked while room is made: unlocked, the eviction below may free its pages (and
        # hand them back as new slots), and the insert would then put freed pages into the tree -- a double free
        # later, and another request's KV overwritten (path_device_indices: "valid until the next allocation or
        # eviction unless the path is locked").
        lock = s.tree_cache.lock(match.last_device_node) if have else None
        try:
            return self._load_after(msg, tokens, have, n, match, t0)
        finally:
            s.tree_cache.unlock(lock)

    def _load_after(self, msg: LoadPrefix, tokens: list[int], have: int, n: int, match: Any,
                    t0: float) -> LoadPrefixResult:
        """Load tokens [have, n) of a prefix whose first ``have`` tokens the tree holds (path locked)."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        s = self.s
        page = int(s.page_size or 1)
        existing = s.tree_cache.path_device_indices(match.last_device_node)[:have].to(torch.int64)
        # With the source's layout (equal to ours) this rank's own keys, from the tokens: the source's rank r wrote
        # them for rank r. Without (an older sender), the keys it sent.
        keys = keys_for(tokens, msg.block_tokens, msg.layout, self.ranks.tp_rank) if msg.layout else msg.keys
        loaded = load_blocks(self.store, keys, msg.block_tokens, have, n)
        if loaded.missing_blocks or loaded.checksum_failures:
            self.counters.add("kv_store_misses", loaded.missing_blocks)
            self.counters.add("kv_checksum_failures", loaded.checksum_failures)
        usable = ((have + loaded.tokens) // page) * page - have  # leading tokens after `have` that arrived intact
        # Every TP rank inserts the same prefix (the fewest tokens any rank found intact): a block missing on one
        # rank only would otherwise leave the ranks' prefix caches, and so their schedules, different.
        usable = self.agree(usable)
        if usable <= 0:
            held = self._hold(msg, tokens[:have]) if have else False
            return LoadPrefixResult(0, have, loaded.missing_blocks, loaded.checksum_failures,
                                    time.perf_counter() - t0, held)
        alloc = s.token_to_kv_pool_allocator
        slots = alloc.alloc(usable)
        if slots is None:
            evicted = s.tree_cache.evict(EvictParams(num_tokens=usable)).num_tokens_evicted
            self.counters.add("kv_tokens_evicted_for_loads", int(evicted))
            slots = alloc.alloc(usable)
        if slots is None:
            logger.warning("prorsa: no KV room to load a %d-token prefix; it will be recomputed", usable)
            return LoadPrefixResult(0, have, loaded.missing_blocks, loaded.checksum_failures,
                                    time.perf_counter() - t0)
        codec = self.codec()
        codec.import_pages(loaded.records_for(codec, usable, page), codec.pages_of_slots(slots, page))
        value = torch.cat([existing.to(slots.device), slots.to(torch.int64)])
        s.tree_cache.insert(InsertParams(key=RadixKey(array("q", tokens[: have + usable])), value=value,
                                         prev_prefix_len=have))
        held = self._hold(msg, tokens[: have + usable])
        self.counters.add("kv_tokens_loaded", usable)
        self.counters.add("requests_migrated_in", 1)
        return LoadPrefixResult(usable, have, loaded.missing_blocks, loaded.checksum_failures,
                                time.perf_counter() - t0, held)

    def _hold(self, msg: LoadPrefix, tokens: list[int]) -> bool:
        """Lock the loaded prefix against eviction until its request is scheduled here (or ``hold_s`` passes)."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        if not msg.hold_for_rid or not tokens:
            return False
        self.counters.expect_resume(msg.hold_for_rid)
        self.release_hold(msg.hold_for_rid)
        tree = self.s.tree_cache
        node = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)))).last_device_node
        self.holds[msg.hold_for_rid] = _Hold(lock=tree.lock(node), root=tree.root_node_handle(),
                                             deadline=time.monotonic() + msg.hold_s)
        return True

    def release_hold(self, rid: str) -> None:
        hold = self.holds.pop(rid, None)
        tree = self.s.tree_cache
        if hold is not None and tree.root_node_handle() == hold.root:  # else a reset already dropped the lock
            tree.unlock(hold.lock)

    def expire_holds(self, known: tuple[set[str], set[str]]) -> None:
        """Release each hold once its request has been scheduled (it then holds its own lock), or at its deadline."""
        if not self.holds:
            return
        pending, past = known
        now = time.monotonic()
        for rid, hold in list(self.holds.items()):
            if rid in pending:
                hold.seen = True
            elif rid in past or hold.seen or now > hold.deadline:
                self.release_hold(rid)

