"""Property-based fuzzing of the generation routes (issue 29): Hypothesis strategies built from the routes' schemas,
a sender that reads every answer fully, and the classification of answers.

The three routes and the schema each is built from (walked when first drawn from, and cached; nothing copied):

    /generate              ``GenerateReqInput`` (``sglang.srt.managers.io_struct``; ``dataclasses.fields``) and,
                           for ``sampling_params``, ``SamplingParams`` (``sglang.srt.sampling.sampling_params``)
    /v1/completions        ``CompletionRequest`` (``sglang.srt.entrypoints.openai.protocol``; pydantic ``model_fields``)
    /v1/chat/completions   ``ChatCompletionRequest`` (same module)

Two families of bodies:

* ``schema`` bodies: a prompt of the route's own kind plus a few other fields of the schema, each value drawn from the
  field's annotation (unions, literals, lists, dicts, nested pydantic models / msgspec structs / enums), with ints that
  include extremes (+-2**63, 2**64), unicode text (lone surrogates too), token ids outside the vocabulary;
* ``inconsistent`` bodies: a schema body plus one to three mutations that keep each field's type but break the
  whole: batch and single fields mixed (a text list with single input_ids, ``prompt`` + ``input_ids``, ``messages``
  on /generate), fields of the other routes, PD bootstrap fields single / list / wrong length, rid lists, per-prompt
  lists of the wrong length, extreme numbers, empty and nested lists, unicode, token ids outside the vocabulary.

Every body is then *bounded*: at most ``MAX_NEW`` new tokens per sequence, ``n``/``best_of``/``beam_width`` at most
``MAX_N``, small prompts, so a run that is admitted finishes in well under a second on the tiny CPU model. Fields that
would make a server read files or fetch URLs, or run code, are never generated: ``SKIPPED`` names each, with why.

``send(url, path, body)`` posts one body and reads the answer fully (a stream to its end, within a deadline) into an
``Outcome``; ``classify`` sorts outcomes into ``2xx`` / ``4xx`` / ``5xx`` (caused by the input) / ``5xx_legit`` (a
state of the deployment, see ``LEGITIMATE_5XX``) / ``no_answer`` (connection lost, timeout, stream cut off).
This module imports no pytest; SGLang is imported inside functions.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import random
import re
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests
from hypothesis import strategies as st

ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
MAX_NEW = 4  # new tokens per sequence, at most
MAX_N = 3  # n, best_of, beam_width: at most
MAX_BATCH = 3  # prompts in a batch, at most
DEFAULT_VOCAB = 1024  # the embedded tiny model's (read from its config by ``vocab_size``)
DEFAULT_TIMEOUT_S = 120.0

# Fields never generated, with the reason. Everything else in the three schemas is.
SKIPPED: dict[str, str] = {
    "image_data": "multimodal input: a path, URL or base64 file the server would open or fetch",
    "video_data": "multimodal input: a path or URL the server would open or fetch",
    "audio_data": "multimodal input: a path or URL the server would open or fetch",
    "encoder_urls": "URLs of encoder servers the request would be sent to",
    "lora_path": "names adapter files on disk (and loads them when dynamic LoRA is on)",
    "lora_id": "names a loaded LoRA adapter, resolved from lora_path (files)",
    "http_worker_ipc": "an IPC socket path the tokenizer manager would connect to and send results to",
    "custom_logit_processor": "dill-serialised Python code, run by the scheduler when custom logit processors are on",
    # Chat content parts (walked inside ``messages``): each carries a URL or file data the server would fetch/decode.
    "image_url": "chat content part: an image URL the server would fetch",
    "video_url": "chat content part: a video URL the server would fetch",
    "audio_url": "chat content part: an audio URL the server would fetch",
    "input_audio": "chat content part: inline audio the server would decode as a file",
}

# Fields whose ints are token budgets or counts: bounded (their extremes are ones SGLang refuses outright).
_BUDGETS = ("max_new_tokens", "max_tokens", "max_completion_tokens")
_COUNTS = ("n", "best_of", "beam_width")
EXTREME_INTS = (-2**64, -2**63 - 1, -2**63, -2**31, -1, 0, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64)
# Budgets larger than any context: refused before anything runs (a huge budget that is admitted would run for long).
_REFUSED_BUDGETS = (-2**63, -1, 2**63 - 1, 2**63, 2**64, 10**9)
_ODD_FLOATS = (0.0, -0.0, 1e-320, 1e308, -1e308, float("inf"), float("-inf"), float("nan"))

# A front (or router) state, not the body: allowed by the fuzz properties, counted and reported.
LEGITIMATE_5XX: dict[tuple[int, str], str] = {
    (503, "no_instance"): "the front has no routable instance of a role (every one is switching, draining or dead); "
                          "a healthy deployment gives none, and an instance that died shows in its PID",
    (503, "server_selection_failed"): "sglang-router has no worker of a role in its pools (one died or is switching); "
                                      "likewise, the death itself shows in the instance's PID",
}

# Outcome classes.
OK, REFUSED, INPUT_5XX, LEGIT_5XX, NO_ANSWER = "2xx", "4xx", "5xx", "5xx_legit", "no_answer"
CLASSES = (OK, REFUSED, INPUT_5XX, LEGIT_5XX, NO_ANSWER)

_WORDS = ("the agent calls a tool and reads the result hello world def return plan observe act step think "
          "prefill decode cache token").split()


# -- the model -----------------------------------------------------------------------------------------------------

def vocab_size(model_dir: str | Path | None = None, url: str | None = None) -> int:
    """The vocabulary size in a model's ``config.json``: of ``model_dir``, of the model ``url`` serves (its
    ``/model_info``), or of the embedded tiny model."""
    if model_dir is None and url is not None:
        try:
            model_dir = requests.get(url.rstrip("/") + "/model_info", timeout=10).json()["model_path"]
        except (requests.RequestException, ValueError, KeyError, TypeError):
            model_dir = None
    if model_dir is None:
        from sglang_prorsa.testing.tiny_model import ensure_default_model

        model_dir = ensure_default_model()
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size") or DEFAULT_VOCAB)


# -- scalar strategies ---------------------------------------------------------------------------------------------

def extreme_ints() -> st.SearchStrategy[int]:
    return st.sampled_from(EXTREME_INTS)


def plain_ints() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-3, 8), extreme_ints())


def token_ids(vocab: int) -> st.SearchStrategy[int]:
    """Mostly ids inside the vocabulary; sometimes just outside it, negative, or far outside (int64 and beyond)."""
    outside = st.sampled_from((-1, -2, vocab, vocab + 1, 2 * vocab, 2**31, 2**63 - 1, 2**63, 2**64, -2**63))
    return st.one_of(st.integers(3, vocab - 1), st.integers(3, vocab - 1), st.integers(3, vocab - 1), outside)


def budgets() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, MAX_NEW), st.integers(1, MAX_NEW), st.sampled_from(_REFUSED_BUDGETS))


def counts() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(1, MAX_N), st.integers(-1, MAX_N), st.just(-2**63))


def floats() -> st.SearchStrategy[float]:
    return st.one_of(st.floats(-2, 3, allow_nan=False), st.floats(0, 1), st.sampled_from(_ODD_FLOATS))


def unicode_text(max_size: int = 16) -> st.SearchStrategy[str]:
    """Any unicode (control characters, RTL, emoji, NUL), sometimes with lone surrogates (legal as JSON escapes)."""
    surrogate = st.characters(categories=["Cs"])
    return st.one_of(st.text(max_size=max_size),
                     st.lists(st.one_of(st.characters(), surrogate), max_size=max_size).map("".join))


def prompt_text() -> st.SearchStrategy[str]:
    words = st.lists(st.sampled_from(_WORDS), min_size=1, max_size=8).map(" ".join)
    return st.one_of(words, words, unicode_text(24), st.just(""))


def texts() -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=8), st.sampled_from(_WORDS), unicode_text(8))


_scalars = st.one_of(st.none(), st.booleans(), plain_ints(), floats(), texts())
json_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(texts(), inner, max_size=3)), max_leaves=8)


# -- annotations -> strategies -------------------------------------------------------------------------------------

def _is_pydantic(tp: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - sglang depends on pydantic
        return False
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _is_msgspec(tp: Any) -> bool:
    try:
        import msgspec
    except ImportError:  # pragma: no cover
        return False
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _skipped_model(tp: Any) -> bool:
    """A model carrying a URL or file field (an image part, say): never generated."""
    names = set(getattr(tp, "model_fields", {}) or {})
    return bool(names & set(SKIPPED))


class Walker:
    """Turns a type annotation into a strategy. ``name`` (the field's) picks bounded or id-shaped ints."""

    def __init__(self, vocab: int, max_depth: int = 4) -> None:
        self.vocab = vocab
        self.max_depth = max_depth

    def ints(self, name: str | None) -> st.SearchStrategy[int]:
        if name in _BUDGETS:
            return budgets()
        if name in _COUNTS:
            return counts()
        if name in ("min_new_tokens", "min_tokens"):
            return st.one_of(st.integers(0, MAX_NEW), extreme_ints())
        if name in ("input_ids", "prompt", "stop_token_ids", "token_ids_logprob", "token_indices_to_pool",
                    "multi_item_delimiter_indices"):
            return token_ids(self.vocab)
        if name in ("top_logprobs_num", "top_logprobs", "logprobs"):
            v = self.vocab
            return st.one_of(st.integers(0, 5), st.sampled_from((-1, v - 1, v, v + 1, 2**31, 2**63, -2**63)))
        return plain_ints()

    def __call__(self, tp: Any, name: str | None = None, depth: int = 0) -> st.SearchStrategy:
        if depth > self.max_depth:
            return st.none()
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is Any or tp is object:
            return json_values
        if tp is type(None) or tp is None:
            return st.none()
        if tp is bool:
            return st.booleans()
        if tp is int:
            return self.ints(name)
        if tp is float:
            return st.one_of(floats(), self.ints(name))  # JSON ints are valid floats
        if tp is str:
            return texts()
        if origin is typing.Annotated:
            return self(args[0], name, depth)
        if origin is typing.Union or origin is getattr(types, "UnionType", None):
            options = [self(a, name, depth) for a in args if not (isinstance(a, type) and _skipped_model(a))]
            return st.one_of(options) if options else st.none()
        if origin is typing.Literal:
            return st.sampled_from(args)
        if origin in (list, set, frozenset, tuple) or tp in (list, set, tuple):
            item = self(args[0], name, depth + 1) if args and args[0] is not Ellipsis else json_values
            return st.lists(item, max_size=MAX_BATCH)
        if origin is dict or tp is dict:
            key = texts() if not args or args[0] is str else st.one_of(texts(), self(args[0], None, depth + 1))
            value = self(args[1], None, depth + 1) if len(args) > 1 else json_values
            return st.dictionaries(key.filter(lambda k: isinstance(k, str)), value, max_size=3)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return st.sampled_from([m.value for m in tp])
        if _is_pydantic(tp):
            return self.model(tp, depth + 1)
        if _is_msgspec(tp):
            return self.struct(tp, depth + 1)
        if dataclasses.is_dataclass(tp):
            return self.dataclass(tp, depth + 1)
        if getattr(tp, "__supertype__", None) is not None:  # typing.NewType
            return self(tp.__supertype__, name, depth)
        value = getattr(tp, "__value__", None)  # a `type X = ...` alias
        if value is not None:
            return self(value, name, depth)
        return json_values

    def model(self, tp: Any, depth: int) -> st.SearchStrategy[dict]:
        required, optional = {}, {}
        for fname, info in tp.model_fields.items():
            if fname in SKIPPED or info.exclude:
                continue
            key = info.alias or fname
            strat = self(info.annotation, fname, depth)
            (required if info.is_required() else optional)[key] = strat
        return st.fixed_dictionaries(required, optional=optional)

    def struct(self, tp: Any, depth: int) -> st.SearchStrategy[dict]:
        import msgspec

        hints = typing.get_type_hints(tp)
        required, optional = {}, {}
        for f in msgspec.structs.fields(tp):
            if f.name in SKIPPED:
                continue
            (required if f.required else optional)[f.encode_name] = self(hints.get(f.name, f.type), f.name, depth)
        return st.fixed_dictionaries(required, optional=optional)

    def dataclass(self, tp: Any, depth: int) -> st.SearchStrategy[dict]:
        hints = typing.get_type_hints(tp)
        optional = {f.name: self(hints[f.name], f.name, depth) for f in dataclasses.fields(tp)
                    if f.init and f.name not in SKIPPED}
        return st.fixed_dictionaries({}, optional=optional)


# -- the routes' schemas -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RouteSchema:
    """One route's fields: name -> strategy for its value (skipped fields left out), and which are prompts."""

    route: str
    fields: dict[str, st.SearchStrategy]
    prompt_fields: tuple[str, ...]


# Fields a body's prompt and sampling are built from by hand (their shapes matter to the properties), per route.
_PROMPT_FIELDS = {"/generate": ("text", "input_ids", "input_embeds"), "/v1/completions": ("prompt",),
                  "/v1/chat/completions": ("messages", "input_ids")}
_BUILT_BY_HAND = {"/generate": ("sampling_params", "stream"),
                  "/v1/completions": ("max_tokens", "stream", "n", "best_of"),
                  "/v1/chat/completions": ("max_tokens", "max_completion_tokens", "stream", "n")}
# SamplingParams' own fields an API caller never sets (populated by normalize()): sent only as "internals".
_SAMPLING_INTERNALS = ("stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "is_normalized",
                       "ebnf_full_assistant")


@functools.lru_cache(maxsize=None)
def schemas(vocab: int = DEFAULT_VOCAB) -> dict[str, RouteSchema]:
    """Each route's schema walked into strategies (imports SGLang: call it inside a test or a script)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput

    walk = Walker(vocab)
    out = {}
    hints = typing.get_type_hints(GenerateReqInput, include_extras=True)
    gen = {f.name: walk(hints[f.name], f.name) for f in dataclasses.fields(GenerateReqInput)
           if f.init and f.name not in SKIPPED}
    out["/generate"] = RouteSchema("/generate", gen, _PROMPT_FIELDS["/generate"])
    for route, model in (("/v1/completions", CompletionRequest), ("/v1/chat/completions", ChatCompletionRequest)):
        fields = {}
        for fname, info in model.model_fields.items():
            if fname in SKIPPED or info.exclude:
                continue
            fields[info.alias or fname] = walk(info.annotation, fname)
        out[route] = RouteSchema(route, fields, _PROMPT_FIELDS[route])
    return out


@functools.lru_cache(maxsize=None)
def sampling_fields(vocab: int = DEFAULT_VOCAB) -> tuple[dict[str, st.SearchStrategy], dict[str, st.SearchStrategy]]:
    """SamplingParams' API fields and its internal ones, walked into strategies."""
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    walk = Walker(vocab)
    hints = typing.get_type_hints(SamplingParams)
    api, internal = {}, {}
    for f in msgspec.structs.fields(SamplingParams):
        (internal if f.name in _SAMPLING_INTERNALS else api)[f.encode_name] = walk(hints.get(f.name, f.type), f.name)
    return api, internal


def _choose_fields(draw, fields: dict[str, st.SearchStrategy], exclude: tuple[str, ...], max_fields: int) -> dict:
    names = sorted(n for n in fields if n not in exclude)
    chosen = draw(st.lists(st.sampled_from(names), max_size=max_fields, unique=True)) if names else []
    return {n: draw(fields[n], label=n) for n in chosen}


# -- schema bodies -------------------------------------------------------------------------------------------------

def _ids(vocab: int, min_size: int = 1) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(3, vocab - 1), min_size=min_size, max_size=8)


