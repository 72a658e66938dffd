"""The two places the engine extension joins SGLang's tokenizer manager (registered in ``srt/instance/overrides.py``).

``generate_request`` is wrapped twice. The outer wrapper refuses, with a 400 naming the field, a request that would
crash the scheduler (``request_guard.py``). The inner one (every generation caller: ``/generate``, the OpenAI routes, in-process callers) passes
through unchanged unless this instance will not serve the request (a switch is running, admission is closed, or the
request names the other role): then it is handed on at arrival.

``_stream_one_response`` (one request's outputs, streamed or not, single or batch) passes outputs through until
the request ends with an abort that a record continues (``aborts.py``: the scheduler took it off, or SGLang lost its
KV transfer): then the request is continued elsewhere and the caller gets the stitched outputs instead of the abort
(``Resumer.resume``).
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from sglang_prorsa.policy.lifecycle.engine_api import SGLANG_ID_FIELDS, strip_carried_id, trajectory_id_of
from sglang_prorsa.srt.common.messages import RESUME_HEADER, ROLE_HEADER
from sglang_prorsa.srt.common.parallel import dp_ranks
from sglang_prorsa.srt.engine import aborts, in_process, request_guard
from sglang_prorsa.srt.engine.aborts import HandedBack
from sglang_prorsa.srt.engine.continuation import aborted_output
from sglang_prorsa.srt.engine.local import Admission, keep_prompt_ids
from sglang_prorsa.srt.engine.side import EngineSide, forwarded_headers

logger = logging.getLogger(__name__)

ENGINE: EngineSide | None = None  # set once per instance process by srt/instance/install.py
_INPUT_ERRORS = (TypeError, AttributeError, KeyError, IndexError, OverflowError)


class _Entry:
    """One generation request between arrival and reaching the scheduler (counted for a switch's quiet check)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.open = True
        admission.entering += 1

    def close(self) -> None:
        if self.open:
            self.open = False
            self.admission.entering -= 1


_ENTRY: contextvars.ContextVar[_Entry | None] = contextvars.ContextVar("prorsa_entry", default=None)


def _header(request: Any, name: str) -> str | None:
    return request.headers.get(name) if request is not None else None


def wrap_generate_request(original):
    async def generate_request(self, obj, request=None):
        from sglang.srt.managers.io_struct import GenerateReqInput

        side = ENGINE
        if side is None or not isinstance(obj, GenerateReqInput):
            async for out in original(self, obj, request):
                yield out
            return
        if not side.started:  # an in-process caller before any HTTP request (sglang_prorsa.engine.Engine)
            await side.start()
        obj._prorsa_trajectory = trajectory_of(obj, request)  # ours (not SGLang's); a batch's items never carry it
        if side.admission.rebuilding:  # the scheduler is mid-rebuild: nothing reaches it until its new role is up
            await side.admission.rebuilt()
        if _single(obj) and in_process.needs_pairing(obj, request, side.role):
            if not in_process.pairs_here(side):
                obj.normalize_batch_and_arguments()
                async for out in side.resumer.hand_on_at_arrival(obj, None, "decode"):
                    yield out
                return
            await in_process.send_prefill_half(side, obj)
        role = _header(request, ROLE_HEADER)
        if _single(obj) and side.role in ("prefill", "decode") and (
                not side.admission.admitting or (role is not None and role != side.role)) and not _swept_later(
                    side, obj, role):
            obj.normalize_batch_and_arguments()
            async for out in side.resumer.hand_on_at_arrival(obj, request, role):
                yield out
            return
        entry = _Entry(side.admission)
        _ENTRY.set(entry)  # this task's context: the generator may be finalised elsewhere, so it is never reset
        try:
            async for out in original(self, obj, request):
                yield out
        except _INPUT_ERRORS as e:
            if not entry.open:
                raise  # the scheduler had the request: not a refusal of its input
            # SGLang failed on this input while normalising or tokenizing it: the caller's 400, not a 500.
            raise request_guard.RequestRefused("body", f"{type(e).__name__}: {e}"[:300]) from e
        finally:
            entry.close()

    return generate_request


def wrap_generate_request_guard(original):
    """Every generation request, on every instance (an engine of ours or not): refused with a 400 naming the field
    if it would crash the scheduler (``request_guard.py``)."""

    async def generate_request(self, obj, request=None):
        from sglang.srt.managers.io_struct import GenerateReqInput

        try:
            if isinstance(obj, GenerateReqInput):
                request_guard.check(obj, _limits(self))
            async for out in original(self, obj, request):
                yield out
        except ValueError:
            # hasattr: SGLang sets is_single only in normalize_batch_and_arguments
            if isinstance(obj, GenerateReqInput) and not hasattr(obj, "is_single"):
                # Refused before SGLang normalised it: SGLang's streaming route still schedules its abort task,
                # which reads ``is_single`` -- missing, it raised and dropped the caller's connection unanswered.
                obj.is_single = not isinstance(obj.rid, list)
            raise

    return generate_request


def _limits(tm: Any) -> request_guard.Limits:
    """This tokenizer manager's limits, read once from SGLang's server arguments."""
    limits = getattr(tm, "_prorsa_limits", None)  # ours, set below on first use (not an SGLang attribute)
    if limits is None:
        args = tm.server_args
        limits = tm._prorsa_limits = request_guard.Limits(
            vocab_size=tm.model_config.vocab_size,
            role=str(args.disaggregation_mode or "null").lower(),
            grammar=str(args.grammar_backend or "").lower() != "none", dp_size=dp_ranks(args))
    return limits


def wrap_validate_one_request(original):
    """Every prompt once tokenized, single or in a batch: refused if empty (``request_guard.check_tokenized``)."""

    def _validate_one_request(self, obj, input_ids):
        from sglang.srt.managers.io_struct import GenerateReqInput

        if isinstance(obj, GenerateReqInput):
            request_guard.check_tokenized(obj, input_ids)
        return original(self, obj, input_ids)

    return _validate_one_request


def wrap_tokenize_one_request(original):
    async def _tokenize_one_request(self, obj):
        tokenized = await original(self, obj)
        if ENGINE is not None:
            keep_prompt_ids(obj, tokenized)
        return tokenized

    return _tokenize_one_request


def _swept_later(side: EngineSide, obj: Any, role: str | None) -> bool:
    """A decode half reaching a decode instance whose switch is still sweeping is admitted: the next sweep moves it
    with its prefill side deciding, so a prefill that already began is received and resumed from its KV, not
    thrown away (handing it on at arrival would release a prefill half that may have finished)."""
    return (side.switch is not None and not side.admission.rebuilding and side.role == "decode"
            and role in (None, "decode") and obj.bootstrap_room is not None)


def _single(obj: Any) -> bool:
    """One prompt, one sample (checked before SGLang normalises the request, which must happen only once)."""
    sp = obj.sampling_params if isinstance(obj.sampling_params, dict) else {}
    ids = obj.input_ids
    one_prompt = isinstance(obj.text, str) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], int))
    return one_prompt and obj.input_embeds is None and int(sp.get("n", 1) or 1) == 1


