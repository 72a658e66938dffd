"""KVPageCodec: export a request's KV pages from a SGLang pool into one page-first buffer, and import it back.

The buffer layout is documented in ``kernels/layout.py``; the checksum in ``kernels/checksum.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .backend import KVBackend
from .dispatch import select_backend
from .layout import KVPoolLayout
from .sglang_pool import layout_of_pool

PageIndices = torch.Tensor | Sequence[int]


@dataclass(frozen=True)
class KVExport:
    """Exported KV: ``data`` is a flat uint8 buffer of ``num_pages`` records of ``page_bytes`` each, in the order
    of the requested pages; ``checksums`` (int64, one per record) is present when export was asked to compute it."""

    data: torch.Tensor
    checksums: torch.Tensor | None
    page_bytes: int

    @property
    def num_pages(self) -> int:
        return self.data.numel() // self.page_bytes

    def records(self) -> torch.Tensor:
        """``data`` as ``[num_pages, page_bytes]``: row ``j`` is the ``j``-th exported page, all layers."""
        return self.data.view(self.num_pages, self.page_bytes)


class KVChecksumError(RuntimeError):
    """Import found records whose bytes do not match the checksums computed at export.

    ``positions`` are record numbers in the imported buffer; ``pages`` the pool pages they were written to (their
    content is untrusted: free or overwrite them).
    """

    def __init__(self, positions: list[int], pages: list[int]) -> None:
        self.positions = positions
        self.pages = pages
        shown = ", ".join(f"record {j} -> page {p}" for j, p in list(zip(positions, pages))[:16])
        more = f" (+{len(positions) - 16} more)" if len(positions) > 16 else ""
        super().__init__(f"KV checksum mismatch in {len(positions)} record(s): {shown}{more}")


class KVPageCodec:
    """Moves whole pages of one pool between the pool and page-first transfer buffers.

    One kernel launch per call, whatever the number of layers and pages: to move a batch of requests, concatenate
    their page indices; request ``r``'s KV is then the run of records that its pages occupy.

    Pages are pool pages (``slot // page_size``); with page size 1 they are token slots. A request whose last page
    is partly filled still moves that whole page (the unused slots carry whatever the pool held).
    """

    def __init__(self, layout: KVPoolLayout, backend: str | None = None) -> None:
        self.layout = layout
        self.backend: KVBackend = select_backend(layout.device, backend)

    @classmethod
    def from_mha(
        cls,
        k_buffers: Sequence[torch.Tensor],
        v_buffers: Sequence[torch.Tensor],
        page_size: int,
        backend: str | None = None,
    ) -> "KVPageCodec":
        """MHA pool given as per-layer ``[pool_tokens, heads, head_dim]`` K and V buffers."""
        return cls(KVPoolLayout.from_mha(k_buffers, v_buffers, page_size), backend)

    @classmethod
    def from_mla(cls, kv_buffers: Sequence[torch.Tensor], page_size: int, backend: str | None = None) -> "KVPageCodec":
        """MLA pool given as per-layer ``[pool_tokens, 1, kv_lora_rank + rope_dim]`` latent buffers."""
        return cls(KVPoolLayout.from_mla(kv_buffers, page_size), backend)

    @classmethod
    def from_sglang_pool(cls, pool: Any, backend: str | None = None) -> "KVPageCodec":
        """A live ``MHATokenToKVPool`` or ``MLATokenToKVPool``."""
        return cls(layout_of_pool(pool), backend)

    @property
    def page_bytes(self) -> int:
        return self.layout.page_bytes

    @staticmethod
    def pages_of_slots(slots: torch.Tensor, page_size: int) -> torch.Tensor:
        """Pages holding a request's token slots (``req_to_token`` row, in token order).

        Pages are whole and allocated in order, so every ``page_size``-th slot starts a new page.
        """
        return slots[::page_size].to(torch.int64) // page_size

    def export_pages(self, pages: PageIndices, *, out: torch.Tensor | None = None, checksum: bool = False) -> KVExport:
        """Gathers ``pages`` (all layers) into ``out`` (or a new buffer) as page-first records."""
        idx = self._indices(pages)
        nbytes = self.layout.buffer_bytes(idx.numel())
        if out is None:
            out = torch.empty(nbytes, dtype=torch.uint8, device=self.layout.device)
        else:
            self._check_buffer(out, nbytes, "out")
        sums = torch.empty(idx.numel(), dtype=torch.int64, device=self.layout.device) if checksum else None
        if idx.numel():
            self.backend.gather(self.layout, idx, out, sums)
        return KVExport(out, sums, self.layout.page_bytes)

    def import_pages(
        self, data: KVExport | torch.Tensor, pages: PageIndices, *, checksums: torch.Tensor | None = None
    ) -> None:
        """Scatters the records of ``data`` into the (distinct, freshly allocated) ``pages`` of the pool.

        Checksums (``checksums=`` or those carried by a KVExport) are verified from the bytes as they are written;
        a mismatch raises KVChecksumError naming the bad records after all pages have been written.
        """
        if isinstance(data, KVExport):
            if data.page_bytes != self.layout.page_bytes:
                raise ValueError(f"records of {data.page_bytes} bytes do not fit this pool's {self.page_bytes}")
            checksums = data.checksums if checksums is None else checksums
            data = data.data
        idx = self._indices(pages)
        self._check_buffer(data, self.layout.buffer_bytes(idx.numel()), "data")
        sums = None
        if checksums is not None:
            if checksums.shape != (idx.numel(),):
                raise ValueError(f"expected {idx.numel()} checksums, got shape {tuple(checksums.shape)}")
            sums = torch.empty(idx.numel(), dtype=torch.int64, device=self.layout.device)
        if idx.numel():
            self.backend.scatter(self.layout, data, idx, sums)
        if sums is not None:
            bad = torch.nonzero(sums != checksums.to(device=sums.device, dtype=torch.int64)).flatten()
            if bad.numel():
                positions = bad.tolist()
                raise KVChecksumError(positions, idx[bad].tolist())

    def _indices(self, pages: PageIndices) -> torch.Tensor:
        """Page indices as a contiguous int64 vector on the pool's device, range-checked."""
        if isinstance(pages, torch.Tensor):
            if pages.dtype.is_floating_point or pages.dtype.is_complex or pages.dtype == torch.bool:
                raise TypeError(f"page indices must be integers, got {pages.dtype}")
            if pages.dim() != 1:
                raise ValueError(f"page indices must be a vector, got shape {tuple(pages.shape)}")
            idx = pages.to(device=self.layout.device, dtype=torch.int64).contiguous()
        else:
            idx = torch.tensor(list(pages), dtype=torch.int64, device=self.layout.device)
        # The C++ backend checks bounds itself while it reads the indices; elsewhere a bad index would be an
        # out-of-bounds access on the device, so check here (one small reduction).
        if idx.numel() and self.backend.name != "cpp":
            if bool(((idx < 0) | (idx >= self.layout.pool_pages)).any()):
                bad = idx[(idx < 0) | (idx >= self.layout.pool_pages)][:8].tolist()
                raise IndexError(f"page indices {bad} are outside the pool's {self.layout.pool_pages} pages")
        return idx

    def _check_buffer(self, t: torch.Tensor, nbytes: int, name: str) -> None:
        if t.dtype != torch.uint8 or t.dim() != 1 or not t.is_contiguous():
            raise TypeError(f"{name} must be a contiguous flat uint8 tensor, got dtype={t.dtype} shape={tuple(t.shape)}")
        if t.numel() != nbytes:
            raise ValueError(f"{name} has {t.numel()} bytes; these pages need exactly {nbytes}")
        if t.device != self.layout.device:
            raise ValueError(f"{name} is on {t.device} but the pool is on {self.layout.device}")
