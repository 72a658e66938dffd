"""The instance's last line before its scheduler: refuse a generation request that would crash it (issue 29).

SGLang 0.5.23 validates the shape of a ``GenerateReqInput`` only partly. What it lets through is sent to the
scheduler process, and several such inputs end there in an exception that kills the scheduler -- and every request
on the instance with it -- for example a list ``bootstrap_room`` on a single prompt (``TypeError: unhashable type:
'list'`` in the PD bootstrap), a token id outside the vocabulary (the embedding's index error), a per-prompt field
given as a list on a single prompt, or ``top_logprobs_num`` above the vocabulary. Others end in a 500 on the
tokenizer side (a sampling parameter of the wrong type). ``check`` refuses all of them with ``RequestRefused``, a
``ValueError`` whose message starts ``field '<name>': `` -- SGLang's routes answer a ValueError with 400, and the
instance's middleware adds the field to the JSON body.

The request's shape is read as SGLang reads it (``GenerateReqInput._determine_batch_size``): ``text`` first, then
``input_ids``, then ``input_embeds``; ``n > 1`` makes a single prompt a batch. Registered in ``srt/instance/overrides.py``
(``tokenizer_manager_refuse_scheduler_crashers``): it runs in our ``generate_request`` wrapper for every
``GenerateReqInput``, whatever route or in-process caller made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_N = 1024  # parallel samples of one prompt: more would be a denial of service rather than a request
MAX_ROOM = 2**63  # Mooncake's bootstrap room is a signed 64-bit key; SGLang adds the prompt's index to a scalar room
MAX_HOST_CHARS = 253  # a DNS name's limit
# Fields that SGLang splits per prompt (``GenerateReqInput.__getitem__``): one value for all, or one per prompt.
PER_PROMPT = ("rid", "return_logprob", "logprob_start_len", "top_logprobs_num", "return_sampling_mask",
              "lora_path", "lora_id", "custom_logit_processor", "extra_key", "cache_salt", "return_hidden_states")
PD_FIELDS = ("bootstrap_room", "bootstrap_host", "bootstrap_port", "bootstrap_pair_key", "decode_tp_size")
_SCALAR_TYPES: dict[str, tuple[type, ...]] = {
    "rid": (str,), "return_logprob": (bool,), "logprob_start_len": (int,), "top_logprobs_num": (int,),
    "return_sampling_mask": (bool,), "lora_path": (str,), "lora_id": (str,), "custom_logit_processor": (str,),
    "extra_key": (str,), "cache_salt": (str,), "bootstrap_host": (str,), "bootstrap_pair_key": (str,),
    "bootstrap_port": (int,), "bootstrap_room": (int,), "decode_tp_size": (int,),
}


@dataclass(frozen=True)
class Limits:
    """What this instance can serve (from SGLang's server arguments, read once per tokenizer manager)."""

    vocab_size: int | None
    role: str = "null"  # SGLang's disaggregation mode: "prefill" or "decode" serve one half of each pair
    grammar: bool = True  # a grammar backend is configured (--grammar-backend none: no)
    dp_size: int = 1

    @property
    def pd(self) -> bool:
        return self.role in ("prefill", "decode")


GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")
INT32 = 2**31  # the scheduler packs sampling parameters into int32 tensors: top_k = 2**63-1 overflowed and killed it
INT64_KEYS = ("sampling_seed",)  # SGLang verifies these itself, as 64-bit
# SGLang 0.5.23's PD metadata buffers hold this many top logprobs per request (MetadataBuffers' default
# max_top_logprobs_num); a prefill scheduler asked for more raised and died.
PD_MAX_TOP_LOGPROBS = 128


class RequestRefused(ValueError):
    """A request the instance will not schedule; ``field`` names what is wrong (the message starts with it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field '{field}': {message}")
        self.field = field


@dataclass(frozen=True)
class Shape:
    """How SGLang will split the request: ``prompts`` given, each sampled ``n`` times."""

    prompts: int
    single: bool  # one prompt given as a single value (before n expands it)
    n: int

    @property
    def requests(self) -> int:
        return self.prompts * self.n


def check(obj: Any, limits: Limits | int | None) -> Shape:
    """Refuse ``obj`` (a ``GenerateReqInput`` before SGLang normalises it) if it would crash the scheduler, or if
    one half of a PD pair would refuse it while the other half waits for it (its KV) in vain."""
    limits = limits if isinstance(limits, Limits) else Limits(vocab_size=limits)
    vocab_size = limits.vocab_size
    shape = shape_of(obj)
    _check_role_support(obj, shape, limits)
    _check_input_ids(obj.input_ids, shape, vocab_size, text_given=obj.text is not None)
    _check_sampling_params(obj.sampling_params, shape)
    _check_sampling_values(obj.sampling_params, vocab_size)
    for name in PD_FIELDS + PER_PROMPT:
        _check_per_prompt(name, getattr(obj, name), shape)  # GenerateReqInput fields (sglang_internals)
    _check_ranges(obj, shape, vocab_size)
    _check_sampling_ints(obj.sampling_params)
    _check_pd_limits(obj, limits)
    overrides = obj.positional_embed_overrides
    if overrides is not None and type(overrides).__name__ != "PositionalEmbeds":
        # Only an in-process caller can build SGLang's PositionalEmbeds; any JSON value killed the scheduler.
        raise RequestRefused("positional_embed_overrides", "is not accepted over HTTP (must be null)")
    return shape


def _check_sampling_ints(params: Any) -> None:
    for p in params if isinstance(params, list) else [params]:
        if not isinstance(p, dict):
            continue
        for key, value in p.items():
            if key not in INT64_KEYS and _too_big(value):
                raise RequestRefused("sampling_params", f"{key}: integers must lie in [-2**31, 2**31)")


def _too_big(value: Any, depth: int = 0) -> bool:
    if type(value) is int:
        return not -INT32 <= value < INT32
    if isinstance(value, list) and depth < 2:
        return any(_too_big(v, depth + 1) for v in value)
    if isinstance(value, dict) and depth < 2:  # logit_bias: {token id: bias}
        return any(_too_big(v, depth + 1) for v in value.values())
    return False


def _check_pd_limits(obj: Any, limits: Limits) -> None:
    if not limits.pd:
        return
    for v in _values(obj.top_logprobs_num):
        if type(v) is int and v > PD_MAX_TOP_LOGPROBS:
            raise RequestRefused("top_logprobs_num", f"{v}: a PD pair carries at most {PD_MAX_TOP_LOGPROBS} top "
                                                     "logprobs per token")


def check_tokenized(obj: Any, input_ids: Any) -> None:
    """A prompt that is empty once tokenized (``""`` with a tokenizer that adds no BOS token) would be a 0-token
    prefill, whose forward raises in the scheduler; SGLang refuses only an empty ``input_ids`` list. A session's
    request may be empty (its history supplies the prompt), and so may one that carries embeddings or media."""
    if input_ids is None or len(input_ids) or obj.input_embeds is not None:
        return
    session = obj.session_params
    if (isinstance(session, dict) and session.get("id")) or obj.session_id:
        return
    if obj.image_data or obj.video_data or obj.audio_data:
        return
    raise RequestRefused("text" if obj.text is not None else "input_ids",
                         "the prompt has no tokens once tokenized")


def shape_of(obj: Any) -> Shape:
    text, ids, embeds = obj.text, obj.input_ids, obj.input_embeds
    if text is not None:
        if isinstance(text, str):
            single, prompts = True, 1
        elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            single, prompts = False, len(text)
        else:
            raise RequestRefused("text", "must be a string or a non-empty list of strings")
    elif ids is not None:
        if not isinstance(ids, list):
            raise RequestRefused("input_ids", "must be a list of token ids or a list of such lists")
        single = not ids or not isinstance(ids[0], list)
        prompts = 1 if single else len(ids)
    elif embeds is not None:
        if not (isinstance(embeds, list) and embeds and isinstance(embeds[0], list) and embeds[0]):
            raise RequestRefused("input_embeds", "must be a list of embedding vectors or a list of such lists")
        single = not isinstance(embeds[0][0], list)
        prompts = 1 if single else len(embeds)
    else:
        return Shape(prompts=1, single=True, n=1)  # SGLang refuses it itself ("Either text, input_ids or ...")
    return Shape(prompts=prompts, single=single, n=_n_of(obj.sampling_params))


def _check_role_support(obj: Any, shape: Shape, limits: Limits) -> None:
    """What SGLang refuses on one role only (beam search, grammars without a backend, on the prefill side) is refused
    on both: a decode half accepted for a prefill half that was refused waits for KV that never comes. ``n > 1`` on
    a PD instance is refused too: SGLang 0.5.23 sends a prompt's prefix-caching request and its ``n`` samples under
    the same bootstrap room, and the decode scheduler, seeing one room several times, died (``Unexpected poll case``)
    or hung (found by the generation fuzz); send ``n`` requests instead."""
    if limits.pd and shape.n > 1:
        raise RequestRefused("sampling_params", f"n = {shape.n}: parallel sampling is not supported on a PD pair "
                                                "(SGLang reuses one bootstrap room for the samples); send n requests")
    for name in ("disagg_prefill_dp_rank", "routed_dp_rank", "data_parallel_rank"):
        rank = getattr(obj, name)
        # This instance's own ranks are bounded by its dp size; a decode half's prefill rank by its prefill's.
        top = limits.dp_size if name != "disagg_prefill_dp_rank" or limits.role == "prefill" else 1 << 16
        if rank is not None and (type(rank) is not int or not 0 <= rank < top):
            raise RequestRefused(name, f"must be a data-parallel rank in [0, {top}), got {rank!r}"[:200])
    params = obj.sampling_params
    for p in params if isinstance(params, list) else [params]:
        if not isinstance(p, dict):
            continue
        beams = p.get("beam_width")
        if limits.pd and type(beams) is int and beams > 1:
            raise RequestRefused("sampling_params", "beam_width > 1 is not supported with PD disaggregation")
        if not limits.grammar and any(p.get(k) is not None for k in GRAMMAR_KEYS):
            raise RequestRefused("sampling_params", f"grammar-based generation ({', '.join(GRAMMAR_KEYS)}) needs a "
                                                    "grammar backend; this server runs with --grammar-backend none")


def _n_of(params: Any) -> int:
    first = params[0] if isinstance(params, list) and params else params
    n = first.get("n", 1) if isinstance(first, dict) else 1
    if n is None:
        return 1
    if type(n) is not int or not 1 <= n <= MAX_N:
        raise RequestRefused("sampling_params", f"n must be an integer in [1, {MAX_N}], got {n!r}")
    return n


def _check_input_ids(ids: Any, shape: Shape, vocab_size: int | None, text_given: bool) -> None:
    """Token ids are integers inside the vocabulary, and no prompt of a batch is empty: SGLang passes ids to the
    embedding unchecked, and a 0-token prefill fails in the model's forward. With ``text`` given, SGLang decides the
    shape from the text but tokenizes nothing and uses ``input_ids``: the two must then agree."""
    if ids is None:
        return
    if not isinstance(ids, list):
        raise RequestRefused("input_ids", "must be a list of token ids or a list of such lists")
    batch = bool(ids) and isinstance(ids[0], list)
    if text_given and (batch == shape.single or (batch and len(ids) != shape.prompts)):
        raise RequestRefused("input_ids", f"disagrees with 'text' ({shape.prompts} prompt(s), "
                                          f"{'a list' if not shape.single else 'a string'}): send one of the two")
    rows = ids if batch else [ids]
    for i, row in enumerate(rows):
        if batch and not (isinstance(row, list) and row):
            raise RequestRefused("input_ids", f"prompt {i} of the batch is empty" if isinstance(row, list) else
                                 f"prompt {i} of the batch is not a list of token ids")
        for t in row:
            if type(t) is not int:
                raise RequestRefused("input_ids", f"token ids must be integers, got {t!r}"[:200])
            if vocab_size and not 0 <= t < vocab_size:
                raise RequestRefused("input_ids", f"token id {t} is outside the model's vocabulary [0, {vocab_size})")


def _check_sampling_params(params: Any, shape: Shape) -> None:
    """One object for all prompts, or a list with one object per prompt: SGLang indexes the list unchecked."""
    if params is None or isinstance(params, dict):
        return
    if not isinstance(params, list):
        raise RequestRefused("sampling_params", "must be an object or a list of objects")
    if shape.single:
        raise RequestRefused("sampling_params", "a single prompt takes one object, not a list")
    if len(params) != shape.prompts:
        raise RequestRefused("sampling_params", f"{len(params)} objects for {shape.prompts} prompts (one per "
                                                "prompt, or one object for all)")
    if not all(isinstance(p, dict) for p in params):
        raise RequestRefused("sampling_params", "every element of the list must be an object")


def _check_sampling_values(params: Any, vocab_size: int | None) -> None:
    """Each object is built and verified as SGLang's tokenizer manager will (``SamplingParams(**params)``, then
    ``normalize`` and ``verify``): an unknown key or a value of the wrong type raises a TypeError there, a 500."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    for p in params if isinstance(params, list) else [params]:
        if not p:
            continue
        try:
            sp = SamplingParams(**p)
            sp.verify(vocab_size or 1 << 20)
        except (TypeError, ValueError, AttributeError, OverflowError, KeyError, IndexError) as e:
            raise RequestRefused("sampling_params", f"{type(e).__name__}: {e}"[:300]) from None
        try:
            sp.normalize(None)  # without the tokenizer: its ValueErrors may be the missing tokenizer's
        except ValueError:
            pass
        except Exception as e:  # e.g. re.error for a stop_regex that does not compile: SGLang's 500
            raise RequestRefused("sampling_params", f"{type(e).__name__}: {e}"[:300]) from None


