"""Persist and resume per tensor-parallel rank, as the scheduler's KV side does them (srt/scheduler/kv.py), on SGLang's
real radix tree and token allocator, the real codec and CPU pools split in half by heads:

- each TP rank persists its own shard under its own keys (counted per rank), the record carries the parallel layout;
- a load that names the source's layout recomputes each rank's keys from the tokens: rank r restores exactly rank r's
  shard even though the message carries rank 0's keys (the record's);
- a source of another parallel layout (TP size, dtype) is refused: nothing imported, ``kv_layout_refused`` counted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang_prorsa.kernels import KVPageCodec  # noqa: E402

from sglang_prorsa.srt.common.messages import LAYOUT_REFUSED, LoadPrefix, MigratedRequest, Stage  # noqa: E402
from sglang_prorsa.srt.disaggregation.kv_persist import keys_for  # noqa: E402
from sglang_prorsa.srt.disaggregation.kv_store import FileKVStore  # noqa: E402
from sglang_prorsa.srt.scheduler.counters import InstanceCounters  # noqa: E402
from sglang_prorsa.srt.scheduler.kv import KVSide  # noqa: E402
from sglang_prorsa.srt.scheduler.ranks import Ranks  # noqa: E402

LAYERS, HEADS, DIM, POOL, BT = 2, 4, 8, 128, 16
PROMPT, OUTPUT = list(range(500, 540)), [7, 8, 9]  # 42 tokens with KV (the newest has none yet)
KV_TOKENS = len(PROMPT) + len(OUTPUT) - 1


class RankKV(KVSide):
    """One TP rank's KV side over its own pool buffers (the codec is the real one, built on them)."""

    def __init__(self, k, v, ranks: Ranks, store, req_to_token=None) -> None:
        self.test_codec = KVPageCodec.from_mha(k, v, page_size=1)
        self.k, self.v = k, v
        alloc = TokenToKVPoolAllocator(POOL, torch.float32, "cpu", kvcache=None, need_sort=False)
        tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc,
                                          page_size=1))
        scheduler = SimpleNamespace(tree_cache=tree, token_to_kv_pool_allocator=alloc, page_size=1,
                                    max_total_num_tokens=POOL, server_args=SimpleNamespace(model_path="tiny"),
                                    req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))
        # One process stands in for the TP group: the other rank found as many tokens (``test_tp_min``: the real
        # agreement over two processes).
        super().__init__(scheduler, store_config=SimpleNamespace(block_tokens=BT), counters=InstanceCounters(),
                         ranks=ranks, agree=lambda n: n)
        self._store = store

    def codec(self):
        return self.test_codec


def full_pool(seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(POOL, HEADS, DIM, generator=g).to(dtype) for _ in range(LAYERS)],
            [torch.randn(POOL, HEADS, DIM, generator=g).to(dtype) for _ in range(LAYERS)])


def shard(buffers, rank: int, tp: int = 2):
    per = HEADS // tp
    return [b[:, rank * per:(rank + 1) * per].contiguous() for b in buffers]


def empty(heads: int, dtype=torch.float32):
    return [torch.zeros(POOL, heads, DIM, dtype=dtype) for _ in range(LAYERS)]


def record() -> MigratedRequest:
    return MigratedRequest(rid="r", role="decode", stage=Stage.RUNNING, input_ids=PROMPT, output_ids=OUTPUT,
                           sampling_params={})


@pytest.fixture
def source(tmp_path):
    """A TP-2 source whose request's KV sits in pool slots ``slots`` on both ranks; each rank persisted its shard."""
    k, v = full_pool(0)
    slots = torch.randperm(POOL, generator=torch.Generator().manual_seed(3))[:KV_TOKENS + 1]
    req_to_token = slots.view(1, -1).to(torch.int32)
    req = SimpleNamespace(origin_input_ids=PROMPT, output_ids=OUTPUT, kv=SimpleNamespace(req_pool_idx=0))
    store = FileKVStore(tmp_path, capacity_bytes=1 << 26)
    ranks = [RankKV(shard(k, r), shard(v, r), Ranks(tp_rank=r, tp_size=2), store, req_to_token) for r in range(2)]
    records = [rank.persist(req, record()) for rank in ranks]
    return SimpleNamespace(k=k, v=v, slots=slots[:KV_TOKENS], store=store, ranks=ranks, records=records)