@st.composite
def sampling_params(draw, vocab: int = DEFAULT_VOCAB, internals: bool = False) -> dict:
    api, internal = sampling_fields(vocab)
    out = _choose_fields(draw, api, ("max_new_tokens",), 4)
    out["max_new_tokens"] = draw(st.one_of(st.integers(0, MAX_NEW), st.integers(1, MAX_NEW), budgets()))
    if internals:
        out.update(_choose_fields(draw, internal, (), 2))
    return out


@functools.lru_cache(maxsize=None)
def _chat_messages(vocab: int) -> st.SearchStrategy[list]:
    """Plain conversations (mostly), and messages walked from the schema (every role, content parts, tool calls)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    walked = Walker(vocab)(ChatCompletionRequest.model_fields["messages"].annotation, "messages")
    simple = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                             "content": prompt_text()}), min_size=1, max_size=3)
    user_last = simple.map(lambda ms: ms + [{"role": "user", "content": "hello"}])
    return st.one_of(simple, user_last, user_last, walked)


@st.composite
def schema_bodies(draw, route: str, vocab: int = DEFAULT_VOCAB, max_fields: int = 3) -> dict:
    """A body of ``route`` whose every field follows the route's schema: a prompt of the route's own kind, a bounded
    budget, and up to ``max_fields`` other fields of the schema."""
    sch = schemas(vocab)[route]
    body: dict[str, Any] = {}
    if route == "/generate":
        kind = draw(st.sampled_from(["text", "text_batch", "ids", "ids_batch"]))
        batch = draw(st.integers(1, MAX_BATCH))
        if kind == "text":
            body["text"] = draw(prompt_text())
        elif kind == "text_batch":
            body["text"] = draw(st.lists(prompt_text(), min_size=batch, max_size=batch))
        elif kind == "ids":
            body["input_ids"] = draw(_ids(vocab))
        else:
            body["input_ids"] = draw(st.lists(_ids(vocab), min_size=batch, max_size=batch))
        sp = draw(sampling_params(vocab))
        body["sampling_params"] = sp if draw(st.booleans()) or not kind.endswith("batch") else [
            draw(sampling_params(vocab)) for _ in range(batch)]
    elif route == "/v1/completions":
        body["prompt"] = draw(st.one_of(prompt_text(), st.lists(prompt_text(), min_size=1, max_size=MAX_BATCH),
                                        _ids(vocab), st.lists(_ids(vocab), min_size=1, max_size=MAX_BATCH)))
        body["max_tokens"] = draw(budgets())
        if draw(st.booleans()):
            body["n"] = draw(counts())
    else:
        body["messages"] = draw(_chat_messages(vocab))
        budget = draw(st.sampled_from(["max_tokens", "max_completion_tokens", "both"]))
        for key in (("max_tokens", "max_completion_tokens") if budget == "both" else (budget,)):
            body[key] = draw(budgets())
        if draw(st.booleans()):
            body["n"] = draw(counts())
    if draw(st.integers(0, 3)) == 0:
        body["stream"] = True
    body.update(_choose_fields(draw, sch.fields, sch.prompt_fields + _BUILT_BY_HAND[route], max_fields))
    return bounded(route, body)


# -- inconsistent bodies -------------------------------------------------------------------------------------------

def _batch_of(body: dict) -> int | None:
    """The batch size a body's prompt fields give (None: a single prompt or no prompt)."""
    for key in ("text", "prompt"):
        v = body.get(key)
        if isinstance(v, list) and v and not all(isinstance(x, int) for x in v):
            return len(v)
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


