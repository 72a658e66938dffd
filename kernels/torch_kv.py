"""Vectorised-torch backend: one indexed copy per pool buffer. Runs on any device; the fallback when no compiled or
Triton kernel is available (and a second, independent implementation for the tests)."""

from __future__ import annotations

import torch

from .checksum import record_checksums
from .layout import KVPoolLayout


def _pages_view(layout: KVPoolLayout, buffer_index: int) -> torch.Tensor:
    """A pool buffer as ``[pool_pages, chunk_bytes]`` bytes (rows past the last whole page are left out)."""
    chunk = layout.chunk_bytes[buffer_index]
    flat = layout.buffers[buffer_index].view(-1).view(torch.uint8)
    return flat[: layout.pool_pages * chunk].view(layout.pool_pages, chunk)


class TorchBackend:
    """Per buffer: ``records[:, chunk] = pool[pages]`` (export) or ``pool[pages] = records[:, chunk]`` (import)."""

    name = "torch"

    def gather(self, layout: KVPoolLayout, pages: torch.Tensor, out: torch.Tensor, sums: torch.Tensor | None) -> None:
        records = out.view(-1, layout.page_bytes)
        for b, offset in enumerate(layout.chunk_offsets):
            records[:, offset : offset + layout.chunk_bytes[b]] = _pages_view(layout, b).index_select(0, pages)
        if sums is not None:
            sums.copy_(record_checksums(out, layout.page_bytes))

    def scatter(self, layout: KVPoolLayout, data: torch.Tensor, pages: torch.Tensor, sums: torch.Tensor | None) -> None:
        records = data.view(-1, layout.page_bytes)
        for b, offset in enumerate(layout.chunk_offsets):
            _pages_view(layout, b).index_copy_(0, pages, records[:, offset : offset + layout.chunk_bytes[b]])
        if sums is not None:
            sums.copy_(record_checksums(data, layout.page_bytes))
