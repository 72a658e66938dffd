"""SGLang's ``meta_info.routed_experts`` of a request that moved: one array, as one uninterrupted run reports it.

SGLang's format (``return_routed_experts`` with ``--enable-return-routed-experts``): the base64 of an int32 array of
shape ``[positions, layers, top_k]`` (every hidden layer, ``num_experts_per_tok`` experts each), collected when the
request finishes and so sent with its final output only. Row ``r`` holds the experts chosen while the token at
position ``routed_experts_start_len + r`` was forwarded, for positions ``[start, prompt + outputs - 1)``: the last
token is never forwarded. Rows are read back by KV slot, so a position whose KV an instance received (a PD decode
instance's prompt, a prefix loaded from the KV store) and did not compute is whatever that slot's host buffer holds
(zeros on a fresh instance): SGLang reports it so for an unmoved PD request too.

A moved request's continuation forwards its prompt (the original prompt plus the tokens kept) on a new prefill
instance and reports from a new decode instance, which computed only the positions after that prompt. So each
position is taken from the part that computed it, the same values an unmoved run computes there (same weights, same
tokens): positions before the end of the kept tokens from the first part (its abort output carries the rows it
forwarded, the last kept token's included), the rest from the continuation.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any


def decoded(value: Any) -> bytes | None:
    """The raw bytes of a ``routed_experts`` value; None for a missing or malformed one."""
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def stitched(first: bytes | None, cont: Any, *, row_bytes: int, start: int, kept_end: int, end: int) -> str | None:
    """The caller's ``routed_experts``: rows for positions ``[start, end)`` (``end`` = prompt + outputs - 1), those
    before ``kept_end`` (prompt + tokens kept) from ``first`` where it has them, the others from the continuation's
    ``cont`` (base64, rows from the same ``start``: it carries ``routed_experts_start_len``). ``row_bytes``: one
    position's bytes (0 when unknown: the continuation's value is passed on as it is). None when neither part has
    any."""
    if first is None:
        return cont if isinstance(cont, str) else None
    if not row_bytes:
        return cont if isinstance(cont, str) else _encoded(first)
    second = decoded(cont)
    own = min(len(first) // row_bytes, max(0, kept_end - start)) * row_bytes
    rows = first[:own] + (second[own:] if second is not None else b"")
    return _encoded(rows[: max(0, end - start) * row_bytes])


def _encoded(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
