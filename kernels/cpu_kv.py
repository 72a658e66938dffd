"""CPU backend: the OpenMP C++ kernels of ``csrc/kv_pages_cpu.cpp``, JIT-built once into the extension cache."""

from __future__ import annotations

from typing import Any

import torch

from .ext_build import ExtensionUnavailable, load_ops
from .layout import KVPoolLayout

NAMESPACE = "prorsa_kv_cpu"
SOURCES = ("kv_pages_cpu.cpp",)
CFLAGS = ("-O3", "-fopenmp")

_NO_SUMS = torch.empty(0, dtype=torch.int64)


def load() -> Any:
    """``torch.ops.prorsa_kv_cpu``; raises ExtensionUnavailable (with the compiler's reason) if it cannot be built."""
    return load_ops(NAMESPACE, SOURCES, cflags=CFLAGS)


def available() -> bool:
    try:
        load()
    except ExtensionUnavailable:
        return False
    return True


class CppBackend:
    """Parallel over records; every record is one memcpy per buffer chunk, checksummed while in cache."""

    name = "cpp"

    def __init__(self) -> None:
        self._ops = load()

    def gather(self, layout: KVPoolLayout, pages: torch.Tensor, out: torch.Tensor, sums: torch.Tensor | None) -> None:
        self._ops.export_pages(
            layout.pointer_table(), layout.chunk_table(), pages, layout.pool_pages, out, _NO_SUMS if sums is None else sums
        )

    def scatter(self, layout: KVPoolLayout, data: torch.Tensor, pages: torch.Tensor, sums: torch.Tensor | None) -> None:
        self._ops.import_pages(
            layout.pointer_table(), layout.chunk_table(), pages, layout.pool_pages, data, _NO_SUMS if sums is None else sums
        )