def _per_prompt(draw, n: int, value: st.SearchStrategy) -> list:
    """A per-prompt list of the wrong length (or, sometimes, the right one next to a wrong shape elsewhere)."""
    length = draw(st.sampled_from(sorted({0, 1, max(0, n - 1), n + 1, n})))
    return [draw(value) for _ in range(length)]


def _mix_batch_single(draw, route: str, body: dict, vocab: int) -> None:
    single_ids, batch_ids = _ids(vocab), st.lists(_ids(vocab), min_size=1, max_size=MAX_BATCH)
    choice = draw(st.sampled_from(["text_list+ids_single", "text_single+ids_batch", "prompt+input_ids",
                                   "text+prompt", "messages", "input_ids_batch", "all_prompts"]))
    if choice == "text_list+ids_single":
        body["text"] = draw(st.lists(prompt_text(), min_size=1, max_size=MAX_BATCH))
        body["input_ids"] = draw(single_ids)
    elif choice == "text_single+ids_batch":
        body["text"] = draw(prompt_text())
        body["input_ids"] = draw(batch_ids)
    elif choice == "prompt+input_ids":
        body["prompt"] = draw(st.one_of(prompt_text(), st.lists(prompt_text(), min_size=1, max_size=MAX_BATCH)))
        body["input_ids"] = draw(st.one_of(single_ids, batch_ids))
    elif choice == "text+prompt":
        body["text"] = draw(st.one_of(prompt_text(), st.lists(prompt_text(), max_size=MAX_BATCH)))
        body["prompt"] = draw(st.one_of(prompt_text(), batch_ids))
    elif choice == "messages":
        body["messages"] = draw(_chat_messages(vocab))
    elif choice == "input_ids_batch":
        body["input_ids"] = draw(batch_ids)
    else:
        body.update(text=draw(prompt_text()), prompt=draw(prompt_text()), input_ids=draw(batch_ids),
                    messages=[{"role": "user", "content": "hello"}])


