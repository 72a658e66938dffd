"""The contract every export/import backend fulfils; the codec validates arguments before calling one."""

from __future__ import annotations

from typing import Protocol

import torch

from .layout import KVPoolLayout


class KVBackend(Protocol):
    """Moves whole pages between a pool and page-first records (layout in ``kernels/layout.py``).

    Arguments arrive validated: ``pages`` is a contiguous int64 vector on the pool's device, the transfer buffer is a
    contiguous flat uint8 tensor of exactly ``len(pages) * layout.page_bytes`` bytes on the same device, and ``sums``
    is None or a contiguous int64 vector of ``len(pages)``. Page indices must be in range (backends still check where
    that is free); for ``scatter`` they must also be distinct, as freshly allocated pages are.
    """

    name: str

    def gather(self, layout: KVPoolLayout, pages: torch.Tensor, out: torch.Tensor, sums: torch.Tensor | None) -> None:
        """Export: writes record ``j`` of ``out`` from pool page ``pages[j]``; fills ``sums`` if given."""
        ...

    def scatter(self, layout: KVPoolLayout, data: torch.Tensor, pages: torch.Tensor, sums: torch.Tensor | None) -> None:
        """Import: writes record ``j`` of ``data`` into pool page ``pages[j]``; fills ``sums`` with the checksums
        of the records it read, if given."""
        ...
