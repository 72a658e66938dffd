"""Loading a persisted prefix into a full prefix cache (srt/scheduler/kv.py) on SGLang's real radix tree and token
allocator: the room made for it never comes from the prefix it extends.

Before the fix the matched path was not locked: the eviction that made room freed the matched prefix's own pages,
the allocator handed them back as the new slots, and the insert put freed pages into the tree -- a later double
free, and another request's KV overwritten (a 500-request soak saw 11 outputs of requests that never moved differ).
The KV store and the page import are stand-ins (no pool tensors here); the tree and the allocator are SGLang's."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from sglang_prorsa.srt.common.messages import LoadPrefix  # noqa: E402
from sglang_prorsa.srt.scheduler import kv as kv_module  # noqa: E402
from sglang_prorsa.srt.scheduler.counters import InstanceCounters  # noqa: E402
from sglang_prorsa.srt.scheduler.kv import KVSide  # noqa: E402

POOL = 16


class Codec:
    """Records where pages were imported (a real codec writes the pool tensors)."""

    def __init__(self) -> None:
        self.imported: list[list[int]] = []

    def pages_of_slots(self, slots, page):
        return slots

    def import_pages(self, records, pages) -> None:
        self.imported.append([int(p) for p in pages])


def side(monkeypatch) -> tuple[KVSide, RadixCache, TokenToKVPoolAllocator, Codec]:
    alloc = TokenToKVPoolAllocator(POOL, torch.float32, "cpu", kvcache=None, need_sort=False)
    tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc,
                                      page_size=1))
    codec = Codec()
    monkeypatch.setattr(KVSide, "codec", lambda self: codec)
    scheduler = SimpleNamespace(tree_cache=tree, token_to_kv_pool_allocator=alloc, page_size=1, max_total_num_tokens=POOL)
    kv = KVSide(scheduler, store_config=None, counters=InstanceCounters())
    kv._store = object()  # never opened: load_blocks is replaced below

    def load_blocks(store, keys, block_tokens, start, end):
        return SimpleNamespace(tokens=end - start, missing_blocks=0, checksum_failures=0,
                               records_for=lambda codec, n, page: [None] * n)

    monkeypatch.setattr(kv_module, "load_blocks", load_blocks)
    return kv, tree, alloc, codec


def cache(tree, alloc, tokens: list[int]):
    value = alloc.alloc(len(tokens))
    tree.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))
    return value


def tree_pages(tree) -> list[int]:
    out, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node is not tree.root_node and node.value is not None:
            out += [int(v) for v in node.value]
        stack.extend(node.children.values())
    return out


def assert_consistent(tree, alloc) -> None:
    pages = tree_pages(tree)
    assert len(pages) == len(set(pages)), f"a page is in the tree twice: {sorted(pages)}"
    free = {int(p) for p in alloc.free_pages}
    assert not free & set(pages), f"freed pages still in the tree: {sorted(free & set(pages))}"


def load(kv, tokens: list[int]):
    return kv.load_prefix(LoadPrefix(token_ids=tokens, keys=["k"], block_tokens=64))


def test_a_full_cache_never_evicts_the_prefix_being_extended(monkeypatch):
    kv, tree, alloc, codec = side(monkeypatch)
    prefix = cache(tree, alloc, [1, 2, 3, 4, 5, 6])  # the resumed request's prompt, cached here: the LRU leaf
    running = alloc.alloc(POOL - 6)  # the rest of the pool belongs to running requests
    assert running is not None and alloc.available_size() == 0
    result = load(kv, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    # Nothing else is evictable: the load is declined (the request recomputes 3 tokens), nothing is corrupted.
    assert (result.already_cached_tokens, result.loaded_tokens) == (6, 0)
    assert codec.imported == []
    assert sorted(tree_pages(tree)) == sorted(int(p) for p in prefix)
    assert_consistent(tree, alloc)


def test_room_comes_from_other_cached_prefixes(monkeypatch):
    kv, tree, alloc, codec = side(monkeypatch)
    prefix = cache(tree, alloc, [1, 2, 3, 4, 5, 6])
    other = cache(tree, alloc, [50, 51, 52, 53])  # another trajectory's cached prefix, newer
    alloc.alloc(POOL - 10)
    result = load(kv, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert (result.already_cached_tokens, result.loaded_tokens) == (6, 3)
    assert set(codec.imported[0]) <= {int(p) for p in other}  # the new pages are the evicted prefix's
    assert not set(codec.imported[0]) & {int(p) for p in prefix}
    assert kv.counters.snapshot()["kv_tokens_evicted_for_loads"] >= 3
    assert_consistent(tree, alloc)
    kv.release_hold("")  # nothing held without a rid


def test_the_footprint_leaves_out_what_the_prefix_cache_could_evict(monkeypatch):
    # An idle decode instance whose prefix cache is full holds no request's KV: K^D_t must not count the cache.
    kv, tree, alloc, _ = side(monkeypatch)
    cache(tree, alloc, [1, 2, 3, 4, 5, 6])
    cache(tree, alloc, [50, 51, 52, 53])
    assert kv.occupancy() == (0, POOL, 10)
    alloc.alloc(3)  # a running request's KV, outside the tree
    assert kv.occupancy() == (3, POOL, 10)
