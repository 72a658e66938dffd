"""What runs inside SGLang's scheduler process: cancel-and-persist for a busy switch, prefix loading for resume.

Bound onto ``sglang.srt.managers.scheduler.Scheduler`` through the override registry. Everything here is called from
the scheduler's own event loop (``process_input_requests``), between two forward passes, so the running batch, the
queues and the KV pool are never touched while the model runs. Device tensors stay where they are: on a GPU the same
code exports from device memory with the CUDA/Triton kernels.

Paper Appendix C: "Affected requests are cancelled, with their input and already generated tokens retained and the KV
cache state persisted to remote storage."
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from typing import Any

import torch

from sglang_prorsa.srt.role_switch.control_channel import ENV_ADDRESS, ControlServer
from sglang_prorsa.srt.role_switch.counters import InstanceCounters
from sglang_prorsa.srt.role_switch.messages import (
    LoadPrefix,
    LoadPrefixResult,
    MigratedRequest,
    MigrateOut,
    MigrateOutResult,
    Status,
    StatusResult,
)

logger = logging.getLogger(__name__)

_SAMPLING_FIELDS = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stop_token_ids", "n",
)


def _sampling_dict(req: Any) -> dict[str, Any]:
    sp = req.sampling_params
    out: dict[str, Any] = {}
    for name in _SAMPLING_FIELDS:
        v = getattr(sp, name, None)
        if isinstance(v, set):
            v = sorted(v)
        if v is None or isinstance(v, (bool, int, float, str, list)):
            out[name] = v
    stop = getattr(sp, "stop_strs", None)
    if stop:
        out["stop"] = list(stop)
    if out.get("max_new_tokens") is not None:
        out["max_new_tokens"] = max(0, out["max_new_tokens"] - len(req.output_ids))
    if out.get("min_new_tokens"):
        out["min_new_tokens"] = max(0, out["min_new_tokens"] - len(req.output_ids))
    return out


class ProrsaSchedulerMixin:
    """Methods added to SGLang's Scheduler. State lives in ``self._prorsa`` (created lazily, once per process)."""

    # -- wiring ---------------------------------------------------------------------------------------------------
    def prorsa_state(self) -> "_ProrsaState":
        st = getattr(self, "_prorsa", None)
        if st is None:
            st = _ProrsaState(self)
            self._prorsa = st
        return st

    def prorsa_poll(self) -> None:
        self.prorsa_state().poll()

    # -- handlers -------------------------------------------------------------------------------------------------
    def prorsa_handle(self, msg: Any) -> Any:
        if isinstance(msg, MigrateOut):
            return self.prorsa_migrate_out(msg)
        if isinstance(msg, LoadPrefix):
            return self.prorsa_load_prefix(msg)
        if isinstance(msg, Status):
            return self.prorsa_status()
        raise TypeError(f"unknown prorsa control message {type(msg).__name__}")

    def prorsa_role(self) -> str:
        return str(getattr(self.disaggregation_mode, "value", self.disaggregation_mode)).lower()

    def prorsa_status(self) -> StatusResult:
        running = [r for r in self.collect_inflight_reqs() if not r.finished()]
        queued = len(self.waiting_queue) + sum(len(q) for q in self._prorsa_disagg_queues())
        pool = self.token_to_kv_pool_allocator
        capacity = int(getattr(self, "max_total_num_tokens", 0) or 0)
        footprint = max(0, capacity - int(pool.available_size())) if capacity else 0
        return StatusResult(
            role=self.prorsa_role(), idle=bool(self.is_fully_idle()), running=len(running), queued=queued,
            counters=self.prorsa_state().counters.snapshot(), kv_footprint_tokens=footprint,
            kv_capacity_tokens=capacity,
        )

    def _prorsa_disagg_queues(self) -> list[list]:
        out = []
        for name in ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue", "disagg_prefill_bootstrap_queue"):
            q = getattr(self, name, None)
            if q is not None and getattr(q, "queue", None) is not None:
                out.append(q.queue)
        inflight = getattr(self, "disagg_prefill_inflight_queue", None)
        if inflight:
            out.append(inflight)
        return out

    def prorsa_migrate_out(self, msg: MigrateOut) -> MigrateOutResult:
        """Cancel the requests this instance can hand over, and report every one of them.

        Decode role: requests whose KV is complete in the pool (running, or received and waiting to run) are
        persisted to the store and reported with their tokens; requests whose KV is still arriving from a prefill
        instance are reported with ``kv_tokens = 0`` and re-sent from their prompt.
        Prefill role: requests not yet started (bootstrap and waiting queues) are reported for re-sending; a chunked
        prefill in progress and finished prefills still transferring to decode are left to finish, since they are
        seconds from done and already bound to a decode instance (documented choice, see README).
        """
        from sglang.srt.managers.io_struct import AbortReq

        st = self.prorsa_state()
        t0 = time.perf_counter()
        records: list[MigratedRequest] = []
        blocks = nbytes = 0
        seen: set[str] = set()

        def report(req: Any, stage: str) -> None:
            if req.rid in seen:
                return
            seen.add(req.rid)
            records.append(MigratedRequest(rid=req.rid, input_ids=list(req.origin_input_ids), output_ids=[],
                                           sampling_params=_sampling_dict(req), stage=stage))

        if self.prorsa_role() == "decode":
            for req in [r for r in self.collect_inflight_reqs() if not r.finished()] + list(self.waiting_queue):
                if req.rid in seen:
                    continue
                seen.add(req.rid)
                rec, b, n = st.persist(req)
                records.append(rec)
                blocks, nbytes = blocks + b, nbytes + n
            for name, stage in (("disagg_decode_prealloc_queue", "queued"),
                                ("disagg_decode_transfer_queue", "transferring")):
                for item in list(getattr(getattr(self, name, None), "queue", None) or []):
                    report(item.req, stage)
        else:
            chunked = getattr(self, "chunked_req", None)
            for req in list(self.waiting_queue):
                if req is not chunked:
                    report(req, "queued")
            for req in list(getattr(getattr(self, "disagg_prefill_bootstrap_queue", None), "queue", None) or []):
                report(req, "queued")
        for rec in records:
            self.abort_request(AbortReq(rid=rec.rid))
        st.counters.add("requests_migrated_out", len(records))
        elapsed = time.perf_counter() - t0
        logger.info("prorsa: migrated out %d requests (%d KV blocks, %.1f MB) in %.3f s",
                    len(records), blocks, nbytes / 1e6, elapsed)
        return MigrateOutResult(role=self.prorsa_role(), requests=records, persist_s=elapsed,
                                persisted_bytes=nbytes, persisted_blocks=blocks)

    def prorsa_load_prefix(self, msg: LoadPrefix) -> LoadPrefixResult:
        return self.prorsa_state().load_prefix(msg)


