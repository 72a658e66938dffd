"""Our extension of SGLang's scheduler: take requests off a busy instance with their tokens and KV, release the
halves of PD pairs that moved elsewhere, load persisted prefixes, report counters and busy intervals.

Bound onto ``sglang.srt.managers.scheduler.Scheduler`` through the override registry (``srt/instance/overrides.py``).
Everything runs from the scheduler's own event loop, between two forward passes (``process_input_requests``), so
batches, queues and the KV pool are never touched while the model runs. Device tensors stay where they are: on a GPU
the same code exports from device memory with the CUDA/Triton kernels.

Paper Appendix C: "Affected requests are cancelled, with their input and already generated tokens retained and the
KV cache state persisted to remote storage." Every request taken off is first *pushed* to the engine side as a
``MigratedRequest`` and only then aborted, with ``err_type`` = ``Code.MIGRATED`` or ``Code.HANDED_ON`` where SGLang
lets the abort carry our reason.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Any

from sglang_prorsa.srt.common import sglang_internals
from sglang_prorsa.srt.common.channel import ChannelAddresses, SchedulerChannel, answer
from sglang_prorsa.srt.common.messages import (
    Code,
    Decoding,
    ForgetPrefill,
    Inventory,
    InventoryResult,
    LoadPrefix,
    MigratedRequest,
    MigrateOut,
    MigrateOutResult,
    PeerLost,
    QueuedItem,
    ReleaseResult,
    ReleaseRooms,
    Stage,
    Status,
    StatusResult,
)
from sglang_prorsa.srt.disaggregation.kv_persist import KVStoreConfig
from sglang_prorsa.srt.scheduler.counters import InstanceCounters
from sglang_prorsa.srt.scheduler.kv import KVSide
from sglang_prorsa.srt.scheduler.ranks import Broadcast, Ranks, ranks_of, tp_broadcast

logger = logging.getLogger(__name__)

MAX_TAKEN_REMEMBERED = 4096  # rids of requests taken off here, newest kept (see SchedulerSide.taken)
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"  # sglang.srt.constants (0.5.23); checked at start-up (sglang_internals)


@dataclass(frozen=True)
class SchedulerRuntime:
    """What our extension needs in the scheduler process, handed over whole by the instance that spawns it."""

    instance_id: str
    channel: ChannelAddresses
    kv_store: KVStoreConfig
    cpu_threads: int = 0  # torch intra-op threads of the scheduler (CPU instances; 0: torch's default)
    # TESTING ONLY (--prorsa-test-crash-on-tokens): a prefill or colocated scheduler that receives a prompt holding
    # this token sequence raises, as a scheduler crashing on a poison request would (issue 29's containment tests).
    crash_on_tokens: tuple[int, ...] = ()
    # This scheduler's data-parallel rank (None without data parallelism) and the instance's DP size: set in the
    # scheduler process from SGLang's spawn arguments (instance/scheduler_process.py), not by the instance.
    dp_rank: int | None = None
    dp_size: int = 1


RUNTIME: SchedulerRuntime | None = None  # set once by our scheduler entry (scheduler/process.py) in this process

_SAMPLING_FIELDS = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stop_token_ids", "n",
)


def sampling_dict(req: Any) -> dict[str, Any]:
    """The request's sampling parameters with the budget that remains after the tokens it already produced."""
    sp = req.sampling_params
    out: dict[str, Any] = {}
    for name in _SAMPLING_FIELDS:
        v = getattr(sp, name)  # every name is SamplingParams' (sglang_internals.SAMPLING_PARAMS_FIELDS)
        if isinstance(v, set):
            v = sorted(v)
        if v is None or isinstance(v, (bool, int, float, str, list)):
            out[name] = v
    if sp.stop_strs:
        out["stop"] = list(sp.stop_strs)
    if out.get("max_new_tokens") is not None:
        out["max_new_tokens"] = max(0, out["max_new_tokens"] - len(req.output_ids))
    if out.get("min_new_tokens"):
        out["min_new_tokens"] = max(0, out["min_new_tokens"] - len(req.output_ids))
    return out