def _foreign_fields(draw, route: str, body: dict, vocab: int) -> None:
    others = {r: s for r, s in schemas(vocab).items() if r != route}
    for _ in range(draw(st.integers(1, 3))):
        sch = others[draw(st.sampled_from(sorted(others)))]
        name = draw(st.sampled_from(sorted(sch.fields)))
        body[name] = draw(sch.fields[name], label=f"foreign {name}")
    if draw(st.booleans()):  # SamplingParams fields at the top level, or the internals inside
        api, internal = sampling_fields(vocab)
        pool = dict(api, **internal)
        name = draw(st.sampled_from(sorted(pool)))
        if name in _BUDGETS:
            return
        target = body.get("sampling_params") if draw(st.booleans()) else body
        if isinstance(target, dict):
            target[name] = draw(pool[name])


def _bootstrap(draw, route: str, body: dict, vocab: int) -> None:
    n = _batch_of(body) or 1
    host = st.one_of(st.just("127.0.0.1"), st.none(), texts(), st.just("256.1.1.1"))
    port = st.one_of(st.integers(1, 65535), st.none(), extreme_ints(), st.just(0))
    room = st.one_of(st.integers(0, 2**63 - 1), st.none(), extreme_ints())
    for key, value in (("bootstrap_host", host), ("bootstrap_port", port), ("bootstrap_room", room),
                       ("bootstrap_pair_key", st.one_of(texts(), st.none())), ("decode_tp_size", plain_ints())):
        shape = draw(st.sampled_from(["absent", "single", "list", "list_n", "wrong_length", "empty", "nested"]))
        if shape == "single":
            body[key] = draw(value)
        elif shape == "list":
            body[key] = [draw(value)]
        elif shape == "list_n":
            body[key] = [draw(value) for _ in range(n)]
        elif shape == "wrong_length":
            body[key] = [draw(value) for _ in range(draw(st.sampled_from(sorted({0, n + 1, n + 2}))))]
        elif shape == "empty":
            body[key] = []
        elif shape == "nested":
            body[key] = [[draw(value)]]


