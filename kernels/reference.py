"""Executable specification of export and import: one slice copy per page per buffer, written for clarity.

Tests hold every backend to these functions; nothing on a hot path calls them.
"""

from __future__ import annotations

import torch

from .checksum import record_checksums
from .layout import KVPoolLayout


def _chunk(layout: KVPoolLayout, buffer_index: int, page: int) -> torch.Tensor:
    """Bytes of one page of one pool buffer, as a view into the pool."""
    size = layout.chunk_bytes[buffer_index]
    flat = layout.buffers[buffer_index].view(-1).view(torch.uint8)
    return flat[page * size : (page + 1) * size]


def reference_export(layout: KVPoolLayout, pages: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Page-first buffer of ``pages`` and its per-record checksums."""
    out = torch.empty(layout.buffer_bytes(len(pages)), dtype=torch.uint8, device=layout.device)
    for j, page in enumerate(pages):
        for b, offset in enumerate(layout.chunk_offsets):
            start = j * layout.page_bytes + offset
            out[start : start + layout.chunk_bytes[b]] = _chunk(layout, b, page)
    return out, record_checksums(out, layout.page_bytes)


def reference_import(layout: KVPoolLayout, data: torch.Tensor, pages: list[int]) -> None:
    """Writes the records of ``data`` into ``pages`` of the pool."""
    for j, page in enumerate(pages):
        for b, offset in enumerate(layout.chunk_offsets):
            start = j * layout.page_bytes + offset
            _chunk(layout, b, page).copy_(data[start : start + layout.chunk_bytes[b]])
