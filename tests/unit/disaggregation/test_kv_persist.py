"""Persisting a request's KV in store blocks and loading a prefix back, on a real MHA pool layout (CPU)."""

from __future__ import annotations

import pytest
import torch
from sglang_prorsa.kernels import KVPageCodec

from sglang_prorsa.srt.disaggregation.kv_persist import load_blocks, persist_request_kv
from sglang_prorsa.srt.disaggregation.kv_store import FileKVStore, layout_id

LAYERS, HEADS, DIM, POOL = 2, 2, 64, 512


def _pool(seed: int):
    g = torch.Generator().manual_seed(seed)
    k = [torch.randn(POOL, HEADS, DIM, generator=g) for _ in range(LAYERS)]
    v = [torch.randn(POOL, HEADS, DIM, generator=g) for _ in range(LAYERS)]
    return k, v


@pytest.mark.parametrize("n_tokens", [1, 63, 64, 150])
def test_persist_then_load_reproduces_every_layer(tmp_path, n_tokens):
    k, v = _pool(0)
    src = KVPageCodec.from_mha(k, v, page_size=1)
    tokens = list(range(100, 100 + n_tokens))
    slots = torch.randperm(POOL, generator=torch.Generator().manual_seed(1))[:n_tokens]
    store = FileKVStore(tmp_path, capacity_bytes=1 << 26)
    layout = layout_id("m", "float32", LAYERS, HEADS, DIM)
    keys, bt, nbytes = persist_request_kv(src, store, tokens, slots, layout, block_tokens=64)
    assert bt == 64 and len(keys) == -(-n_tokens // 64)
    assert nbytes == n_tokens * LAYERS * 2 * HEADS * DIM * 4

    # Load tokens [start, n) into fresh slots of another pool; compare with the source slots.
    k2, v2 = [torch.zeros_like(t) for t in k], [torch.zeros_like(t) for t in v]
    dst = KVPageCodec.from_mha(k2, v2, page_size=1)
    start = n_tokens // 3
    loaded = load_blocks(FileKVStore(tmp_path, capacity_bytes=1 << 26), keys, bt, start, n_tokens)
    assert loaded.tokens == n_tokens - start and loaded.missing_blocks == 0
    new_slots = torch.arange(n_tokens - start) + 7
    dst.import_pages(loaded.records_for(dst, n_tokens - start, 1), dst.pages_of_slots(new_slots, 1))
    for layer in range(LAYERS):
        assert torch.equal(k2[layer][new_slots], k[layer][slots[start:]])
        assert torch.equal(v2[layer][new_slots], v[layer][slots[start:]])


def test_a_missing_block_stops_the_prefix(tmp_path):
    k, v = _pool(2)
    codec = KVPageCodec.from_mha(k, v, page_size=1)
    store = FileKVStore(tmp_path, capacity_bytes=1 << 26)
    keys, bt, _ = persist_request_kv(codec, store, list(range(200)), torch.arange(200), "L", block_tokens=64)
    store.delete(keys[1])
    loaded = load_blocks(store, keys, bt, 0, 200)
    assert loaded.tokens == 64  # only the first block is usable: a prefix must be contiguous
    assert loaded.missing_blocks == 1 and loaded.checksum_failures == 0


def test_block_size_defaults_to_a_few_mib_in_whole_pages():
    from sglang_prorsa.srt.disaggregation.kv_persist import block_tokens_for

    assert block_tokens_for(page_size=1, bytes_per_token=1024) == 1024  # 2 MiB / 1 KiB, capped at 1024
    assert block_tokens_for(page_size=16, bytes_per_token=64 * 1024) == 32  # 2 MiB / 64 KiB
    assert block_tokens_for(page_size=64, bytes_per_token=1 << 20) == 64  # never less than a page
    assert block_tokens_for(page_size=16, bytes_per_token=1024, configured=100) == 96  # whole pages