def _rids(draw, route: str, body: dict, vocab: int) -> None:
    n = _batch_of(body) or 1
    rid = st.one_of(texts(), st.just("same"), st.just(""))
    body["rid"] = draw(st.one_of(rid, _per_prompt_strategy(n, rid), st.lists(st.just("dup"), min_size=2, max_size=3),
                                 st.just([]), st.just([["nested"]])))


def _per_prompt_strategy(n: int, value: st.SearchStrategy) -> st.SearchStrategy[list]:
    return st.integers(0, n + 2).flatmap(lambda k: st.lists(value, min_size=k, max_size=k))


def _per_prompt_lists(draw, route: str, body: dict, vocab: int) -> None:
    n = _batch_of(body) or 1
    walk = Walker(vocab)
    fields = {
        "sampling_params": sampling_params(vocab),
        "return_logprob": st.booleans(),
        "logprob_start_len": plain_ints(),
        "top_logprobs_num": walk.ints("top_logprobs_num"),
        "token_ids_logprob": st.lists(token_ids(vocab), max_size=3),
        "return_hidden_states": st.booleans(),
        "custom_labels": st.dictionaries(texts(), texts(), max_size=2),
        "extra_key": texts(),
        "cache_salt": texts(),
        "stop": texts(),
    }
    for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True)):
        body[name] = _per_prompt(draw, n, fields[name])
    if route != "/generate" and "sampling_params" in body and draw(st.booleans()):
        body.pop("sampling_params")


def _extreme_numbers(draw, route: str, body: dict, vocab: int) -> None:
    sch = schemas(vocab)[route]
    int_like = [n for n in sorted(sch.fields) if n not in _BUDGETS + _COUNTS]
    for name in draw(st.lists(st.sampled_from(int_like), min_size=1, max_size=3, unique=True)):
        body[name] = draw(st.one_of(extreme_ints(), st.sampled_from(_ODD_FLOATS), st.lists(extreme_ints(),
                                                                                            max_size=2)))
    sp = body.get("sampling_params")
    if isinstance(sp, dict):
        api, _ = sampling_fields(vocab)
        name = draw(st.sampled_from(sorted(n for n in api if n not in _BUDGETS + _COUNTS)))
        sp[name] = draw(st.one_of(extreme_ints(), st.sampled_from(_ODD_FLOATS)))


def _empty_and_nested(draw, route: str, body: dict, vocab: int) -> None:
    empty_or_nested = st.sampled_from([[], [[]], [[[5, 6]]], [[5], []], [[], [5]], [None], [[5, None]], {}, ""])
    key = {"/generate": ["text", "input_ids", "input_embeds", "sampling_params", "token_ids_logprob"],
           "/v1/completions": ["prompt", "input_ids", "stop", "stop_token_ids", "logit_bias"],
           "/v1/chat/completions": ["messages", "input_ids", "stop", "stop_token_ids", "tools"]}[route]
    for name in draw(st.lists(st.sampled_from(key), min_size=1, max_size=2, unique=True)):
        body[name] = draw(empty_or_nested)
    if route == "/v1/chat/completions" and draw(st.booleans()):
        body["messages"] = [{"role": "user", "content": draw(st.sampled_from([[], [{"type": "text", "text": ""}],
                                                                              "", [{"type": "text"}]]))}]


