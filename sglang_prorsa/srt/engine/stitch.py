"""Stitch a resumed request's outputs: what the caller already has, then what the continuation produces.

Pure (no I/O): fed the continuation's outputs one by one, it returns what the original request's caller should see
next, in the shape SGLang's tokenizer manager gives that caller (streaming or not, cumulative or incremental), so
output ids, text, per-token logprobs and ``meta_info`` (finish reason, token counts, ``weight_versions``,
``routed_experts``: ``routed_experts.py``) read as one uninterrupted run would report them. It also honours a stop
string that straddles the point where the request moved: the instance that continues sees only its own tokens and
cannot match it (beyond the paper: Appendix C does not discuss stop conditions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sglang_prorsa.srt.engine import routed_experts

# Output-side meta_info entries with one item per output token (SGLang's _INCREMENTAL_STREAMING_META_INFO_KEYS).
PER_TOKEN_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


@dataclass
class Kept:
    """What the first attempt produced that the continuation keeps, and what the caller has been given of it."""

    prompt_tokens: int
    ids: list[int]
    per_token: dict[str, list[Any]] = field(default_factory=dict)  # each truncated to len(ids)
    weight_spans: list[tuple[str, int, int]] = field(default_factory=list)  # over ids
    base_meta: dict[str, Any] = field(default_factory=dict)  # e.g. cached_tokens of the first attempt
    delivered_ids: int = 0  # ids the caller already received (streaming)
    delivered_text: int = 0  # characters of text the caller already received (streaming)
    routed_experts: bytes | None = None  # the first part's rows (routed_experts.py), from position routed_start
    routed_row_bytes: int = 0  # one position's bytes of them (0: unknown)
    routed_start: int = 0  # the request's routed_experts_start_len


@dataclass(frozen=True)
class Shape:
    """How the caller receives outputs: SGLang's ``stream`` and ``incremental_streaming_output``."""

    stream: bool
    incremental: bool