def test_each_rank_persists_its_shard_under_its_own_keys_counted_per_rank(source):
    (rec0, blocks0, bytes0), (rec1, blocks1, bytes1) = source.records
    shard_bytes = KV_TOKENS * LAYERS * 2 * (HEADS // 2) * DIM * 4
    assert (blocks0, bytes0) == (blocks1, bytes1) == (3, shard_bytes)  # 42 tokens in blocks of 16, half the heads
    assert rec0.layout == rec1.layout == "tiny|float32|L2|H2|D8|mha|P1|TP2"  # the parallel layout: equal on both
    tokens = (PROMPT + OUTPUT)[:KV_TOKENS]
    assert rec0.keys == keys_for(tokens, BT, rec0.layout, 0) and rec1.keys == keys_for(tokens, BT, rec0.layout, 1)
    assert not set(rec0.keys) & set(rec1.keys)
    assert source.store.stats()["entries"] == 6
    for rank in source.ranks:
        snap = rank.counters.snapshot()
        assert (snap["kv_blocks_persisted"], snap["kv_bytes_persisted"], snap["kv_tokens_persisted"]) == (
            3, shard_bytes, KV_TOKENS)


def loaded_slots(kv: RankKV, n: int) -> torch.Tensor:
    """The pool slots the destination's prefix cache holds for the first ``n`` tokens."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    match = kv.s.tree_cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", (PROMPT + OUTPUT)[:n]))))
    assert int(match.device_prefix_len) == n
    return kv.s.tree_cache.path_device_indices(match.last_device_node)[:n].to(torch.int64)


def load(dst: RankKV, rec: MigratedRequest, layout: str | None = None):
    return dst.load_prefix(LoadPrefix(token_ids=(PROMPT + OUTPUT)[:rec.kv_tokens], keys=rec.keys,
                                      block_tokens=rec.block_tokens, layout=rec.layout if layout is None else layout))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_load_restores_exactly_this_rank_shard(source, rank):
    rec0 = source.records[0][0]  # the record the engine side gets: rank 0's keys, the parallel layout
    dst = RankKV(empty(2), empty(2), Ranks(tp_rank=rank, tp_size=2), source.store)
    result = load(dst, rec0)
    assert (result.loaded_tokens, result.already_cached_tokens, result.missing_blocks, result.refused) == (
        KV_TOKENS, 0, 0, "")
    slots = loaded_slots(dst, KV_TOKENS)
    for layer in range(LAYERS):
        for got, full in ((dst.k, source.k), (dst.v, source.v)):
            mine = shard(full, rank)[layer][source.slots]
            other = shard(full, 1 - rank)[layer][source.slots]
            assert got[layer][slots].numpy().tobytes() == mine.numpy().tobytes()  # bytes equal: this rank's shard
            assert not torch.equal(got[layer][slots], other)  # never the other rank's
    snap = dst.counters.snapshot()
    assert (snap["kv_tokens_loaded"], snap["kv_layout_refused"]) == (KV_TOKENS, 0)


def test_without_a_layout_the_sent_keys_are_loaded_as_they_are(source):
    rec0 = source.records[0][0]
    dst = RankKV(empty(2), empty(2), Ranks(tp_rank=0, tp_size=2), source.store)
    assert load(dst, rec0, layout="").loaded_tokens == KV_TOKENS  # an older sender: rank 0's keys, rank 0 here
    slots = loaded_slots(dst, KV_TOKENS)
    assert torch.equal(dst.k[1][slots], shard(source.k, 0)[1][source.slots])


@pytest.mark.parametrize("other", ["tp1", "bf16"])
def test_another_parallel_layout_is_refused_counted_and_nothing_imported(source, other):
    rec0 = source.records[0][0]
    if other == "tp1":  # the whole heads on one rank: TP 1
        dst = RankKV(empty(HEADS), empty(HEADS), Ranks(), source.store)
    else:  # the same TP 2 split, another dtype
        dst = RankKV(empty(2, torch.bfloat16), empty(2, torch.bfloat16), Ranks(tp_rank=0, tp_size=2), source.store)
    assert dst.layout() != rec0.layout
    hits = source.store.stats()["hits"]
    result = load(dst, rec0)
    assert (result.loaded_tokens, result.already_cached_tokens, result.missing_blocks, result.refused) == (
        0, 0, 0, LAYOUT_REFUSED)
    assert dst.counters.snapshot()["kv_layout_refused"] == 1
    assert source.store.stats()["hits"] == hits  # nothing was even read
    assert dst.s.token_to_kv_pool_allocator.available_size() == POOL  # no slot taken
    assert dst.s.tree_cache.evictable_size() + dst.s.tree_cache.protected_size() == 0  # nothing in the prefix cache
    assert all(not t.any() for t in dst.k + dst.v)  # no byte imported
    load(dst, rec0)
    assert dst.counters.snapshot()["kv_layout_refused"] == 2


def test_the_refusal_counter_is_reported_from_the_start():
    assert InstanceCounters().snapshot() == {"kv_layout_refused": 0.0}
