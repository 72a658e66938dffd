"""Triton kernel cases, run by test_kv_triton.py in a child pytest with TRITON_INTERPRET=1 set before Triton loads.

Not collected on its own (no ``test_`` prefix): without the interpreter Triton cannot run on CPU tensors.
"""

from __future__ import annotations

import os

import pytest
import torch
from sglang_prorsa.kernels import KVChecksumError, KVPageCodec
from sglang_prorsa.kernels.reference import reference_export

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


def _buffers(n: int, tokens: int, heads: int, head_dim: int, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(n * 131 + head_dim)
    width = head_dim * torch.empty(0, dtype=dtype).element_size()
    return [torch.randint(0, 256, (tokens, heads, width), dtype=torch.uint8, generator=gen).view(dtype) for _ in range(n)]


# Each dtype, page size and layout at least twice, without the full product (the interpreter is slow).
CASES = [
    (torch.bfloat16, 1, "mha", 128),
    (torch.bfloat16, 16, "mha", 64),
    (torch.bfloat16, 64, "mla", 576),
    (torch.float16, 1, "mla", 576),
    (torch.float16, 16, "mla", 70),  # 140-byte rows: not 16-byte aligned
    (torch.float16, 64, "mha", 128),
    (torch.float32, 1, "mha", 64),
    (torch.float32, 16, "mha", 128),
    (torch.float32, 64, "mla", 70),
    (torch.float8_e4m3fn, 1, "mha", 64),
    (torch.float8_e4m3fn, 16, "mla", 576),
    (torch.float8_e4m3fn, 64, "mha", 128),
]


@pytest.mark.parametrize("dtype,page_size,layout,head_dim", CASES)
def test_triton_matches_reference(dtype: torch.dtype, page_size: int, layout: str, head_dim: int) -> None:
    tokens = 5 * page_size
    if layout == "mha":
        bufs = _buffers(4, tokens, 2, head_dim, dtype)
        codec = KVPageCodec.from_mha(bufs[0::2], bufs[1::2], page_size, backend="triton")
    else:
        codec = KVPageCodec.from_mla(_buffers(2, tokens, 1, head_dim, dtype), page_size, backend="triton")
    assert codec.backend.name == "triton"
    pages = [3, 1]
    ref, sums = reference_export(codec.layout, pages)
    exported = codec.export_pages(pages, checksum=True)
    assert torch.equal(exported.data, ref)
    assert torch.equal(exported.checksums, sums)
    codec.import_pages(exported, [4, 0])
    assert torch.equal(codec.export_pages([4, 0]).data, ref)


def test_triton_reports_corrupt_record() -> None:
    bufs = _buffers(2, 32, 1, 64, torch.bfloat16)
    codec = KVPageCodec.from_mla(bufs, 16, backend="triton")
    exported = codec.export_pages([0, 1], checksum=True)
    exported.data[codec.page_bytes + 5] ^= 0x10
    with pytest.raises(KVChecksumError) as err:
        codec.import_pages(exported, [1, 0])
    assert err.value.positions == [1] and err.value.pages == [0]
