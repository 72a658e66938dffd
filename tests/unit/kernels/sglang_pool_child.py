"""Child process of test_kv_sglang_pool.py: export/import straight from real SGLang 0.5.23 pools on CPU.

KV is written through SGLang's own ``set_kv_buffer`` into slots from SGLang's own page allocator, read back through
``get_key_buffer``/``get_value_buffer``, and must survive export, clobbering and import into freshly allocated slots.
Prints one line per case and ``ALL OK`` at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_kernels_path import ensure_kernels_importable  # noqa: E402

ensure_kernels_importable()

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang_prorsa.kernels import KVPageCodec  # noqa: E402

LAYERS = 3


def check_mha(page_size: int, dtype: torch.dtype) -> None:
    size = 16 * page_size
    pool = MHATokenToKVPool(size=size, page_size=page_size, dtype=dtype, head_num=2, head_dim=64, layer_num=LAYERS,
                            device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    alloc = PagedTokenToKVPoolAllocator(size, page_size, dtype, "cpu", pool, need_sort=True)
    tokens = 4 * page_size
    slots = alloc.alloc(tokens)
    gen = torch.Generator().manual_seed(page_size)
    want = []
    for layer in range(LAYERS):
        k = torch.randn(tokens, 2, 64, generator=gen).to(dtype)
        v = torch.randn(tokens, 2, 64, generator=gen).to(dtype)
        pool.set_kv_buffer(None, slots, k, v, layer_id_override=layer)
        want.append((pool.get_key_buffer(layer)[slots].clone(), pool.get_value_buffer(layer)[slots].clone()))
    codec = KVPageCodec.from_sglang_pool(pool)
    exported = codec.export_pages(KVPageCodec.pages_of_slots(slots, page_size), checksum=True)

    fresh = alloc.alloc(tokens)  # the request's old pages are still held, so these are different pages
    assert fresh is not None and not set(fresh.tolist()) & set(slots.tolist())
    for layer in range(LAYERS):  # clobber everything so that a no-op import cannot pass
        pool.k_buffer[layer].zero_()
        pool.v_buffer[layer].zero_()
    codec.import_pages(exported, KVPageCodec.pages_of_slots(fresh, page_size))
    for layer in range(LAYERS):
        assert torch.equal(pool.get_key_buffer(layer)[fresh].view(torch.uint8), want[layer][0].view(torch.uint8))
        assert torch.equal(pool.get_value_buffer(layer)[fresh].view(torch.uint8), want[layer][1].view(torch.uint8))
    print(f"MHA page {page_size} {dtype} (stored as {pool.k_buffer[0].dtype}) via {codec.backend.name}: ok")


def check_mla(page_size: int, dtype: torch.dtype) -> None:
    pool = MLATokenToKVPool(size=8 * page_size, page_size=page_size, dtype=dtype, kv_lora_rank=512,
                            qk_rope_head_dim=64, layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    gen = torch.Generator().manual_seed(page_size + 1)
    for buf in pool.kv_buffer:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    codec = KVPageCodec.from_sglang_pool(pool)
    pages = [3, 1]
    exported = codec.export_pages(pages, checksum=True)
    for j, page in enumerate(pages):
        rows = slice(page * page_size, (page + 1) * page_size)
        record = [pool.get_key_buffer(layer)[rows].contiguous().view(-1).view(torch.uint8) for layer in range(LAYERS)]
        assert torch.equal(exported.records()[j], torch.cat(record))
    codec.import_pages(exported, [5, 6])
    assert torch.equal(codec.export_pages([5, 6]).data, exported.data)
    print(f"MLA page {page_size} {dtype} (stored as {pool.kv_buffer[0].dtype}) via {codec.backend.name}: ok")


if __name__ == "__main__":
    for ps in (1, 16, 64):
        check_mha(ps, torch.bfloat16)
    check_mha(16, torch.float8_e4m3fn)
    check_mla(1, torch.bfloat16)
    check_mla(64, torch.float8_e4m3fn)
    print("ALL OK")