def trajectory_of(obj: Any, request: Any) -> str | None:
    """The trajectory a single request belongs to, read by ``engine_api.trajectory_id_of`` from SGLang's own fields
    on ``obj`` (an in-process caller has no HTTP request) and the request's headers (the middleware moved a
    ``trajectory_id`` body field into ``X-Trajectory-Id``). An id carried in ``custom_params`` (verl's agent loop,
    ``engine_api.carried_id``) is removed from the sampling parameters here, before the scheduler sees them. None
    for a batch (several prompts, or ``n`` > 1): a trajectory is one request at a time, and a batch's prompts under
    one id would be concurrent arrivals of one trajectory, which the tracker rejects."""
    params = obj.sampling_params
    fields = {name: getattr(obj, name, None) for name in SGLANG_ID_FIELDS}
    tid = trajectory_id_of({**fields, "sampling_params": params}, request.headers if request is not None else None)
    for one in params if isinstance(params, list) else [params]:  # a batch may carry one dict per prompt
        strip_carried_id(one)
    return tid if _single(obj) else None


def wrap_stream_one_response(original):
    async def _stream_one_response(self, obj, state, request=None):
        side = ENGINE
        entry = _ENTRY.get()
        if entry is not None:
            entry.close()  # the request is with the scheduler now
        from sglang.srt.managers.io_struct import GenerateReqInput

        if side is None or not isinstance(obj, GenerateReqInput):  # an EmbeddingReqInput is not ours to resume
            async for out in original(self, obj, state, request):
                yield out
            return
        report = side.events.enabled and side.role != "prefill" and _header(request, RESUME_HEADER) is None
        # Set by wrap_generate_request on the caller's object; SGLang hands a batch's items here as new objects.
        tid = getattr(obj, "_prorsa_trajectory", None) if report else None
        if tid:
            side.events.arrived(obj.rid, tid, len(await side.tm_view.prompt_ids(obj)), _prefill_of(side, obj))
        aborts_at_entry = side.user_aborts
        ids = text = 0  # what the caller has received so far (streaming)
        incremental = bool(obj.stream) and bool(self.incremental_streaming_output)
        first = True
        ended = False

        def report_end(output_tokens: int) -> None:
            nonlocal ended
            if tid and not ended:
                ended = True
                side.events.prefilled(obj.rid)  # a request resumed elsewhere before its first output here
                side.events.decoded(tid, output_tokens)

        def deliver(out: dict, final: bool) -> dict:
            """Every output the caller receives passes here: counts what it has, and reports decode_end before the
            final one is yielded (SGLang's non-streaming /generate takes one output with ``__anext__`` and never
            resumes this generator, so nothing after the last yield runs for it)."""
            nonlocal ids, text
            ids, text = _delivered(out, ids, text, incremental)
            if final:
                report_end(ids)
            return out

        try:
            async for out in original(self, obj, state, request):
                if state.finished and aborts.is_final_abort(out):
                    record = await side.aborts.record_for_output(obj, state, out, request, ids, aborts_at_entry)
                    if record is not None:
                        async with _model_lock_released(self):
                            async for resumed in side.resumer.resume(obj, state, record, out, (ids, text),
                                                                     forwarded_headers(request), aborts_at_entry):
                                yield deliver(resumed, _finished(resumed))
                        break  # this abort was the last output of the scheduler's request
                if first and tid:
                    side.events.prefilled(obj.rid)  # unless the scheduler's Decoding note came first
                    first = False
                yield deliver(out, state.finished)
        except HandedBack:
            raise  # ours, for the holder of this continuation: not an abort of SGLang's to continue from
        except Exception as e:  # SGLang raises for aborts that carry an HTTP status (a failed KV transfer, ...)
            if not aborts.is_abort_exception(e, state):
                raise
            record = await side.aborts.record_for_raise(obj, request, ids, aborts_at_entry)
            if record is None:
                if side.user_aborts == aborts_at_entry or ids:
                    raise
                # SGLang fails a PD half whose transfer a pause(abort) or abort-all cut with an HTTP error; the
                # trainer asked for an abort, so it gets one, in the shape of every other aborted request.
                yield deliver(aborted_output(obj.rid, len(await side.tm_view.prompt_ids(obj)), "aborted by the "
                                             "trainer (pause_generation abort or abort_request abort_all)",
                                             side.tm_view.weight_version()), True)
                return
            async with _model_lock_released(self):
                async for resumed in side.resumer.resume(obj, state, record, None, (ids, text),
                                                         forwarded_headers(request), aborts_at_entry):
                    yield deliver(resumed, _finished(resumed))
        report_end(ids)  # a response that ended without a final output

    return _stream_one_response