def merge_spans(spans: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    for version, start, end in spans:
        if end <= start:
            continue
        if out and out[-1][0] == version and out[-1][2] == start:
            out[-1] = (version, out[-1][1], end)
        else:
            out.append((version, start, end))
    return out


def continuation_spans(meta: dict[str, Any], n_tokens: int) -> list[tuple[str, int, int]]:
    spans = meta.get("weight_versions")
    if spans:
        return [(str(s["version"]), int(s["start"]), int(s["end"])) for s in spans]
    if n_tokens and meta.get("weight_version") is not None:
        return [(str(meta["weight_version"]), 0, n_tokens)]
    return []


def flat_migrations(moves: list[dict]) -> list[dict]:
    """Every move of a request in order: an attempt that moved again (continued by the instance it moved to, which
    reports its own moves, already flat) is followed by those moves."""
    out: list[dict] = []
    for move in moves:
        out.append({k: v for k, v in move.items() if k != "then"})
        out.extend(move.get("then") or [])
    return out


class Stitcher:
    """Feed ``update`` the continuation's outputs in cumulative form; it returns the caller's next output or None."""

    def __init__(self, rid: str, kept: Kept, shape: Shape, decode: Callable[[list[int]], str],
                 stop: Sequence[str] = (), no_stop_trim: bool = False, migrations: list[dict] | None = None) -> None:
        self.rid = rid
        self.kept = kept
        self.shape = shape
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.no_stop_trim = no_stop_trim
        self.migrations = migrations if migrations is not None else []
        self.finished = False
        self.straddle_stop: str | None = None  # set when we, not the continuation, matched a stop string
        self._straddle_cleared = not self.stop or not kept.ids  # past the window where a straddling match can end
        self._ids: list[int] = list(kept.ids)
        self._meta: dict[str, Any] = {}
        self._sent_ids = kept.delivered_ids
        self._sent_text = kept.delivered_text

    @property
    def ids(self) -> list[int]:
        return self._ids

    def update(self, cont: dict[str, Any]) -> dict[str, Any] | None:
        """One continuation output (cumulative ``output_ids`` and per-token meta over the continuation's tokens)."""
        meta = dict(cont.get("meta_info") or {})
        new_ids = [int(t) for t in cont.get("output_ids") or []]
        ids = self.kept.ids + new_ids
        finish = meta.get("finish_reason")
        stop_at = self._straddling_stop(ids)
        if stop_at is not None:
            matched, end = stop_at
            ids = ids[:end]
            finish = {"type": "stop", "matched": matched}
            self.straddle_stop = matched
        self._ids = ids
        self._meta = meta
        self.finished = finish is not None
        if not self.finished and not self.shape.stream:
            return None
        return self._output(meta, finish, len(ids) - len(self.kept.ids))

    def final_without_continuation(self, finish: dict[str, Any]) -> dict[str, Any]:
        """The budget ran out exactly at the move (nothing left to generate)."""
        self.finished = True
        return self._output({}, finish, 0)

    # -- helpers ------------------------------------------------------------------------------------------------------
    def _straddling_stop(self, ids: list[int]) -> tuple[str, int] | None:
        """A stop string whose match starts in the kept tokens and ends in the new ones: (stop, ids to keep)."""
        k = len(self.kept.ids)
        if self._straddle_cleared or len(ids) == k:
            return None
        kept_text = self.decode(ids[:k])
        window = max(len(s) for s in self.stop) + 1  # a straddling match ends within as many new tokens as it has chars
        for end in range(k + 1, min(len(ids), k + window) + 1):
            text = self.decode(ids[:end])
            for s in self.stop:
                pos = text.find(s)
                if pos != -1 and pos < len(kept_text) and s not in kept_text:
                    return s, end
        if len(ids) >= k + window:
            self._straddle_cleared = True
        return None

    def _text(self, ids: list[int], finish: dict[str, Any] | None) -> str:
        text = self.decode(ids)
        matched = (finish or {}).get("matched")
        if isinstance(matched, str) and matched and not self.no_stop_trim:
            pos = text.find(matched)
            if pos != -1:
                text = text[:pos]
        return text

    def rebase(self) -> None:
        """The continuation failed part-way: what it produced becomes kept, for the next one to continue from."""
        n_new = len(self._ids) - len(self.kept.ids)
        per_token, spans = self._full(self._meta, n_new)
        # A failed attempt sent no routed_experts (they come with a final output): the first part's rows stay.
        self.kept = Kept(prompt_tokens=self.kept.prompt_tokens, ids=list(self._ids), per_token=per_token,
                         weight_spans=spans, base_meta=self.kept.base_meta, delivered_ids=self._sent_ids,
                         delivered_text=self._sent_text, routed_experts=self.kept.routed_experts,
                         routed_row_bytes=self.kept.routed_row_bytes, routed_start=self.kept.routed_start)
        self._meta = {}
        self._straddle_cleared = not self.stop

    def _full(self, cont_meta: dict[str, Any], n_new: int) -> tuple[dict[str, list], list[tuple[str, int, int]]]:
        k = len(self.kept.ids)
        per_token: dict[str, list] = {}
        for key in PER_TOKEN_KEYS:
            if key in self.kept.per_token or key in cont_meta:
                cont_items = [tuple(x) if isinstance(x, list) and key == "output_token_logprobs" else x
                              for x in (cont_meta.get(key) or [])][:n_new]
                per_token[key] = list(self.kept.per_token.get(key, []))[:k] + cont_items
        spans = merge_spans(list(self.kept.weight_spans)
                            + [(v, s + k, min(e, n_new) + k) for v, s, e in continuation_spans(cont_meta, n_new)])
        return per_token, spans

    def _routed_experts(self, cont: Any, n_ids: int) -> str | None:
        kept = self.kept
        prompt = kept.prompt_tokens
        return routed_experts.stitched(kept.routed_experts, cont, row_bytes=kept.routed_row_bytes,
                                       start=kept.routed_start, kept_end=prompt + len(kept.ids), end=prompt + n_ids - 1)

    def _output(self, cont_meta: dict[str, Any], finish: dict[str, Any] | None, n_new: int) -> dict[str, Any]:
        ids = self._ids
        meta = dict(cont_meta)
        meta.update(self.kept.base_meta)
        meta["id"] = self.rid
        if isinstance(finish, dict) and finish.get("type") == "length" and "length" in finish:
            finish = {**finish, "length": len(ids)}  # the whole budget, not the continuation's remainder
        meta["finish_reason"] = finish
        meta["prompt_tokens"] = self.kept.prompt_tokens
        meta["completion_tokens"] = len(ids)
        per_token, spans = self._full(cont_meta, n_new)
        meta.update(per_token)
        if "output_token_logprobs" in per_token:
            meta["output_token_logprobs_length"] = len(per_token["output_token_logprobs"])
        if spans:
            meta["weight_versions"] = [{"version": v, "start": s, "end": e} for v, s, e in spans]
            meta["weight_version"] = spans[-1][0]
        meta.pop("routed_experts", None)
        if finish is not None:  # SGLang sends them with the final output only
            routed = self._routed_experts(cont_meta.get("routed_experts"), len(ids))
            if routed is not None:
                meta["routed_experts"] = routed
        meta["prorsa"] = {"migrations": flat_migrations(self.migrations)}
        text = self._text(ids, finish)
        if self.shape.stream and self.shape.incremental:
            out_ids, out_text = ids[self._sent_ids:], text[self._sent_text:]
            for key in per_token:
                meta[key] = meta[key][self._sent_ids:]
        else:
            out_ids, out_text = list(ids), text
        self._sent_ids, self._sent_text = len(ids), len(text)
        return {"text": out_text, "output_ids": out_ids, "meta_info": meta}
