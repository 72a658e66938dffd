"""CUDA backend: the kernels of ``csrc/kv_pages_cuda.cu``, JIT-built once (needs nvcc and a CUDA build of torch)."""

from __future__ import annotations

from typing import Any

import torch

from .ext_build import ExtensionUnavailable, load_ops
from .layout import KVPoolLayout

NAMESPACE = "prorsa_kv_cuda"
SOURCES = ("kv_pages_cuda.cu",)
CUDA_CFLAGS = ("-O3",)  # cpp_extension adds --expt-relaxed-constexpr and friends itself


def load() -> Any:
    """``torch.ops.prorsa_kv_cuda``; raises ExtensionUnavailable if CUDA or the toolkit is missing or the build fails."""
    if not torch.cuda.is_available():
        raise ExtensionUnavailable("no CUDA device")
    # cpp_extension targets the visible GPUs' architectures (or $TORCH_CUDA_ARCH_LIST) by itself.
    return load_ops(NAMESPACE, SOURCES, cflags=("-O3",), cuda_cflags=CUDA_CFLAGS)


class CudaBackend:
    """Warp per (record, buffer) chunk, 16-byte vector copies, checksums by warp reduction and one atomic per chunk."""

    name = "cuda"

    def __init__(self) -> None:
        self._ops = load()

    @staticmethod
    def _no_sums(layout: KVPoolLayout) -> torch.Tensor:
        return layout.cached("cuda_no_sums", lambda: torch.empty(0, dtype=torch.int64, device=layout.device))

    def gather(self, layout: KVPoolLayout, pages: torch.Tensor, out: torch.Tensor, sums: torch.Tensor | None) -> None:
        self._ops.export_pages(
            layout.pointer_table(),
            layout.chunk_table(),
            pages,
            layout.pool_pages,
            out,
            self._no_sums(layout) if sums is None else sums,
        )

    def scatter(self, layout: KVPoolLayout, data: torch.Tensor, pages: torch.Tensor, sums: torch.Tensor | None) -> None:
        self._ops.import_pages(
            layout.pointer_table(),
            layout.chunk_table(),
            pages,
            layout.pool_pages,
            data,
            self._no_sums(layout) if sums is None else sums,
        )
