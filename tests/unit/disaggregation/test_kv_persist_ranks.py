"""Keys per tensor-parallel rank (srt/disaggregation/kv_persist.py, kv_store.py): with TP 2 each rank holds half the KV
heads and persists its shard under its own keys, so neither overwrites the other's; a load recomputes a rank's keys
from the tokens and restores exactly that rank's shard. Real MHA pools split by heads, the real codec, on CPU."""

from __future__ import annotations

import numpy as np
import torch
from sglang_prorsa.kernels import KVPageCodec

from sglang_prorsa.srt.disaggregation.kv_persist import keys_for, load_blocks, persist_request_kv
from sglang_prorsa.srt.disaggregation.kv_store import FileKVStore, layout_id, rank_layout

LAYERS, HEADS, DIM, POOL, TP = 2, 4, 16, 256, 2
PER_RANK = HEADS // TP
N, BT = 100, 32  # 100 tokens in blocks of 32: 4 blocks, the last partial


def full_pool(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(POOL, HEADS, DIM, generator=g) for _ in range(LAYERS)],
            [torch.randn(POOL, HEADS, DIM, generator=g) for _ in range(LAYERS)])


def shard(buffers: list[torch.Tensor], rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s heads of each layer, as its own (contiguous) pool buffer."""
    return [b[:, rank * PER_RANK:(rank + 1) * PER_RANK].contiguous() for b in buffers]


def expected_bytes(k: list[torch.Tensor], v: list[torch.Tensor], slots: torch.Tensor) -> bytes:
    """A page-size-1 record per token: each layer's K row then its V row (kernels/layout.py)."""
    return b"".join(t[int(s)].numpy().tobytes() for s in slots for layer in range(LAYERS) for t in (k[layer], v[layer]))


LAYOUT = layout_id("m", "float32", LAYERS, PER_RANK, DIM, page_size=1, tp_size=TP)


def persist_both(tmp_path):
    k, v = full_pool(0)
    slots = torch.randperm(POOL, generator=torch.Generator().manual_seed(1))[:N]
    tokens = list(range(1000, 1000 + N))
    store = FileKVStore(tmp_path, capacity_bytes=1 << 26)
    out = {}
    for rank in range(TP):
        codec = KVPageCodec.from_mha(shard(k, rank), shard(v, rank), page_size=1)
        out[rank] = persist_request_kv(codec, store, tokens, slots, LAYOUT, block_tokens=BT, tp_rank=rank)
    return k, v, slots, tokens, store, out


def test_the_layout_names_the_tp_size_and_each_rank_keys_its_own_blocks():
    assert LAYOUT == "m|float32|L2|H2|D16|mha|P1|TP2"
    assert layout_id("m", "float32", LAYERS, PER_RANK, DIM, tp_size=1) != LAYOUT
    assert rank_layout(LAYOUT, 0) == LAYOUT + "|R0" and rank_layout(LAYOUT, 1) == LAYOUT + "|R1"
    tokens = list(range(N))
    k0, k1 = keys_for(tokens, BT, LAYOUT, 0), keys_for(tokens, BT, LAYOUT, 1)
    assert len(k0) == len(k1) == 4
    assert not set(k0) & set(k1)  # no block key is shared: the ranks never overwrite each other
    assert keys_for(tokens, BT, LAYOUT, 1) == k1  # a rank's keys depend on the tokens alone: recomputable


def test_each_rank_persists_its_own_shard_under_its_own_keys(tmp_path):
    k, v, slots, tokens, store, out = persist_both(tmp_path)
    (keys0, bt0, n0), (keys1, bt1, n1) = out[0], out[1]
    assert bt0 == bt1 == BT
    assert keys0 == keys_for(tokens, BT, LAYOUT, 0) and keys1 == keys_for(tokens, BT, LAYOUT, 1)
    shard_bytes = N * LAYERS * 2 * PER_RANK * DIM * 4
    assert n0 == n1 == shard_bytes  # each rank wrote its half of the heads, not the whole
    assert store.stats()["entries"] == 8 and store.stats()["puts"] == 8  # 4 blocks per rank, none overwritten
    for rank, keys in ((0, keys0), (1, keys1)):
        stored = b"".join(store.get(key) for key in keys)
        assert stored == expected_bytes(shard(k, rank), shard(v, rank), slots)
    other = b"".join(store.get(key) for key in keys1)
    assert other != expected_bytes(shard(k, 0), shard(v, 0), slots)


def test_a_load_on_rank_r_restores_exactly_rank_r_shard(tmp_path):
    k, v, slots, tokens, store, _ = persist_both(tmp_path)
    start = 40  # the destination already holds 40 tokens in its prefix cache
    new_slots = torch.arange(N - start) + 3
    restored = {}
    for rank in range(TP):
        k2 = [torch.zeros(POOL, PER_RANK, DIM) for _ in range(LAYERS)]
        v2 = [torch.zeros(POOL, PER_RANK, DIM) for _ in range(LAYERS)]
        dst = KVPageCodec.from_mha(k2, v2, page_size=1)
        loaded = load_blocks(store, keys_for(tokens, BT, LAYOUT, rank), BT, start, N)  # keys from tokens alone
        assert (loaded.tokens, loaded.missing_blocks, loaded.checksum_failures) == (N - start, 0, 0)
        dst.import_pages(loaded.records_for(dst, N - start, 1), dst.pages_of_slots(new_slots, 1))
        restored[rank] = expected_bytes(k2, v2, new_slots)
        for layer in range(LAYERS):
            assert torch.equal(k2[layer][new_slots], shard(k, rank)[layer][slots[start:]])
            assert torch.equal(v2[layer][new_slots], shard(v, rank)[layer][slots[start:]])
    assert restored[0] == expected_bytes(shard(k, 0), shard(v, 0), slots[start:])
    assert restored[1] == expected_bytes(shard(k, 1), shard(v, 1), slots[start:])
    assert restored[0] != restored[1]  # never the other rank's bytes
    assert not np.array_equal(np.frombuffer(restored[0], np.float32), np.frombuffer(restored[1], np.float32))