class _model_lock_released:
    """While a taken-off request continues on other instances, it gives back the reader lock SGLang's
    ``generate_request`` holds on this instance's ``model_update_lock`` for the whole response.

    This scheduler no longer has the request, so a weight update or pause here has nothing to wait for; holding the
    lock would deadlock across instances: SGLang's lock prefers writers, so an update waiting here blocks new requests
    here, while this instance's own update waits for the continuation, which may need an instance whose update waits
    the same way. On leaving, the count is restored without waiting (the ``async with`` of SGLang releases it once
    more when the response ends)."""

    def __init__(self, tm: Any) -> None:
        self.lock = tm.model_update_lock

    async def __aenter__(self) -> None:
        await self.lock.release_reader()

    async def __aexit__(self, *exc: Any) -> None:
        async with self.lock._lock:  # sglang.srt.utils.aio_rwlock.RWLock internals, checked at start-up
            self.lock._readers += 1


def _finished(out: dict) -> bool:
    return (out.get("meta_info") or {}).get("finish_reason") is not None


def _delivered(out: dict, ids: int, text: int, incremental: bool) -> tuple[int, int]:
    """(output ids, text characters) the caller has after ``out``: summed for incremental streams, else the last."""
    n_ids, n_text = len(out.get("output_ids") or []), len(out.get("text") or "")
    return (ids + n_ids, text + n_text) if incremental else (n_ids, n_text)


def _prefill_of(side: EngineSide, obj: Any) -> str:
    peer = side.peers.by_bootstrap(obj.bootstrap_host, obj.bootstrap_port)
    return peer.instance_id if peer is not None else side.instance_id