def _unicode(draw, route: str, body: dict, vocab: int) -> None:
    odd = st.one_of(unicode_text(24), st.sampled_from(["\x00", "\ud800", "\udfff\ud800", "\u202e\u0644\u0627",
                                                       "\U0001f600" * 8, "\uffff", "a\u0301" * 6]))
    target = {"/generate": "text", "/v1/completions": "prompt", "/v1/chat/completions": "messages"}[route]
    if target == "messages":
        body["messages"] = [{"role": draw(st.one_of(st.just("user"), odd)), "content": draw(odd)}]
    else:
        body[target] = draw(st.one_of(odd, st.lists(odd, min_size=1, max_size=MAX_BATCH)))
    for name in ("stop", "rid", "user", "model", "routing_key", "extra_key"):
        if draw(st.integers(0, 3)) == 0:
            body[name] = draw(odd)


def _out_of_vocab(draw, route: str, body: dict, vocab: int) -> None:
    bad = st.sampled_from((-1, vocab, vocab + 1, 2 * vocab, 2**31, 2**63 - 1, -2**63))
    ids = st.lists(st.one_of(st.integers(3, vocab - 1), bad), min_size=1, max_size=6).filter(
        lambda xs: any(not 0 <= x < vocab for x in xs))
    where = draw(st.sampled_from(["input_ids", "input_ids_batch", "prompt", "stop_token_ids", "token_ids_logprob",
                                  "logit_bias", "sampling_stop_token_ids"]))
    if where == "input_ids":
        body["input_ids"] = draw(ids)
    elif where == "input_ids_batch":
        body["input_ids"] = [draw(ids), draw(_ids(vocab))]
    elif where == "prompt":
        body["prompt"] = draw(st.one_of(ids, st.lists(ids, min_size=1, max_size=2)))
    elif where == "stop_token_ids":
        body["stop_token_ids"] = draw(ids)
    elif where == "token_ids_logprob":
        body["token_ids_logprob"] = draw(ids)
        body["return_logprob"] = True
    elif where == "logit_bias":
        body["logit_bias"] = {str(t): draw(floats()) for t in draw(ids)}
    else:
        sp = body.setdefault("sampling_params", {})
        if isinstance(sp, dict):
            sp["stop_token_ids"] = draw(ids)


def _stream(draw, route: str, body: dict, vocab: int) -> None:
    body["stream"] = draw(st.one_of(st.booleans(), st.sampled_from(["yes", 1, 0, None, [True]])))
    if draw(st.booleans()):
        body["stream_options"] = draw(st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}),
                                                json_values))


MUTATIONS: dict[str, Callable] = {
    "mix_batch_single": _mix_batch_single,
    "foreign_fields": _foreign_fields,
    "bootstrap": _bootstrap,
    "rid": _rids,
    "per_prompt_lists": _per_prompt_lists,
    "extreme_numbers": _extreme_numbers,
    "empty_and_nested": _empty_and_nested,
    "unicode": _unicode,
    "out_of_vocab": _out_of_vocab,
    "stream": _stream,
}


@st.composite
def inconsistent_bodies(draw, route: str, vocab: int = DEFAULT_VOCAB) -> dict:
    """A schema body of ``route`` with one to three ``MUTATIONS`` applied, then bounded."""
    body = draw(schema_bodies(route, vocab, max_fields=2))
    for name in draw(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=3, unique=True)):
        MUTATIONS[name](draw, route, body, vocab)
    return bounded(route, body)


def bodies(route: str, vocab: int = DEFAULT_VOCAB) -> st.SearchStrategy[dict]:
    """Schema bodies and inconsistent ones (twice as many) for one route."""
    return st.one_of(schema_bodies(route, vocab), inconsistent_bodies(route, vocab), inconsistent_bodies(route, vocab))


def cases(routes: tuple[str, ...] = ROUTES, vocab: int = DEFAULT_VOCAB) -> st.SearchStrategy[tuple[str, dict]]:
    """``(route, body)`` pairs over ``routes``."""
    return st.one_of([bodies(r, vocab).map(functools.partial(_pair, r)) for r in routes])


def _pair(route: str, body: dict) -> tuple[str, dict]:
    return route, body


# -- bounding ------------------------------------------------------------------------------------------------------

