"""Reads the buffers of a live SGLang 0.5.23 KV pool into a KVPoolLayout, refusing pool variants we do not handle.

Duck-typed on purpose (no sglang import): the kernels must load on machines without SGLang, such as a bare GPU box.
"""

from __future__ import annotations

from typing import Any

from .layout import KVPoolLayout

# Exact class names only: subclasses such as MHATokenToKVPoolFP4, MHATokenToKVPoolMXFP8, PageMajorMHATokenToKVPool,
# MLATokenToKVPoolFP4 and DSATokenToKVPool add scale/index buffers or change the row layout, and moving only the
# buffers listed here would silently lose part of their KV.
_MHA_POOLS = {"MHATokenToKVPool"}
_MLA_POOLS = {"MLATokenToKVPool"}


def layout_of_pool(pool: Any) -> KVPoolLayout:
    """Layout of ``pool`` (``MHATokenToKVPool``: K/V per layer; ``MLATokenToKVPool``: one latent per layer)."""
    cls = type(pool).__name__
    if cls in _MHA_POOLS:
        # SGLang's alternatives to token-major rows ("hnd": [pages, heads, page, dim], ROCm's "vectorized_5d") keep a
        # page contiguous but order its bytes differently, so records would not be interchangeable with "nhd" pools.
        # Declared in srt/common/sglang_internals.py and checked at start-up, like k_buffer, v_buffer and page_size.
        pool_layout = pool.kv_cache_layout
        if pool_layout != "nhd":
            raise ValueError(f"{cls} with kv_cache_layout={pool_layout!r} is not supported; only 'nhd'")
        # getattr: SGLang 0.5.23 sets the scale buffers only off NPU (and reads them with getattr itself).
        if getattr(pool, "k_scale_buffer", None) is not None or getattr(pool, "v_scale_buffer", None) is not None:
            raise ValueError(f"{cls} with per-token scale buffers (quantized KV) is not supported")
        return KVPoolLayout.from_mha(pool.k_buffer, pool.v_buffer, pool.page_size)
    if cls in _MLA_POOLS:
        return KVPoolLayout.from_mla(pool.kv_buffer, pool.page_size)
    supported = sorted(_MHA_POOLS | _MLA_POOLS)
    raise TypeError(f"unsupported KV pool type {cls}; supported: {supported}")
