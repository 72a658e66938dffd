"""One attention-DP rank's prefix cache (SGLang's radix cache, reduced to what multi-turn rollouts reuse).

A trajectory's next request extends its previous context, so the only prefix worth modelling is "this trajectory's
last context on this rank": one entry per trajectory, ``key -> tokens``. The cache lives in the rank's KV pool, in
whatever the running requests leave free: SGLang evicts least-recently-used radix nodes when it needs room, so an entry
survives only while ``cached + in use <= pool``. Eviction is applied when entries are added or read (the rank calls
``fit`` with its current room), which is when it matters.

What a rank holds differs by role: a prefill rank caches the prompts it prefilled (the outputs were generated on a
decode instance and never computed here); a colocated rank caches prompt + output of every finished request; a PD
decode rank caches nothing the router would use. A role switch or a weight update drops the whole cache.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    __slots__ = ("entries", "tokens", "evicted_tokens")

    def __init__(self) -> None:
        self.entries: OrderedDict[object, int] = OrderedDict()
        self.tokens = 0  # sum of cached prefix lengths
        self.evicted_tokens = 0

    def put(self, key: object, tokens: int, room: int) -> None:
        """Cache ``tokens`` of ``key``'s context (replacing its older, shorter prefix); then fit into ``room``."""
        old = self.entries.pop(key, 0)
        self.tokens += tokens - old
        self.entries[key] = tokens
        self.fit(room)

    def get(self, key: object, room: int) -> int:
        """Cached prefix length of ``key`` (0 when absent or evicted); a hit refreshes its recency."""
        self.fit(room)
        tokens = self.entries.get(key, 0)
        if tokens:
            self.entries.move_to_end(key)
        return tokens

    def drop(self, key: object) -> None:
        self.tokens -= self.entries.pop(key, 0)

    def fit(self, room: int) -> None:
        """Evict least-recently-used entries until the cache fits in ``room`` tokens."""
        entries = self.entries
        while self.tokens > room and entries:
            _, tokens = entries.popitem(last=False)
            self.tokens -= tokens
            self.evicted_tokens += tokens

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0
