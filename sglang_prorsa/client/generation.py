"""``/generate`` bodies and answers: what the SDK sends and the ``Generation`` it hands back.

The body is SGLang's own (``input_ids`` or ``text``, ``sampling_params``, ``return_logprob``, ``rid``); the trajectory
id travels in the ``X-Trajectory-Id`` header, which our front, our engines and sglang-router all pass on (sglang-router
drops unknown body fields, so the SDK never puts it in the body).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from sglang_prorsa.client.errors import InvalidArgument, ProrsaClientError

TRAJECTORY_ID_HEADER = "X-Trajectory-Id"


@dataclass(frozen=True)
class Generation:
    """One answered ``/generate`` request.

    ``output_logprobs[i]`` is the log-probability of ``output_ids[i]`` (None unless ``return_logprob``);
    ``cached_tokens`` the prompt tokens the engine found in its prefix cache; ``weight_version`` the engine's weights
    version when it reports one.
    """

    output_ids: list[int]
    text: str
    output_logprobs: list[float] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: Any
    weight_version: str | None
    trajectory_id: str | None
    latency_s: float
    meta_info: dict = field(repr=False, default_factory=dict)

    @property
    def context_tokens(self) -> int:
        """Prompt plus output: the length of the context the next turn starts from (before any tool output)."""
        return self.prompt_tokens + self.completion_tokens


def generate_body(
    input_ids: Sequence[int] | None,
    text: str | None,
    sampling_params: Mapping[str, Any] | None,
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    return_logprob: bool = True,
    rid: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of one ``/generate`` request; raises ``InvalidArgument`` naming the field on bad input."""
    if (input_ids is None) == (text is None):
        raise InvalidArgument("input_ids", "give exactly one of input_ids and text")
    body: dict[str, Any] = {}
    if input_ids is not None:
        if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence) or not input_ids:
            raise InvalidArgument("input_ids", "must be a non-empty list of token ids")
        ids = list(input_ids)
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
        if bad is not None:
            raise InvalidArgument("input_ids", f"must hold non-negative integers, got {bad!r}")
        body["input_ids"] = ids
    else:
        if not isinstance(text, str) or not text:
            raise InvalidArgument("text", "must be a non-empty string")
        body["text"] = text
    if sampling_params is not None and not isinstance(sampling_params, Mapping):
        raise InvalidArgument("sampling_params", f"must be a mapping, got {type(sampling_params).__name__}")
    sp = dict(sampling_params or {})
    if max_new_tokens is not None:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InvalidArgument("max_new_tokens", f"must be a non-negative integer, got {max_new_tokens!r}")
        sp["max_new_tokens"] = max_new_tokens
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise InvalidArgument("temperature", f"must be a number >= 0, got {temperature!r}")
        sp["temperature"] = float(temperature)
    body["sampling_params"] = sp
    if return_logprob:
        body["return_logprob"] = True
    if rid is not None:
        if not isinstance(rid, str) or not rid:
            raise InvalidArgument("rid", "must be a non-empty string")
        body["rid"] = rid
    for key, value in (extra or {}).items():
        if key in body:
            raise InvalidArgument(key, "set it through the named argument, not through extra")
        if key == "trajectory_id":
            raise InvalidArgument(key, "is sent as the X-Trajectory-Id header; use the trajectory_id argument")
        body[key] = value
    return body


def parse_generation(body: Any, trajectory_id: str | None, latency_s: float) -> Generation:
    """A ``Generation`` from SGLang's ``/generate`` answer (a single prompt's object)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict):
        raise ProrsaClientError(f"/generate answered {type(body).__name__}, expected an object")
    meta = body.get("meta_info") or {}
    raw_logprobs = meta.get("output_token_logprobs")
    logprobs = None
    token_ids_from_logprobs = None
    if isinstance(raw_logprobs, list):
        # SGLang: one [logprob, token_id, token_text_or_None] per output token.
        logprobs = [float(x[0]) for x in raw_logprobs]
        token_ids_from_logprobs = [int(x[1]) for x in raw_logprobs]
    output_ids = body.get("output_ids")
    if output_ids is None:
        output_ids = token_ids_from_logprobs
    if output_ids is None:
        raise ProrsaClientError(f"/generate answer has no output_ids (keys: {sorted(body)})")
    weight_version = meta.get("weight_version")
    return Generation(
        output_ids=list(output_ids),
        text=body.get("text") or "",
        output_logprobs=logprobs,
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens") or len(output_ids)),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        finish_reason=meta.get("finish_reason"),
        weight_version=None if weight_version is None else str(weight_version),
        trajectory_id=trajectory_id,
        latency_s=latency_s,
        meta_info=meta,
    )