class _ProrsaState:
    """Per-process state: the control socket, the KV store handle, the codec and the counters."""

    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler
        self.counters = InstanceCounters()
        self.server: ControlServer | None = None
        address = os.environ.get(ENV_ADDRESS)
        if address:
            self.server = ControlServer(address, scheduler.prorsa_handle)
            sleeper = getattr(scheduler, "idle_sleeper", None)
            if sleeper is not None and hasattr(sleeper, "poller"):
                import zmq

                sleeper.poller.register(self.server.socket, zmq.POLLIN)  # wake an idle scheduler for our messages
        self._store = None
        self._codec = None
        try:
            self.codec()  # load (or build once) the export/import kernels now, not during the first switch
        except Exception:  # a pool layout the kernels do not support: switches will fail loudly, serving goes on
            logger.exception("prorsa: KV export kernels unavailable for this pool")

    def poll(self) -> None:
        if self.server is not None:
            self.server.poll()

    # -- KV ---------------------------------------------------------------------------------------------------------
    @property
    def store(self):
        if self._store is None:
            from sglang_prorsa.srt.disaggregation.kv_persist import store_from_env

            self._store = store_from_env()
        return self._store

    def codec(self):
        pool = self.s.token_to_kv_pool_allocator.get_kvcache()
        if self._codec is None or self._codec_pool is not pool:
            from sglang_prorsa.kernels import KVPageCodec

            self._codec = KVPageCodec.from_sglang_pool(pool)
            self._codec_pool = pool
        return self._codec

    def layout(self) -> str:
        from sglang_prorsa.srt.disaggregation.kv_persist import layout_of

        return layout_of(self.s, self.codec())

    def persist(self, req: Any) -> tuple[MigratedRequest, int, int]:
        from sglang_prorsa.srt.disaggregation.kv_persist import persist_request_kv

        tokens = list(req.origin_input_ids) + list(req.output_ids)
        kv_tokens = len(tokens) - 1  # the newest token has no KV yet: it is the next forward's input
        rec = MigratedRequest(rid=req.rid, input_ids=list(req.origin_input_ids), output_ids=list(req.output_ids),
                              sampling_params=_sampling_dict(req), stage="running")
        if kv_tokens <= 0 or req.kv.req_pool_idx is None:
            return rec, 0, 0
        slots = self.s.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :kv_tokens]
        keys, block_tokens, nbytes = persist_request_kv(self.codec(), self.store, tokens[:kv_tokens], slots,
                                                        self.layout())
        rec.kv_tokens, rec.keys, rec.block_tokens = kv_tokens, keys, block_tokens
        self.counters.add("kv_tokens_persisted", kv_tokens)
        self.counters.add("kv_bytes_persisted", nbytes)
        return rec, len(keys), nbytes

    def load_prefix(self, msg: LoadPrefix) -> LoadPrefixResult:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        from sglang_prorsa.srt.disaggregation.kv_persist import load_blocks

        t0 = time.perf_counter()
        s = self.s
        page = int(getattr(s, "page_size", 1) or 1)
        n = (len(msg.token_ids) // page) * page  # the radix tree holds whole pages only
        tokens = list(msg.token_ids[:n])
        if n == 0 or getattr(s.tree_cache, "disable", False):
            return LoadPrefixResult(0, 0, len(msg.keys), 0, time.perf_counter() - t0)
        match = s.tree_cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        have = (int(match.device_prefix_len) // page) * page
        if have >= n:
            return LoadPrefixResult(0, have, 0, 0, time.perf_counter() - t0)
        existing = s.tree_cache.path_device_indices(match.last_device_node)[:have].to(torch.int64)
        loaded = load_blocks(self.store, msg.keys, msg.block_tokens, have, n)
        if loaded.missing_blocks or loaded.checksum_failures:
            self.counters.add("kv_store_misses", loaded.missing_blocks)
            self.counters.add("kv_checksum_failures", loaded.checksum_failures)
        usable = loaded.tokens  # leading tokens after `have` whose KV arrived intact
        usable = ((have + usable) // page) * page - have
        if usable <= 0:
            return LoadPrefixResult(0, have, loaded.missing_blocks, loaded.checksum_failures,
                                    time.perf_counter() - t0)
        alloc = s.token_to_kv_pool_allocator
        slots = alloc.alloc(usable)
        if slots is None:
            s.tree_cache.evict(EvictParams(num_tokens=usable))
            slots = alloc.alloc(usable)
        if slots is None:
            logger.warning("prorsa: no KV room to load a %d-token prefix; it will be recomputed", usable)
            return LoadPrefixResult(0, have, loaded.missing_blocks, loaded.checksum_failures,
                                    time.perf_counter() - t0)
        codec = self.codec()
        pages = codec.pages_of_slots(slots, page)
        codec.import_pages(loaded.records_for(codec, usable, page), pages)
        value = torch.cat([existing.to(slots.device), slots.to(torch.int64)])
        s.tree_cache.insert(InsertParams(key=RadixKey(array("q", tokens[: have + usable])), value=value,
                                         prev_prefix_len=have))
        self.counters.add("kv_tokens_loaded", usable)
        self.counters.add("requests_migrated_in", 1)
        return LoadPrefixResult(usable, have, loaded.missing_blocks, loaded.checksum_failures,
                                time.perf_counter() - t0)
