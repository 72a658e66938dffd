"""``EngineSide``: the one object of the engine extension in an instance's main process.

It builds this instance's collaborators once and hands each helper the ones it uses: the channel to the scheduler
(``LocalScheduler``) with the book of records the scheduler pushes, this instance's view of its peers and the one
client for every HTTP call to them (``PeerClient``), the other halves of its PD pairs (``PairHalves``), its admission,
SGLang's tokenizer manager (``TokenizerManagerView``), the abort-to-record logic (``AbortRecords``), continuations
(``Resumer``), the orphan check (``OrphanWatch``) and the switch in progress (``SwitchJob``). SGLang's tokenizer
manager calls into it through the wrappers in ``hooks.py``; the routes in ``routes.py``.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, AsyncIterator, Callable

from sglang_prorsa.config import InstanceSpec
from sglang_prorsa.srt.common.auth import AuthKeys
from sglang_prorsa.srt.common.channel import EngineChannels
from sglang_prorsa.srt.common.messages import RESUME_HEADER, Code, MigratedRequest, QueuedItem, Stage
from sglang_prorsa.srt.engine.aborts import AbortRecords
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.continuation import (
    Continuation,
    ResumeFailed,
    SuspectedPoison,
    handed_on_output,
    kept_from,
)
from sglang_prorsa.srt.engine.events import EngineEvents
from sglang_prorsa.srt.engine.local import Admission, LocalScheduler, TokenizerManagerView
from sglang_prorsa.srt.engine.peer_client import PairHalves, PeerClient
from sglang_prorsa.srt.engine.peers import PeerView
from sglang_prorsa.srt.engine.stitch import Shape, Stitcher
from sglang_prorsa.srt.engine.switch import SwitchJob
from sglang_prorsa.srt.engine.watchdog import OrphanWatch


class EngineSide:
    def __init__(self, spec: InstanceSpec, channel: EngineChannels, tokenizer_manager: Any,
                 keys: AuthKeys = AuthKeys()) -> None:
        self.spec = spec
        self.keys = keys
        self.instance_id = spec.instance_id
        self.channel = channel
        self.counters: collections.Counter[str] = collections.Counter()
        self.user_aborts = 0  # pause_generation(mode=abort) and abort-all calls seen (control_guard, middleware)
        self.ops_lock = asyncio.Lock()  # a busy switch and SGLang's control operations never interleave here
        self.held: set[str] = set()  # control states that hold switches (generation paused, memory released)
        self.switch: SwitchJob | None = None  # the switch in progress
        self.switches = 0
        self.started = False
        self.last_switch: dict[str, Any] | None = None
        # The collaborators, built once; each helper gets the ones it uses.
        self.tm_view = TokenizerManagerView(tokenizer_manager)
        self.book = RecordBook(drain=channel.drain)
        self.peers = PeerView(spec.instance_id)
        self.client = PeerClient(keys)
        self.pairs = PairHalves(self.peers, self.client)
        self.scheduler = LocalScheduler(channel.ranks, self.book, self.counters, self.tm_view.role)
        self.admission = Admission()
        self.events = EngineEvents(spec.controller_url, self.client)
        self.aborts = AbortRecords(self.book, self.counters, self.tm_view, self.pairs, lambda: self.user_aborts)
        self.resumer = Resumer(self.tm_view, self.peers, self.client, self.pairs, self.counters, self.instance_id,
                               lambda: self.user_aborts, self.serves_decode)
        self.orphan_watch = OrphanWatch(self.scheduler, self.pairs, self.counters)

    def serves_decode(self) -> bool:
        """Whether a decode request arriving here now would be served here (hooks.py hands it on otherwise)."""
        return (self.role == "decode" and self.switch is None and self.admission.admitting
                and not self.admission.rebuilding)

    async def start(self) -> None:
        """On the loop that serves the tokenizer manager, once: by the first HTTP request (``middleware.py``) or the
        first in-process ``generate_request`` (``hooks.py``), whichever comes first."""
        if self.started:
            return
        self.started = True
        loop = asyncio.get_running_loop()
        self.channel.attach(loop, self.book.put, self.events.decoding)
        self.events.start()
        self._watchdog = loop.create_task(
            self.orphan_watch.watch_forever(self.tm_view.role, lambda: self.switch is not None))

    @property
    def tm(self) -> Any:
        """SGLang's tokenizer manager (set by ``srt/instance/install.py`` once SGLang made it)."""
        return self.tm_view.tm

    @tm.setter
    def tm(self, tm: Any) -> None:
        self.tm_view.tm = tm

    @property
    def role(self) -> str:
        return self.tm_view.role()

    def switch_job(self, new_role: str, timeout_s: float, cpu: bool) -> SwitchJob:
        """A switch (or, with ``new_role`` = the current role, one sweep) of this instance, with its collaborators."""
        return SwitchJob(new_role, timeout_s, cpu, old_role=self.role, scheduler=self.scheduler, pairs=self.pairs,
                         admission=self.admission, orphans=self.orphan_watch, tm=self.tm_view)

    def status(self) -> dict[str, Any]:
        adm = self.admission
        return {"admitting": adm.admitting, "rebuilding": adm.rebuilding, "switching": self.switch is not None,
                "held_by": sorted(self.held),
                "switches": self.switches, "last_switch": self.last_switch, "resuming": self.resumer.resuming,
                "entering": adm.entering, "records_waiting": len(self.book), "engine_counters": dict(self.counters),
                "peers_version": self.peers.version}


