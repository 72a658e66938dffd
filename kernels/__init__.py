"""KV export/import between SGLang's paged KV pools and one contiguous page-first buffer (installed as
``sglang_prorsa.kernels``).

Public API::

    codec = KVPageCodec.from_sglang_pool(token_to_kv_pool)      # or .from_mha(k_bufs, v_bufs, page_size) / .from_mla
    exp = codec.export_pages(pages, checksum=True)              # KVExport: flat uint8 records + int64 checksums
    codec.import_pages(exp, new_pages)                          # verifies checksums; KVChecksumError on mismatch

Record layout: ``kernels/layout.py``. Checksum: ``kernels/checksum.py``. Backends: CUDA extension (``csrc/``) or
Triton on GPUs, the OpenMP C++ extension or vectorised torch on CPUs (``kernels/dispatch.py``).
"""

from .codec import KVChecksumError, KVExport, KVPageCodec
from .layout import SUPPORTED_DTYPES, SUPPORTED_PAGE_SIZES, KVPoolLayout

__all__ = [
    "KVChecksumError",
    "KVExport",
    "KVPageCodec",
    "KVPoolLayout",
    "SUPPORTED_DTYPES",
    "SUPPORTED_PAGE_SIZES",
]