def _as_number(v: Any) -> float | None:
    """What a lax parser (pydantic coerces "12" and 12.0 to 12) would read as a number, if anything."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v if not isinstance(v, float) or math.isfinite(v) else None
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _bound_budget(v: Any) -> Any:
    """A budget that would be admitted and run long becomes small; refused ones (negative, beyond any context,
    wrong types) stay as they are."""
    x = _as_number(v)
    if x is not None and MAX_NEW < x < 10**8:
        return MAX_NEW
    return v


def _bound_count(v: Any) -> Any:
    x = _as_number(v)
    return MAX_N if x is not None and x > MAX_N else v


def _bound_sampling(sp: Any) -> Any:
    if sp is None:  # SGLang's defaults: 128 new tokens
        return {"max_new_tokens": MAX_NEW}
    if isinstance(sp, dict):
        sp = dict(sp)
        sp["max_new_tokens"] = _bound_budget(sp.get("max_new_tokens", MAX_NEW))
        if sp["max_new_tokens"] is None:
            sp["max_new_tokens"] = MAX_NEW
        for k in _COUNTS:
            if k in sp:
                sp[k] = _bound_count(sp[k])
        return sp
    if isinstance(sp, list):
        return [_bound_sampling(x) for x in sp]
    return sp


def bounded(route: str, body: dict) -> dict:
    """``body`` with every generation budget at most ``MAX_NEW`` tokens and every count at most ``MAX_N``, whichever
    route ends up reading it: budgets an instance would admit and run long are cut; values it refuses are kept."""
    body = dict(body)
    if "sampling_params" in body or route == "/generate":
        body["sampling_params"] = _bound_sampling(body.get("sampling_params"))
    for key in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
        if key in body:
            body[key] = _bound_budget(body[key])
            if body[key] is None:
                body[key] = MAX_NEW
    if route == "/v1/completions" or "prompt" in body:
        body.setdefault("max_tokens", MAX_NEW)
    if route == "/v1/chat/completions" or "messages" in body:
        # SGLang reads ``max_completion_tokens or max_tokens`` here: both absent, null or 0 is "up to the context
        # length". Always a bounded one.
        if not body.get("max_completion_tokens") and not body.get("max_tokens"):
            body["max_completion_tokens"] = MAX_NEW
    for key in _COUNTS:
        if key in body:
            body[key] = _bound_count(body[key])
    for key in ("text", "prompt", "input_ids"):  # cap a batch (a bounded budget, times the batch)
        v = body.get(key)
        if isinstance(v, list) and len(v) > MAX_BATCH and v and isinstance(v[0], (str, list)):
            body[key] = v[:MAX_BATCH]
    return body


# -- sending -------------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """One answer, read to its end."""

    status: int | None  # None: no HTTP answer at all (connection refused or lost, timeout)
    text: str  # the body (a stream's events joined), at most ``TEXT_LIMIT`` characters
    elapsed_s: float
    error: str | None = None  # the client-side failure, when there is one
    stream: bool = False
    stream_done: bool = False  # a stream ended with its [DONE] event
    stream_errors: list = field(default_factory=list)  # error objects carried inside a 200 stream

    def describe(self) -> str:
        return f"{self.status} ({classify(self)}) in {self.elapsed_s:.2f}s: {(self.error or self.text)[:300]}"


TEXT_LIMIT = 4000


def encode(body: Any) -> bytes:
    """JSON bytes of ``body`` as a client would send them (``NaN``/``Infinity`` included, as Python's json writes
    them; lone surrogates as escapes); bytes are sent as they are."""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return json.dumps(body, allow_nan=True).encode()


def _wants_stream(body: Any) -> bool:
    return isinstance(body, dict) and body.get("stream") not in (None, False, 0, "", [], {})


def send(url: str, path: str, body: Any, timeout_s: float = DEFAULT_TIMEOUT_S,
         session: requests.Session | None = None, headers: dict | None = None) -> Outcome:
    """POST ``body`` to ``url + path`` and read the answer fully; a stream is read to its end or until
    ``timeout_s`` has passed in all (then ``no_answer``). Without ``session`` each call opens its own connection:
    a kept-alive one the server has just closed would read as a lost answer."""
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    t0 = time.monotonic()
    streamed = _wants_stream(body)
    try:
        post = session.post if session is not None else requests.post
        with post(url.rstrip("/") + path, data=encode(body), headers=hdrs, timeout=(10, timeout_s),
                          stream=True) as r:
            is_sse = r.headers.get("Content-Type", "").startswith("text/event-stream")
            if not is_sse:
                text = r.content.decode(errors="replace")
                return Outcome(r.status_code, text[:TEXT_LIMIT], time.monotonic() - t0, stream=streamed)
            return _read_stream(r, t0, timeout_s)
    except requests.RequestException as e:
        return Outcome(None, "", time.monotonic() - t0, error=f"{type(e).__name__}: {e}"[:TEXT_LIMIT],
                       stream=streamed)


def _read_stream(r: requests.Response, t0: float, timeout_s: float) -> Outcome:
    parts, errors, done = [], [], False
    size = 0
    try:
        for line in r.iter_lines():
            if time.monotonic() - t0 > timeout_s:
                return Outcome(r.status_code, "\n".join(parts), time.monotonic() - t0,
                               error=f"stream not finished within {timeout_s} s", stream=True,
                               stream_errors=errors)
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            if size < TEXT_LIMIT:
                parts.append(data.decode(errors="replace"))
                size += len(parts[-1])
            try:
                event = json.loads(data)
            except ValueError:
                errors.append({"unparsable_event": data[:200].decode(errors="replace")})
                continue
            if isinstance(event, dict) and event.get("error") is not None:
                errors.append(event["error"])
    except requests.RequestException as e:
        return Outcome(r.status_code, "\n".join(parts)[:TEXT_LIMIT], time.monotonic() - t0,
                       error=f"stream cut off: {type(e).__name__}: {e}"[:1000], stream=True, stream_errors=errors)
    return Outcome(r.status_code, "\n".join(parts)[:TEXT_LIMIT], time.monotonic() - t0, stream=True,
                   stream_done=done, stream_errors=errors)


# -- classifying ---------------------------------------------------------------------------------------------------

def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def error_code(o: Outcome) -> str | None:
    """The typed ``code`` of an error answer (ours: ``{"error", "code"}``; SGLang's OpenAI errors carry
    ``prorsa_code`` once our guard typed them)."""
    body = _json(o.text)
    if not isinstance(body, dict):
        return None
    for key in ("code", "prorsa_code"):
        v = body.get(key)
        if isinstance(v, str):
            return v
    err = body.get("error")
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        return err["code"]
    return None


def _stream_error_status(err: Any) -> int | None:
    if not isinstance(err, dict):
        return 500  # an unparsable event or an error that is not an object: the server broke the stream
    code = err.get("code")
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    if code == "upstream":  # the front's own event: the instance holding the stream was lost
        return 502
    return 400 if err.get("type") in ("invalid_request_error", "BadRequestError") else 500


def classify(o: Outcome) -> str:
    """``2xx``, ``4xx``, ``5xx`` (caused by the input), ``5xx_legit`` (see ``LEGITIMATE_5XX``) or ``no_answer``.

    A 200 stream that carries an error event is classed by the event's code; one that ends without ``[DONE]`` (cut
    off) or runs past its deadline is ``no_answer``."""
    if o.status is None:
        return NO_ANSWER
    if o.status >= 500:
        return LEGIT_5XX if (o.status, error_code(o)) in LEGITIMATE_5XX else INPUT_5XX
    if o.stream and o.status == 200 and (o.error is not None or (o.stream_errors == [] and not o.stream_done)):
        return NO_ANSWER
    if o.status == 200 and o.stream_errors:
        worst = max(_stream_error_status(e) or 500 for e in o.stream_errors)
        return INPUT_5XX if worst >= 500 else REFUSED
    if 200 <= o.status < 300:
        return OK
    return REFUSED


def is_failure(o: Outcome) -> bool:
    """What the fuzz properties forbid: a 5xx the input caused, or no answer at all (a lost or hung instance)."""
    return classify(o) in (INPUT_5XX, NO_ANSWER)


def names_a_field(o: Outcome) -> bool:
    """A 4xx that says which field is wrong: a ``field`` or ``param`` key, ``field 'x'`` (ours) or ``field `x```
    (sglang-router's) in its message, or a pydantic ``loc``."""
    body = _json(o.text)
    if isinstance(body, dict) and (body.get("field") or body.get("param")):
        return True
    return bool(_NAMED_FIELD.search(o.text))


_NAMED_FIELD = re.compile(r"field [`'\"]\w+|'loc'|\"loc\"")


# -- PD pairs and processes ----------------------------------------------------------------------------------------

def with_bootstrap(body: Any, host: str, port: int, rng: random.Random | None = None) -> Any:
    """``body`` with the bootstrap fields SGLang's PD router sets (replacing any the body has): one room for a
    single prompt, a list (one per prompt) for a batch -- the batch read as the router reads it (``text`` a list,
    or ``input_ids`` a list of lists)."""
    if not isinstance(body, dict):
        return body
    rng = rng or _ROOMS
    text, ids = body.get("text"), body.get("input_ids")
    n = len(text) if isinstance(text, list) else (len(ids) if isinstance(ids, list) and ids and isinstance(
        ids[0], list) else None)
    if n is None:
        fields = {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": rng.getrandbits(63)}
    else:
        fields = {"bootstrap_host": [host] * n, "bootstrap_port": [port] * n,
                  "bootstrap_room": [rng.getrandbits(63) for _ in range(n)]}
    return {**body, **fields}


def with_model(route: str, body: Any) -> Any:
    """``body`` with a ``model`` on the OpenAI routes unless it has one: sglang-router refuses those without one
    (422, before anything reaches an instance), so its clients always send one. SGLang takes any name."""
    if route == "/generate" or not isinstance(body, dict) or "model" in body:
        return body
    return {"model": "default", **body}


# Our own generator: Hypothesis seeds the global ``random`` the same way for every example, so rooms drawn from it
# would repeat from one example to the next (and a reused room is a finding of its own, not one to make by accident).
_ROOMS = random.Random()


def process_tree(pid: int) -> dict[int, str]:
    """``pid`` and its descendants, ``{pid: name}`` (SGLang names its children ``sglang::scheduler`` and
    ``sglang::detokenizer``); empty when ``pid`` is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            out[p.pid] = p.name()
        except psutil.NoSuchProcess:
            continue
    return out


def scheduler_pids(pid: int) -> set[int]:
    return {p for p, name in process_tree(pid).items() if "scheduler" in name}


# -- findings ------------------------------------------------------------------------------------------------------

def log_traceback(log_path: str | Path | None, since_bytes: int = 0, max_lines: int = 30) -> str:
    """The last traceback written to a server's log after ``since_bytes`` (its head and its tail, up to the next
    log record), or its last error lines when there is none."""
    if not log_path:
        return ""
    try:
        with open(log_path, "rb") as f:
            f.seek(since_bytes)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = text.splitlines()
    start = max((i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line), default=None)
    if start is None:
        errs = [line for line in lines if "Error" in line or "Exception" in line or "error" in line]
        return "\n".join(errs[-5:])
    end = next((i for i in range(start + 1, len(lines)) if _RECORD.match(lines[i])), len(lines))
    block = lines[start:end]
    if len(block) > max_lines:
        block = block[:3] + ["  ..."] + block[-(max_lines - 4):]
    return "\n".join(block)


_RECORD = re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")  # a log record's timestamp: a new record


def append_finding(path: str | Path, *, route: str, target: str, body: Any, what: str, log: str = "") -> None:
    """Append one crasher to a Markdown findings file, right away (the guard's author reads it while we go on)."""
    text = body.decode(errors="replace") if isinstance(body, (bytes, bytearray)) else json.dumps(body,
                                                                                               allow_nan=True)
    entry = (f"\n## {time.strftime('%Y-%m-%d %H:%M:%S')} {route} via {target}\n\n"
             f"- what happened: {what}\n- body:\n\n```json\n{text}\n```\n")
    if log:
        entry += f"\n- server log:\n\n```\n{log}\n```\n"
    with open(path, "a") as f:
        f.write(entry)
