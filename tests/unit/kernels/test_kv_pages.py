"""KV export/import on CPU: every CPU backend against the reference, across layouts, dtypes, page sizes, head dims."""

from __future__ import annotations

import random

import pytest
import torch
from sglang_prorsa.kernels import KVChecksumError, KVPageCodec, KVPoolLayout
from sglang_prorsa.kernels.checksum import record_checksums
from sglang_prorsa.kernels.dispatch import BACKEND_ENV, select_backend
from sglang_prorsa.kernels.reference import reference_export, reference_import

CPU_BACKENDS = ("cpp", "torch")
DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "uint8": torch.uint8,  # how SGLang stores an fp8 pool
}


def random_buffers(n: int, pool_tokens: int, heads: int, head_dim: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Pool buffers of arbitrary bytes (any bit pattern, NaN encodings included: only bytes matter)."""
    gen = torch.Generator().manual_seed(seed)
    width = head_dim * torch.empty(0, dtype=dtype).element_size()
    return [
        torch.randint(0, 256, (pool_tokens, heads, width), dtype=torch.uint8, generator=gen).view(dtype)
        for _ in range(n)
    ]


def make_codec(
    layout: str, layers: int, page_size: int, head_dim: int, dtype: torch.dtype, backend: str, pool_pages: int = 9,
    heads: int = 2, seed: int = 0,
) -> KVPageCodec:
    tokens = pool_pages * page_size
    if layout == "mha":
        bufs = random_buffers(2 * layers, tokens, heads, head_dim, dtype, seed)
        return KVPageCodec.from_mha(bufs[0::2], bufs[1::2], page_size, backend=backend)
    return KVPageCodec.from_mla(random_buffers(layers, tokens, 1, head_dim, dtype, seed), page_size, backend=backend)


def pool_bytes(codec: KVPageCodec) -> list[torch.Tensor]:
    return [b.view(-1).view(torch.uint8).clone() for b in codec.layout.buffers]


# Every dtype x page size on one MHA and one MLA shape, plus the other head dims on the two byte widths that bound
# them (the kernels move bytes, so the dtype only changes the row size).
CASES = [(layout, hd, dt, ps) for layout, hd in (("mha", 128), ("mla", 576)) for dt in DTYPES for ps in (1, 16, 64)]
CASES += [(layout, hd, dt, ps) for layout, hd in (("mha", 64), ("mha", 256), ("mla", 192)) for dt in ("fp32", "fp8")
          for ps in (1, 64)]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("layout,head_dim,dtype,page_size", CASES)
def test_export_import_match_reference(backend: str, dtype: str, page_size: int, layout: str, head_dim: int) -> None:
    codec = make_codec(layout, layers=3, page_size=page_size, head_dim=head_dim, dtype=DTYPES[dtype], backend=backend)
    pages = [5, 1, 7, 2]
    expected, expected_sums = reference_export(codec.layout, pages)

    exported = codec.export_pages(pages, checksum=True)
    assert exported.data.shape == (len(pages) * codec.page_bytes,)
    assert torch.equal(exported.data, expected)
    assert torch.equal(exported.checksums, expected_sums)

    # Import into other pages, then check against the reference import on a copy of the pool.
    targets = [8, 3, 0, 6]
    before = pool_bytes(codec)
    codec.import_pages(exported, targets)
    after = pool_bytes(codec)
    ref_layout = KVPoolLayout.from_buffers(
        codec.layout.kind, [b.view(t.dtype).view(t.shape) for b, t in zip(before, codec.layout.buffers)], page_size
    )
    reference_import(ref_layout, expected, targets)
    for got, want in zip(after, (b.view(-1).view(torch.uint8) for b in ref_layout.buffers)):
        assert torch.equal(got, want)
    # And the imported pages export to the same bytes (the round trip is exact).
    assert torch.equal(codec.export_pages(targets).data, expected)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_record_layout_is_page_first(backend: str) -> None:
    """Record j = K_0, V_0, K_1, V_1, ... of page pages[j], each chunk the page's rows in pool order."""
    page_size, head_dim, layers = 16, 64, 2  # make_codec builds 2 heads
    codec = make_codec("mha", layers, page_size, head_dim, torch.bfloat16, backend)
    k, v = codec.layout.buffers[0::2], codec.layout.buffers[1::2]
    records = codec.export_pages([4, 2]).data.view(2, -1)
    for j, page in enumerate([4, 2]):
        rows = slice(page * page_size, (page + 1) * page_size)
        pieces = [t[rows].contiguous().view(-1).view(torch.uint8) for layer in range(layers) for t in (k[layer], v[layer])]
        assert torch.equal(records[j], torch.cat(pieces))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_different_k_and_v_head_dims(backend: str) -> None:
    """MHA pools with v_head_dim != head_dim (SGLang allows it): chunks of unequal size per record."""
    k = random_buffers(2, 64, 2, 192, torch.bfloat16, seed=1)
    v = random_buffers(2, 64, 2, 128, torch.bfloat16, seed=2)
    codec = KVPageCodec.from_mha(k, v, 16, backend=backend)
    exported = codec.export_pages([3, 1], checksum=True)
    ref, sums = reference_export(codec.layout, [3, 1])
    assert torch.equal(exported.data, ref) and torch.equal(exported.checksums, sums)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_batch_of_requests_is_concatenation(backend: str) -> None:
    codec = make_codec("mha", 2, 16, 64, torch.float16, backend)
    a, b = [3, 1], [6, 2, 5]
    both = codec.export_pages(a + b).data
    assert torch.equal(both, torch.cat([codec.export_pages(a).data, codec.export_pages(b).data]))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_flipped_byte_is_reported_with_its_page(backend: str) -> None:
    codec = make_codec("mha", 3, 16, 128, torch.bfloat16, backend)
    exported = codec.export_pages([1, 2, 3, 4], checksum=True)
    rng = random.Random(7)
    record = 2
    byte = record * codec.page_bytes + rng.randrange(codec.page_bytes)
    exported.data[byte] ^= 1 << rng.randrange(8)
    with pytest.raises(KVChecksumError) as err:
        codec.import_pages(exported, [5, 6, 7, 8])
    assert err.value.positions == [record]
    assert err.value.pages == [7]
    assert "record 2 -> page 7" in str(err.value)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_swapped_words_are_detected(backend: str) -> None:
    """The position weights catch reorderings that keep the plain sum."""
    codec = make_codec("mla", 2, 1, 64, torch.float32, backend)
    exported = codec.export_pages([1, 2], checksum=True)
    words = exported.data.view(torch.int32)
    words[[3, 9]] = words[[9, 3]].clone()
    if words[3] == words[9]:
        pytest.skip("random data produced equal words")
    with pytest.raises(KVChecksumError) as err:
        codec.import_pages(exported, [3, 4])
    assert err.value.positions == [0]


def test_checksum_definition() -> None:
    """record_checksums is sum_i u32(word_i) * (2i+1) mod 2**64, computed here with Python integers."""
    data = torch.randint(0, 256, (3 * 64,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    data[:4] = 255  # a word with the top bit set exercises the unsigned read
    got = record_checksums(data, 64).tolist()
    for j in range(3):
        rec = bytes(data[j * 64 : (j + 1) * 64].tolist())
        words = [int.from_bytes(rec[i : i + 4], "little") for i in range(0, 64, 4)]
        want = sum(w * (2 * i + 1) for i, w in enumerate(words)) % 2**64
        assert got[j] % 2**64 == want


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_empty_request(backend: str) -> None:
    codec = make_codec("mha", 1, 16, 64, torch.bfloat16, backend)
    exported = codec.export_pages([], checksum=True)
    assert exported.data.numel() == 0 and exported.num_pages == 0
    codec.import_pages(exported, [])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_out_of_range_page_is_rejected(backend: str) -> None:
    codec = make_codec("mha", 1, 16, 64, torch.bfloat16, backend, pool_pages=4)
    with pytest.raises((IndexError, RuntimeError), match="4"):
        codec.export_pages([1, 4])


def test_unsupported_dtype_is_named() -> None:
    bufs = [torch.zeros(32, 2, 64, dtype=torch.float64)] * 2
    with pytest.raises(TypeError, match="float64"):
        KVPageCodec.from_mha(bufs[:1], bufs[1:], 16)
    with pytest.raises(TypeError, match="int32"):
        KVPageCodec.from_mla([torch.zeros(32, 1, 576, dtype=torch.int32)], 16)


@pytest.mark.parametrize(
    "buffers,page_size,message",
    [
        ([torch.zeros(32, 2, 64, dtype=torch.bfloat16)], 8, "page size 8"),
        ([torch.zeros(32, 64, 2, dtype=torch.bfloat16).transpose(1, 2)], 16, "contiguous"),
        ([torch.zeros(4, 32, 2, 64, dtype=torch.bfloat16)], 16, r"\[pool_tokens, heads, head_dim\]"),
        ([torch.zeros(32, 1, 3, dtype=torch.uint8)], 16, "multiple of 4"),
        ([torch.zeros(32, 2, 64, dtype=torch.bfloat16), torch.zeros(48, 2, 64, dtype=torch.bfloat16)], 16, "rows"),
        ([torch.zeros(8, 2, 64, dtype=torch.bfloat16)], 16, "no page"),
    ],
    ids=["page-size", "non-contiguous", "hnd-4d", "odd-row", "row-mismatch", "too-small"],
)
def test_unsupported_layouts_are_explained(buffers: list[torch.Tensor], page_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVPoolLayout.from_buffers("mla", buffers, page_size)


def test_buffer_arguments_are_checked() -> None:
    codec = make_codec("mha", 1, 16, 64, torch.bfloat16, "cpp")
    with pytest.raises(ValueError, match="exactly"):
        codec.export_pages([1, 2], out=torch.empty(codec.page_bytes, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        codec.import_pages(torch.empty(codec.page_bytes // 2, dtype=torch.float16), [1])
    with pytest.raises(TypeError, match="integers"):
        codec.export_pages(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="checksums"):
        codec.import_pages(codec.export_pages([1]).data, [2], checksums=torch.zeros(3, dtype=torch.int64))


def test_page_indices_of_slots() -> None:
    slots = torch.tensor([32, 33, 34, 35, 80, 81], dtype=torch.int32)  # pages 8 and 20 of size 4
    assert KVPageCodec.pages_of_slots(slots, 4).tolist() == [8, 20]


def test_cpu_dispatch_prefers_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert select_backend(torch.device("cpu")).name == "cpp"
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert select_backend(torch.device("cpu")).name == "torch"
    with pytest.raises(ValueError, match="cannot run on device cpu"):
        select_backend(torch.device("cpu"), "cuda")
    with pytest.raises(ValueError, match="unknown KV backend"):
        select_backend(torch.device("cpu"), "bogus")


def test_sglang_pool_variants_are_refused() -> None:
    class MHATokenToKVPoolFP4:  # stands in for SGLang's quantized subclass
        pass

    with pytest.raises(TypeError, match="MHATokenToKVPoolFP4"):
        KVPageCodec.from_sglang_pool(MHATokenToKVPoolFP4())

    class MHATokenToKVPool:  # an SGLang pool with the head-major layout
        kv_cache_layout = "hnd"

    with pytest.raises(ValueError, match="hnd"):
        KVPageCodec.from_sglang_pool(MHATokenToKVPool())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_rows_without_16_byte_alignment(backend: str, page_size: int) -> None:
    """140-byte rows: chunks are only 4-byte aligned, so the C++ code takes its portable (memcpy) path."""
    codec = make_codec("mla", 2, page_size, 70, torch.float16, backend)
    exported = codec.export_pages([2, 5, 1], checksum=True)
    ref, sums = reference_export(codec.layout, [2, 5, 1])
    assert torch.equal(exported.data, ref) and torch.equal(exported.checksums, sums)
    codec.import_pages(exported, [3, 4, 6])
    assert torch.equal(codec.export_pages([3, 4, 6]).data, ref)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_large_transfer_with_streaming_stores(backend: str) -> None:
    """Over 8 MiB the C++ code switches to cache-bypassing stores; the bytes must not change."""
    codec = make_codec("mha", 2, 64, 128, torch.bfloat16, backend, pool_pages=150)
    pages = list(range(149, 149 - 2 * 72, -2))  # 72 scattered pages, 9 MiB
    assert codec.layout.buffer_bytes(len(pages)) >= 9 * 2**20
    exported = codec.export_pages(pages, checksum=True)
    ref, sums = reference_export(codec.layout, pages)
    assert torch.equal(exported.data, ref) and torch.equal(exported.checksums, sums)
    targets = [p - 1 for p in pages]
    codec.import_pages(exported, targets)
    assert torch.equal(codec.export_pages(targets).data, ref)