def _abort_reason(code: Code) -> Any:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return FINISH_ABORT(f"prorsa: {code.value}", None, code.value)


class ProrsaSchedulerMixin:
    """Methods added to SGLang's Scheduler (only new ``prorsa_*`` names; none of SGLang's is replaced)."""

    def prorsa_side(self) -> SchedulerSide | None:
        side = getattr(self, "_prorsa_side", None)  # ours, made on first use (not an SGLang attribute)
        if side is None and RUNTIME is not None:
            side = SchedulerSide(self, RUNTIME)
            self._prorsa_side = side
        return side

    def prorsa_poll(self) -> None:
        side = self.prorsa_side()
        if side is not None:
            side.poll()

    def prorsa_test_crash(self, recv_reqs: list[Any]) -> None:
        marker = RUNTIME.crash_on_tokens if RUNTIME is not None else ()
        if not marker or str(self.disaggregation_mode.value) == "decode":
            return
        from sglang.srt.managers.io_struct import (
            BatchTokenizedEmbeddingReqInput,
            BatchTokenizedGenerateReqInput,
            TokenizedEmbeddingReqInput,
            TokenizedGenerateReqInput,
        )

        # A (Batch)Tokenized*ReqInput: a batch holds its requests in ``batch``; ids are an array('l'). Every other
        # message the scheduler receives (control requests, aborts) carries no prompt.
        batches = (BatchTokenizedGenerateReqInput, BatchTokenizedEmbeddingReqInput)
        reqs = [r for recv in recv_reqs or () for r in (recv.batch if isinstance(recv, batches) else (recv,))]
        for req in reqs:
            if not isinstance(req, (TokenizedGenerateReqInput, TokenizedEmbeddingReqInput)):
                continue
            ids = req.input_ids
            if ids is not None and _contains(list(ids), marker):
                raise RuntimeError(f"prorsa test crash: request {req.rid} holds the marked tokens "
                                   f"{list(marker)} (--prorsa-test-crash-on-tokens)")

    def prorsa_observe_extend(self, batch: Any) -> None:
        side = self.prorsa_side()
        if side is not None:
            # SGLang's /health generates one token with a fake PD pair: not serving work, so not counted (a router's
            # health checks would otherwise add prompt tokens that no request sent).
            health = [i for i, r in enumerate(batch.reqs) if str(r.rid).startswith(HEALTH_CHECK_RID_PREFIX)]
            lens = batch.extend_lens or []  # None until SGLang prepared the extend
            new_tokens = int(batch.extend_num_tokens) - sum(int(lens[i]) for i in health if i < len(lens))
            side.counters.observe_extend(new_tokens, [r for i, r in enumerate(batch.reqs) if i not in health],
                                         [n for i, n in enumerate(lens) if i not in health])


