"""A SGLang KV pool seen as a list of paged byte buffers, and the page-first transfer layout built from it.

Pool side
---------
SGLang keeps the KV cache as one tensor per layer and per component, each of shape ``[pool_tokens, heads, head_dim]``:

* MHA (``MHATokenToKVPool``): ``k_buffer[l]`` and ``v_buffer[l]`` with ``heads`` KV heads per layer;
* MLA (``MLATokenToKVPool``): ``kv_buffer[l]`` with one "head" of ``kv_lora_rank + qk_rope_head_dim`` values.

A token's row is contiguous and token slot ``s`` lives at row ``s``. With page size ``P`` the allocator hands out
page ``i`` as slots ``i*P .. i*P+P-1``, so one page of one buffer is a single contiguous run of ``P * row_bytes``
bytes: a *chunk*. Export and import therefore move whole chunks and never look at dtypes, which is why fp8 (or
SGLang's ``uint8`` storage of it) moves exactly like bf16.

The buffers are ordered ``K_0, V_0, K_1, V_1, ...`` for MHA and ``C_0, C_1, ...`` for MLA.

Transfer side (the page-first layout)
-------------------------------------
A transfer buffer for ``n`` pages is a flat ``uint8`` tensor of ``n * page_bytes`` bytes. Record ``j`` (bytes
``j*page_bytes .. (j+1)*page_bytes``) holds the ``j``-th requested page: the chunk of every buffer in the order
above, back to back, i.e. ``K_0[page] V_0[page] K_1[page] V_1[page] ...``. Inside a chunk the rows keep their pool
order (token-major, then head, then head_dim). ``page_bytes = P * sum(row_bytes)``. Because a record holds a whole
page for all layers, any prefix of records is a usable prefix of the request, and a batch of requests is simply
the concatenation of their records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import torch

PoolKind = Literal["mha", "mla"]

# The dtypes a pool may hold. Bytes are moved verbatim, so the list is about what we have tested and promise, not
# about arithmetic. SGLang stores fp8 KV as uint8 (its "store_dtype"), hence the raw-byte entry.
SUPPORTED_DTYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8 e4m3",
    torch.float8_e4m3fnuz: "fp8 e4m3 (fnuz)",
    torch.uint8: "raw bytes (SGLang's storage for fp8 pools)",
}

SUPPORTED_PAGE_SIZES = (1, 16, 64)

# Every chunk and record is moved and checksummed as 32-bit words.
WORD_BYTES = 4


def _describe(t: torch.Tensor) -> str:
    return f"shape={tuple(t.shape)} dtype={t.dtype} device={t.device}"


def _check_buffer(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        supported = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name}: unsupported KV dtype {t.dtype}; supported: {supported}")
    if t.dim() != 3:
        raise ValueError(f"{name}: expected a [pool_tokens, heads, head_dim] buffer, got {_describe(t)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: KV buffer must be contiguous (rows are moved as raw bytes), got {_describe(t)}")
    if t.data_ptr() % WORD_BYTES:
        raise ValueError(f"{name}: KV buffer must be {WORD_BYTES}-byte aligned, got address {t.data_ptr():#x}")
    row_bytes = t[0].numel() * t.element_size()
    if row_bytes % WORD_BYTES:
        raise ValueError(f"{name}: a token row of {row_bytes} bytes is not a multiple of {WORD_BYTES} ({_describe(t)})")


@dataclass(frozen=True, eq=False)
class KVPoolLayout:
    """The paged buffers of one pool and the derived byte geometry of a page-first record (see module docstring).

    Holds references to the buffers: the raw addresses used by the kernels stay valid while this object lives.
    Build a new layout if the pool's tensors are ever replaced.
    """

    kind: PoolKind
    buffers: tuple[torch.Tensor, ...]
    page_size: int
    pool_pages: int
    chunk_bytes: tuple[int, ...]
    chunk_offsets: tuple[int, ...]
    page_bytes: int
    _tables: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_buffers(cls, kind: PoolKind, buffers: Sequence[torch.Tensor], page_size: int) -> "KVPoolLayout":
        """Validates ``buffers`` (already in record order) and derives the record geometry."""
        if page_size not in SUPPORTED_PAGE_SIZES:
            raise ValueError(f"unsupported page size {page_size}; supported: {SUPPORTED_PAGE_SIZES}")
        if not buffers:
            raise ValueError("a KV pool needs at least one buffer")
        for i, t in enumerate(buffers):
            _check_buffer(t, f"buffer {i}")
        first = buffers[0]
        for i, t in enumerate(buffers):
            if t.device != first.device:
                raise ValueError(f"buffer {i} is on {t.device}, buffer 0 on {first.device}: one pool, one device")
            if t.shape[0] != first.shape[0]:
                raise ValueError(f"buffer {i} has {t.shape[0]} token rows, buffer 0 has {first.shape[0]}")
        pool_pages = first.shape[0] // page_size
        if pool_pages == 0:
            raise ValueError(f"pool of {first.shape[0]} tokens holds no page of {page_size}")
        chunk_bytes = tuple(page_size * t[0].numel() * t.element_size() for t in buffers)
        offsets, total = [], 0
        for c in chunk_bytes:
            offsets.append(total)
            total += c
        return cls(kind, tuple(buffers), page_size, pool_pages, chunk_bytes, tuple(offsets), total)

    @classmethod
    def from_mha(
        cls, k_buffers: Sequence[torch.Tensor], v_buffers: Sequence[torch.Tensor], page_size: int
    ) -> "KVPoolLayout":
        """MHA pool: per layer a K and a V buffer (``MHATokenToKVPool.k_buffer`` / ``v_buffer``)."""
        if len(k_buffers) != len(v_buffers):
            raise ValueError(f"MHA pool with {len(k_buffers)} K buffers but {len(v_buffers)} V buffers")
        interleaved = [t for kv in zip(k_buffers, v_buffers) for t in kv]
        return cls.from_buffers("mha", interleaved, page_size)

    @classmethod
    def from_mla(cls, kv_buffers: Sequence[torch.Tensor], page_size: int) -> "KVPoolLayout":
        """MLA pool: per layer one latent buffer ``[pool_tokens, 1, kv_lora_rank + rope_dim]``."""
        return cls.from_buffers("mla", list(kv_buffers), page_size)

    @property
    def device(self) -> torch.device:
        return self.buffers[0].device

    @property
    def num_layers(self) -> int:
        return len(self.buffers) // 2 if self.kind == "mha" else len(self.buffers)

    def buffer_bytes(self, num_pages: int) -> int:
        """Size in bytes of a transfer buffer holding ``num_pages`` records."""
        return num_pages * self.page_bytes

    def cached(self, key: str, build: Any) -> Any:
        """Per-layout memo for backend tables (pointer arrays etc.), built once by ``build()``."""
        if key not in self._tables:
            self._tables[key] = build()
        return self._tables[key]

    def pointer_table(self) -> torch.Tensor:
        """int64 ``[num_buffers]`` on the pool's device: the base address of every buffer, in record order."""
        return self.cached(
            "ptrs", lambda: torch.tensor([t.data_ptr() for t in self.buffers], dtype=torch.int64, device=self.device)
        )

    def chunk_table(self) -> torch.Tensor:
        """int64 ``[2, num_buffers]`` on the pool's device: chunk bytes and chunk offset within a record."""
        return self.cached(
            "chunks",
            lambda: torch.tensor([self.chunk_bytes, self.chunk_offsets], dtype=torch.int64, device=self.device),
        )