# -- continuing requests where the caller waits -----------------------------------------------------------------------
# Two ways in: a request taken off here (a record says how far it got; ``hooks.wrap_stream_one_response``), and a
# request handed on at arrival (a switch is running, admission is closed, or it was meant for the other role;
# ``hooks.wrap_generate_request``). A prefill half is answered as handed on (its decode half holds the caller); a
# decode half, or a colocated request, is continued on another pair (``continuation.py``) and stitched.
_FORWARDED = ("x-trajectory-id", "x-smg-routing-key")


def forwarded_headers(request: Any) -> dict[str, str]:
    if request is None:
        return {}
    return {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}


class _NoState:
    """The tokenizer manager's state of a request that never reached the scheduler here."""

    # What continuation.kept_from reads of SGLang's ReqState: nothing was produced here.
    output_token_logprobs = output_top_logprobs = output_token_ids_logprobs = ()

    def __init__(self, obj: Any) -> None:
        self.obj = obj


class Resumer:
    def __init__(self, tm: TokenizerManagerView, peers: PeerView, client: PeerClient, pairs: PairHalves,
                 counters: collections.Counter[str], instance_id: str,
                 user_aborts: Callable[[], int] = lambda: 0, decode_here: Callable[[], bool] = lambda: False) -> None:
        self.tm = tm
        self.user_aborts = user_aborts  # the trainer's abort-all calls seen here (EngineSide.user_aborts)
        self.decode_here = decode_here  # this instance serves decode now: a continuation may stay (Continuation)
        self.peers = peers
        self.client = client
        self.pairs = pairs
        self.counters = counters
        self.instance_id = instance_id
        self.resuming = 0  # requests being continued elsewhere now

    async def resume(self, obj: Any, state: Any, record: MigratedRequest, last_out: dict | None,
                     delivered: tuple[int, int], headers: dict[str, str],
                     aborts_at_entry: int | None = None) -> AsyncIterator[dict[str, Any]]:
        """Continue ``obj`` (taken off here as ``record``) elsewhere, giving the caller the stitched outputs.
        ``aborts_at_entry``: the trainer aborts this instance had seen when the request arrived; one more (an
        abort-all, a pause in abort mode) ends the continuation as aborted (``Continuation.aborted``)."""
        if record.role == "prefill":  # the decode half holds the caller and continues it
            self.counters["handed_on"] += 1
            yield handed_on_output(obj.rid, len(record.input_ids), self.tm.weight_version())
            return
        kept = kept_from(record, state, last_out, delivered,
                         self.tm.routed_experts_row_bytes() if getattr(obj, "return_routed_experts", False) else 0)
        sp = obj.sampling_params or {}
        stop = sp.get("stop") or []
        stops = [stop] if isinstance(stop, str) else list(stop)
        stitcher = Stitcher(obj.rid, kept, Shape(bool(obj.stream), self.tm.incremental_streaming),
                            self.tm.decoder(obj, record.input_ids), stop=stops,
                            no_stop_trim=bool(sp.get("no_stop_trim", False)))
        self.counters["resumed" if record.stage is Stage.RUNNING else "restarted"] += 1
        self.resuming += 1
        aborts_at_start = self.user_aborts() if aborts_at_entry is None else aborts_at_entry
        try:
            continuation = Continuation(obj, record, stitcher, headers, peers=self.peers, client=self.client,
                                        counters=self.counters, holder=self.instance_id,
                                        aborted=lambda: self.user_aborts() != aborts_at_start,
                                        decode_here=self.decode_here)
            async for out in continuation.run():
                yield out
        except SuspectedPoison as e:
            import fastapi

            raise fastapi.HTTPException(status_code=502, detail=str(e)) from None  # the message leads with the code
        except ResumeFailed as e:
            self.counters["resume_failed"] += 1
            import fastapi

            # SGLang's error handler takes a string detail (a dict made it fail with a 500): the code leads it.
            raise fastapi.HTTPException(status_code=503, detail=f"{Code.RESUME_FAILED.value}: {e}") from e
        finally:
            self.resuming -= 1

    async def hand_on_at_arrival(self, obj: Any, request: Any, role_header: str | None) -> AsyncIterator[dict]:
        """A single request this instance will not serve (a switch is running, admission is closed, or it was
        meant for the other role): a prefill half is answered as handed on after the decode peers released it; a
        decode half (or a colocated request) is continued elsewhere from its prompt, its prefill half released."""
        half = role_header or self.tm.role()
        input_ids = await self.tm.prompt_ids(obj)
        room = obj.bootstrap_room
        if half == "prefill":
            if room is not None:
                await self.pairs.release_decode_halves([room])
            self.counters["handed_on"] += 1
            yield handed_on_output(obj.rid, len(input_ids), self.tm.weight_version())
            return
        if room is not None:  # its prefill half answers as handed on (even if it began: we cannot receive its KV)
            await self.pairs.release_prefill_halves([QueuedItem(obj.rid, room, obj.bootstrap_host,
                                                                obj.bootstrap_port)], only_not_started=False)
        if request is not None and request.headers.get(RESUME_HEADER) is not None:
            # A continuation: its holder knows the persisted KV and retries elsewhere, loading it (aborts.HandedBack).
            self.counters["continuations_handed_back"] += 1
            raise ValueError(f"prorsa: continuation {obj.rid} handed back to its holder ({Code.HANDED_ON.value})")
        record = MigratedRequest(rid=obj.rid, role="decode", stage=Stage.QUEUED, input_ids=input_ids,
                                 output_ids=[], sampling_params={}, bootstrap_room=room,
                                 bootstrap_host=obj.bootstrap_host, bootstrap_port=obj.bootstrap_port)
        async for out in self.resume(obj, _NoState(obj), record, None, (0, 0), forwarded_headers(request)):
            yield out
