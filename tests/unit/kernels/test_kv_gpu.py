"""KV export/import on a CUDA device: the CUDA extension, the compiled Triton kernel and the torch path against the
reference, and byte-for-byte against the CPU backend (records made on a GPU must import on a CPU and back).

Skipped without a GPU; benchmarks/gpu_kernels.sh runs it on one.
"""

from __future__ import annotations

import pytest
import torch
from sglang_prorsa.kernels import KVChecksumError, KVPageCodec
from sglang_prorsa.kernels.dispatch import select_backend
from sglang_prorsa.kernels.reference import reference_export

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GPU_BACKENDS = ("cuda", "triton", "torch")
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.uint8)


def _buffers(n: int, tokens: int, heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    width = head_dim * torch.empty(0, dtype=dtype).element_size()
    host = [torch.randint(0, 256, (tokens, heads, width), dtype=torch.uint8, generator=gen) for _ in range(n)]
    return [h.cuda().view(dtype) for h in host]


def _codec(layout: str, bufs: list[torch.Tensor], page_size: int, backend: str) -> KVPageCodec:
    if layout == "mha":
        return KVPageCodec.from_mha(bufs[0::2], bufs[1::2], page_size, backend=backend)
    return KVPageCodec.from_mla(bufs, page_size, backend=backend)


def test_gpu_dispatch_prefers_cuda_extension() -> None:
    assert select_backend(torch.device("cuda")).name == "cuda"


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("layout,head_dim", [("mha", 64), ("mha", 128), ("mla", 576), ("mla", 70)])
def test_gpu_matches_reference_and_cpu(backend: str, dtype: torch.dtype, page_size: int, layout: str, head_dim: int) -> None:
    if head_dim * torch.empty(0, dtype=dtype).element_size() % 4:
        pytest.skip("row is not a whole number of 32-bit words")
    n = 6 if layout == "mha" else 3
    bufs = _buffers(n, 12 * page_size, 2 if layout == "mha" else 1, head_dim, dtype)
    codec = _codec(layout, bufs, page_size, backend)
    assert codec.backend.name == backend
    pages = [7, 2, 11, 0, 5]
    ref, ref_sums = reference_export(codec.layout, pages)
    exported = codec.export_pages(pages, checksum=True)
    assert torch.equal(exported.data, ref)
    assert torch.equal(exported.checksums, ref_sums)

    cpu = _codec(layout, [b.cpu() for b in bufs], page_size, "cpp")
    on_cpu = cpu.export_pages(pages, checksum=True)
    assert torch.equal(on_cpu.data, exported.data.cpu()) and torch.equal(on_cpu.checksums, exported.checksums.cpu())

    targets = torch.tensor([1, 3, 4, 6, 8], device="cuda")
    codec.import_pages(exported, targets)
    assert torch.equal(codec.export_pages(targets).data, ref)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_checksum_names_the_bad_record(backend: str) -> None:
    codec = _codec("mha", _buffers(8, 64 * 8, 8, 128, torch.bfloat16), 64, backend)
    exported = codec.export_pages([1, 2, 3], checksum=True)
    exported.data[2 * codec.page_bytes + 12345] ^= 0x40
    with pytest.raises(KVChecksumError) as err:
        codec.import_pages(exported, [4, 5, 6])
    assert err.value.positions == [2] and err.value.pages == [6]


def test_gpu_large_request_backends_agree() -> None:
    """32K tokens x 32 layers, page size 1, scattered slots: all backends produce the same bytes and checksums."""
    tokens, layers = 32768, 32
    bufs = _buffers(2 * layers, 2 * tokens + 1, 2, 128, torch.bfloat16, seed=3)
    pages = torch.randperm(2 * tokens, device="cuda")[:tokens] + 1
    results = {b: _codec("mha", bufs, 1, b).export_pages(pages, checksum=True) for b in GPU_BACKENDS}
    first = results["cuda"]
    for name, res in results.items():
        assert torch.equal(res.data, first.data), name
        assert torch.equal(res.checksums, first.checksums), name