class SchedulerSide:
    """Per-process state of the extension: the channel, counters, the KV side, released rooms, held prefixes.

    With tensor parallelism there is one per TP rank; only rank 0 (of its DP group, or of its attention-TP group under
    attention DP) has the channel, and every rank handles every control message, in the same order (``ranks.py``)."""

    def __init__(self, scheduler: Any, runtime: SchedulerRuntime, broadcast: Broadcast | None = None) -> None:
        self.s = scheduler
        self.runtime = runtime
        self.counters = InstanceCounters()
        self._checked_role = ""
        self._check_role()
        self.ranks: Ranks = ranks_of(scheduler, runtime.dp_rank, runtime.dp_size)
        # The (attention) TP group's broadcast of its leader's control messages (SGLang's broadcast_pyobj); none with
        # one rank.
        self.broadcast = (broadcast or tp_broadcast(scheduler)) if self.ranks.tp_size > 1 else None
        self.channel: SchedulerChannel | None = None
        if self.ranks.leader:
            self.channel = SchedulerChannel(runtime.channel.for_dp_rank(self.ranks.dp_rank, self.ranks.dp_size),
                                            self.handle)
            if self.s.idle_sleeper is not None:  # SGLang sleeps on its own sockets when idle: wake it for ours too
                import zmq

                self.s.idle_sleeper.poller.register(self.channel.control, zmq.POLLIN)
        self.kv = KVSide(scheduler, runtime.kv_store, self.counters, self.ranks)
        self.released: dict[int, float] = {}  # bootstrap room -> expiry (monotonic)
        # Requests taken off here, until SGLang has dropped them from its queues: a queued request stays there until
        # the abort is processed, and the next poll's release of late arrivals would take it again -- with a second
        # record replacing the first (one that counted an instance death, issue 29).
        self.taken: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.lost: dict[tuple[str, int], float] = {}  # a dead prefill's bootstrap address -> expiry
        self.first_seen: dict[str, float] = {}  # rid -> when a queued request was first seen (bounded by the queues)
        self.decoding: set[str] = set()  # rids of the running batch at the last poll (bounded by the batch)

    # -- loop ---------------------------------------------------------------------------------------------------
    def role(self) -> str:
        return str(self.s.disaggregation_mode.value).lower()

    def _check_role(self) -> None:
        role = self.role()
        if role != self._checked_role:  # at start and after every rebuild
            sglang_internals.check_scheduler(self.s, role)
            self._checked_role = role

    def poll(self) -> None:
        self._check_role()
        self._serve_control()
        if self.released or self.lost:
            self._release_late_arrivals()
        self.kv.expire_holds(self._known_rids())
        self.counters.observe_busy(not self.quiet(), self.role())
        if self.channel is not None:
            self._report_decoding()

    def _serve_control(self) -> None:
        """Answer the waiting control messages. With several TP ranks (called at the same step on each), rank 0's
        messages are broadcast first, every rank handles them in order, and rank 0 alone answers."""
        if self.broadcast is None:
            if self.channel is not None:
                self.channel.poll()
            return
        waiting = self.channel.receive() if self.channel is not None else []
        raws = self.broadcast([raw for _, raw in waiting] if self.channel is not None else None)
        replies = [answer(self.handle, raw) for raw in raws]
        if self.channel is not None:
            for (envelope, _), reply in zip(waiting, replies):
                self.channel.reply(envelope, reply)

    def _push(self, record: MigratedRequest | Decoding) -> None:
        if self.channel is not None:  # TP rank 0 speaks for the group: one record per request, not one per rank
            self.channel.push(record)

    def _report_decoding(self) -> None:
        """Tell the engine side which requests joined the running (decode) batch since the last poll: their prefill
        is over. A prefill instance's running batch stays empty, so only the instance holding the caller reports."""
        reqs = self.s.running_batch.reqs
        if not reqs and not self.decoding:  # every idle poll, and always on a prefill instance
            return
        current = {r.rid for r in reqs if not str(r.rid).startswith(HEALTH_CHECK_RID_PREFIX)}
        new = current - self.decoding
        self.decoding = current
        if new:
            self._push(Decoding(rids=tuple(new), ts=time.time()))

    def handle(self, msg: Any) -> Any:
        if isinstance(msg, Status):
            return self.status(msg.since)
        if isinstance(msg, Inventory):
            return self.inventory()
        if isinstance(msg, MigrateOut):
            return self.migrate_out(msg)
        if isinstance(msg, ReleaseRooms):
            return self.release(msg)
        if isinstance(msg, LoadPrefix):
            return self.kv.load_prefix(msg)
        if isinstance(msg, ForgetPrefill):
            return self.forget_prefill(msg)
        if isinstance(msg, PeerLost):
            return self.peer_lost(msg)

        raise TypeError(f"unknown prorsa control message {type(msg).__name__}")

    # -- what is here ---------------------------------------------------------------------------------------------
    def _decode_queue_items(self) -> list[Any]:
        if self.role() != "decode":
            return []
        return list(self.s.disagg_decode_prealloc_queue.queue) + list(self.s.disagg_decode_transfer_queue.queue)

    def _prefill_not_started(self) -> list[Any]:
        if self.role() != "prefill":
            return []
        chunked = self.s.chunked_req
        return [r for r in self.s.waiting_queue if r is not chunked] + list(self.s.disagg_prefill_bootstrap_queue.queue)

    def _running(self) -> list[Any]:
        return [r for r in self.s.collect_inflight_reqs() if not r.finished()]

    def _known_rids(self) -> tuple[set[str], set[str]]:
        """(rids waiting to be scheduled, rids past scheduling)."""
        pending = {r.rid for r in self.s.waiting_queue}
        if self.role() == "prefill":
            pending |= {r.rid for r in self.s.disagg_prefill_bootstrap_queue.queue}
            past = {r.rid for r in self.s.disagg_prefill_inflight_queue}
        else:
            past = set()
        if self.s.chunked_req is not None:
            past.add(self.s.chunked_req.rid)
        past |= {r.rid for r in self._running()}
        return pending, past

    def quiet(self) -> bool:
        queues = self._decode_queue_items() or (self.role() == "prefill" and (
            self.s.disagg_prefill_bootstrap_queue.queue or self.s.disagg_prefill_inflight_queue))
        return bool(self.s.is_fully_idle()) and not self.s.waiting_queue and not queues

    def inventory(self) -> InventoryResult:
        if self.role() == "decode":
            with_kv = [r.rid for r in self._running()] + [r.rid for r in self.s.waiting_queue]
            staged = ([(item.req, "prealloc") for item in self.s.disagg_decode_prealloc_queue.queue]
                      + [(item.req, "transfer") for item in self.s.disagg_decode_transfer_queue.queue])
        else:
            with_kv = sorted(self._known_rids()[1])
            bootstrapping = list(self.s.disagg_prefill_bootstrap_queue.queue)
            in_bootstrap = {id(r) for r in bootstrapping}
            staged = ([(r, "waiting") for r in self._prefill_not_started() if id(r) not in in_bootstrap]
                      + [(r, "bootstrapping") for r in bootstrapping])
        now = time.monotonic()
        seen = {r.rid: self.first_seen.get(r.rid, now) for r, _ in staged}
        self.first_seen = seen  # only what is queued now: bounded
        queued = [_queued(r, now - seen[r.rid], stage) for r, stage in staged]
        return InventoryResult(role=self.role(), with_kv=with_kv, queued=queued)

    def status(self, since: int = -1) -> StatusResult:
        running = self._running()
        queued = len(self.s.waiting_queue) + len(self._decode_queue_items())
        if self.role() == "prefill":
            queued += len(self.s.disagg_prefill_bootstrap_queue.queue) + len(self.s.disagg_prefill_inflight_queue)
        footprint, capacity, cached = self.kv.occupancy()
        return StatusResult(
            role=self.role(), idle=self.quiet(), running=len(running), queued=queued,
            counters=self.counters.snapshot(), kv_footprint_tokens=footprint, kv_capacity_tokens=capacity,
            prefix_cache_tokens=cached, busy_intervals=self.counters.intervals_since(since),
        )

    def forget_prefill(self, msg: ForgetPrefill) -> int:
        """A prefill back under a new epoch (restarted, rebuilt, answering again): its old endpoints are dropped and
        halves bound to it are served again. Before this, one restarted at the same address within ``PeerLost.ttl_s``
        had every continuation sent to it released on arrival, until the holder ran out of moves (a CI failure)."""
        for address in msg.addresses:
            self.lost.pop(address, None)
        return self._forget_endpoints(msg.addresses)

    def _forget_endpoints(self, addresses: frozenset[tuple[str, int]]) -> int:
        """SGLang's decode KV manager caches, per prefill bootstrap address, the prefill's parallel info and its
        transfer endpoints; a prefill whose role was rebuilt keeps its bootstrap address but gets new endpoints.
        SGLang's own handler for a lost prefill drops exactly those entries (no request is bound to a drained one)."""
        if self.role() != "decode":
            return 0
        from sglang.srt.utils.network import NetworkAddress

        manager = self.s.disagg_decode_prealloc_queue.kv_manager
        forgotten = 0
        for host, port in addresses:
            addr = NetworkAddress(host, port).to_host_port_str()
            if addr in manager.prefill_info_table or any(k.startswith(addr) for k in manager.connection_pool):
                manager._handle_node_failure(addr)
                forgotten += 1
        return forgotten

    # -- taking requests off --------------------------------------------------------------------------------------
    def migrate_out(self, msg: MigrateOut) -> MigrateOutResult:
        t0 = time.perf_counter()
        taken: list[str] = []
        rooms: list[int] = []
        blocks = nbytes = 0
        if self.role() == "decode":
            for req in _unique(self._running() + list(self.s.waiting_queue)):
                record, b, n = self.kv.persist(req, self._record(req, Stage.RUNNING))
                blocks, nbytes = blocks + b, nbytes + n
                self._take(req, record, Code.MIGRATED)
                taken.append(req.rid)
            queued = [item.req for item in self._decode_queue_items() if item.req.rid in msg.queued_rids]
            code = Code.MIGRATED
        else:
            queued = [req for req in self._prefill_not_started() if req.rid in msg.queued_rids]
            code = Code.HANDED_ON
        for req in queued:
            self._take(req, self._record(req, Stage.QUEUED, keep_output=False), code)
            taken.append(req.rid)
            if req.bootstrap_room is not None:
                rooms.append(req.bootstrap_room)
        self.counters.add("requests_migrated_out", len(taken))
        elapsed = time.perf_counter() - t0
        left = len(self._known_rids()[1]) if self.role() == "prefill" else 0
        logger.info("prorsa: took %d requests off (%d KV blocks, %.1f MB) in %.3f s", len(taken), blocks,
                    nbytes / 1e6, elapsed)
        return MigrateOutResult(role=self.role(), rids=taken, rooms=rooms, persist_s=elapsed, persisted_bytes=nbytes,
                                persisted_blocks=blocks, left_running=left)

    def release(self, msg: ReleaseRooms) -> ReleaseResult:
        rids, rooms = self._release_matching(set(msg.rooms), msg.only_not_started)
        logger.info("prorsa: release of rooms %s (only not started: %s) took %s", sorted(msg.rooms),
                    msg.only_not_started, rooms)
        # Remember what was released (everything, unless the caller let started prefills stay) for late arrivals.
        expiry = time.monotonic() + msg.ttl_s
        for room in (rooms if msg.only_not_started else msg.rooms):
            self.released[room] = expiry
        return ReleaseResult(rids=rids, rooms=rooms)

    def _release_late_arrivals(self) -> None:
        now = time.monotonic()
        for room in [r for r, t in self.released.items() if t < now]:
            del self.released[room]
        for addr in [a for a, t in self.lost.items() if t < now]:
            del self.lost[addr]
        if self.released:
            self._release_matching(set(self.released))
        if self.lost:
            self._release_bound_to(set(self.lost))

    def peer_lost(self, msg: PeerLost) -> ReleaseResult:
        address = (msg.host, msg.port)
        if msg.dead and msg.ttl_s > 0:
            self.lost[address] = time.monotonic() + msg.ttl_s
        self._forget_endpoints(frozenset({address}))
        return self._release_bound_to({address}, deaths=1 if msg.dead else 0)

    def _release_bound_to(self, addresses: set[tuple[str, int]], deaths: int = 0) -> ReleaseResult:
        """Decode halves waiting for KV from a dead prefill instance: continued elsewhere by their holder. Those
        waiting when it died count its death (``deaths``); late arrivals bound to it do not."""
        rooms = {item.req.bootstrap_room for item in self._decode_queue_items()
                 if (item.req.bootstrap_host, item.req.bootstrap_port) in addresses}
        rids, taken = self._release_matching(rooms, deaths=deaths) if rooms else ([], [])
        return ReleaseResult(rids=rids, rooms=taken)

    def _release_matching(self, rooms: set[int], only_not_started: bool = False,
                          deaths: int = 0) -> tuple[list[str], list[int]]:
        """Take off the halves of these PD pairs: on decode, those still waiting for their KV (their holder continues
        them); on prefill, those not started -- or every stage unless ``only_not_started`` -- answered as handed on."""
        if self.role() == "decode":
            reqs, code = [item.req for item in self._decode_queue_items()], Code.MIGRATED
        elif self.role() == "prefill":
            reqs, code = self._prefill_not_started(), Code.HANDED_ON
            if not only_not_started:
                reqs += list(self.s.disagg_prefill_inflight_queue)
                if self.s.chunked_req is not None:
                    reqs.append(self.s.chunked_req)
        else:
            return [], []
        rids, taken_rooms = [], []
        for req in _unique(reqs):
            if req.bootstrap_room in rooms and not req.finished() and req.rid not in self.taken:
                self._take(req, self._record(req, Stage.QUEUED, keep_output=False, deaths=deaths), code)
                rids.append(req.rid)
                taken_rooms.append(req.bootstrap_room)
        return rids, taken_rooms

    def _record(self, req: Any, stage: Stage, keep_output: bool = True, deaths: int = 0) -> MigratedRequest:
        from sglang.srt.utils.weight_versions import compute_weight_version_spans

        output = list(req.output_ids) if keep_output else []
        spans = compute_weight_version_spans(req.weight_version_events, current_version=self._weight_version(),
                                             num_output_tokens=len(output)) if output else []
        return MigratedRequest(
            rid=req.rid, role=self.role(), stage=stage, input_ids=list(req.origin_input_ids), output_ids=output,
            sampling_params=sampling_dict(req) if keep_output else sampling_dict(_NoOutput(req)),
            bootstrap_room=req.bootstrap_room, bootstrap_host=req.bootstrap_host, bootstrap_port=req.bootstrap_port,
            weight_versions=[(s.version, s.start, s.end) for s in spans], deaths=deaths,
        )

    @staticmethod
    def _weight_version() -> str:
        from sglang.srt.runtime_context import get_serving

        return str(get_serving().weight_version)

    def _take(self, req: Any, record: MigratedRequest, code: Code) -> None:
        """Push the record, then abort the request here with our typed reason."""
        self._push(record)
        self.taken[req.rid] = None
        while len(self.taken) > MAX_TAKEN_REMEMBERED:
            self.taken.popitem(last=False)
        wasted = self.counters.discard(req.rid)
        if wasted:
            logger.warning("prorsa: %s taken off after %d of its prompt tokens were computed here (%s)", req.rid,
                           wasted, code.value)
        reason = _abort_reason(code)
        if req in self._running():
            req.to_finish = reason  # SGLang's abort of a running request: ends after its next forward pass
            return
        self._abort_queued(req.rid, reason)

    def _abort_queued(self, rid: str, reason: Any) -> None:
        from sglang.srt.managers.io_struct import AbortReq

        # SGLang's abort matches rids by prefix; make sure this one names no other request here.
        pending, past = self._known_rids()
        others = {i.req.rid for i in self._decode_queue_items()} | pending | past
        clash = [r for r in others if r != rid and r.startswith(rid)]
        if clash:
            logger.warning("prorsa: rid %s is a prefix of %s; it is left to finish here", rid, clash[:3])
            return
        self.s.abort_request(AbortReq(rid=rid, finished_reason=reason.to_json()))


class _NoOutput:
    """A request seen as not started: its whole budget remains."""

    def __init__(self, req: Any) -> None:
        self.sampling_params = req.sampling_params
        self.output_ids: list[int] = []


def _queued(req: Any, waited_s: float = 0.0, stage: str = "") -> QueuedItem:
    return QueuedItem(rid=req.rid, bootstrap_room=req.bootstrap_room, bootstrap_host=req.bootstrap_host,
                      bootstrap_port=req.bootstrap_port, input_ids=tuple(req.origin_input_ids), waited_s=waited_s,
                      stage=stage)


def _contains(ids: list[int], marker: tuple[int, ...]) -> bool:
    n = len(marker)
    return any(tuple(ids[i:i + n]) == marker for i in range(len(ids) - n + 1))


def _unique(reqs: list[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for r in reqs:
        if r.rid not in seen:
            seen.add(r.rid)
            out.append(r)
    return out