def _check_per_prompt(name: str, value: Any, shape: Shape) -> None:
    """A field split per prompt is one value for all, or a list of exactly one value per prompt (SGLang repeats a
    list ``n`` times, which would give parallel samples the same bootstrap room: lists need ``n`` = 1)."""
    if value is None:
        return
    types = _SCALAR_TYPES.get(name)
    if isinstance(value, list):
        if shape.single:
            raise RequestRefused(name, "a single prompt takes one value, not a list")
        if len(value) != shape.prompts:
            raise RequestRefused(name, f"{len(value)} values for {shape.prompts} prompts (one per prompt, or one "
                                       "value for all)")
        if shape.n > 1 and name != "rid":
            raise RequestRefused(name, "a list needs n = 1 (give one value for all prompts with parallel sampling)")
        items = value
    else:
        items = [value]
    if types is None:
        return
    for v in items:
        if v is not None and (not isinstance(v, types) or (bool not in types and isinstance(v, bool))):
            raise RequestRefused(name, f"must be {' or '.join(t.__name__ for t in types)}, got {v!r}"[:200])


def _check_ranges(obj: Any, shape: Shape, vocab_size: int | None) -> None:
    room = obj.bootstrap_room
    rooms = room if isinstance(room, list) else ([room] if room is not None else [])
    top = MAX_ROOM - (shape.requests if not isinstance(room, list) else 1)
    for r in rooms:
        if r is not None and not 0 <= r <= top:
            raise RequestRefused("bootstrap_room", f"{r} is outside [0, {top}]")
    if isinstance(room, list) and len({r for r in rooms if r is not None}) < sum(r is not None for r in rooms):
        raise RequestRefused("bootstrap_room", "rooms of one batch must differ")
    for field, low, high in (("bootstrap_port", 1, 65535), ("decode_tp_size", 1, 1 << 16)):
        for v in _values(getattr(obj, field)):
            if not low <= v <= high:
                raise RequestRefused(field, f"{v} is outside [{low}, {high}]")
    for field in ("bootstrap_host", "bootstrap_pair_key"):
        for v in _values(getattr(obj, field)):
            if not v or len(v) > MAX_HOST_CHARS:
                raise RequestRefused(field, f"must be 1-{MAX_HOST_CHARS} characters")
    for v in _values(obj.top_logprobs_num):
        if not 0 <= v <= (vocab_size or 1 << 20):
            raise RequestRefused("top_logprobs_num", f"{v} is outside [0, {vocab_size}]")
    _check_token_ids_logprob(obj.token_ids_logprob, shape, vocab_size)


def _check_token_ids_logprob(value: Any, shape: Shape, vocab_size: int | None) -> None:
    """A flat list of ids for every prompt, or (a batch with n = 1) one list per prompt."""
    if not value:
        return
    nested = isinstance(value, list) and isinstance(value[0], list)
    if nested and (shape.single or shape.n > 1 or len(value) != shape.prompts):
        raise RequestRefused("token_ids_logprob", "one list per prompt needs a batch with n = 1 and one list for "
                                                  "each prompt; give a flat list for all prompts")
    rows = value if nested else [value]
    for row in rows:
        if row is None:
            continue
        if not isinstance(row, list):
            raise RequestRefused("token_ids_logprob", "must be a list of token ids or a list of such lists")
        for t in row:
            if type(t) is not int or (vocab_size and not 0 <= t < vocab_size):
                raise RequestRefused("token_ids_logprob", f"token id {t!r} is not inside the model's vocabulary "
                                                          f"[0, {vocab_size})"[:200])


def _values(value: Any) -> list[Any]:
    """The non-null scalar values of a field already type-checked by ``_check_per_prompt``."""
    items = value if isinstance(value, list) else [value]
    return [v for v in items if v is not None]
