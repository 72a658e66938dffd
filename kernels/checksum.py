"""The per-page checksum, defined once here in plain torch; every backend computes the same value.

A record (one page of the page-first layout) is read as little-endian unsigned 32-bit words ``w_0 .. w_{n-1}``::

    checksum = sum_i  w_i * (2*i + 1)   (mod 2**64), stored as the int64 with the same bits.

Why this function: it is a single multiply-add per word, so a kernel computes it while the word is in a register on
its way to the destination, and it splits over any partition of the record (a chunk starting at word ``f``
contributes ``sum_j w_{f+j} * (2*(f+j) + 1)``), so parallel pieces just add up. Odd weights are invertible modulo
2**64, so any change confined to one word (a flipped byte, say) always changes the sum; the position weight also
catches swapped or shifted words, which a plain sum would not. It guards against bugs and torn copies, not against
an adversary.
"""

from __future__ import annotations

import torch

from .layout import WORD_BYTES

_U32_MASK = 0xFFFFFFFF


def record_checksums(records: torch.Tensor, page_bytes: int, rows_per_step: int = 64) -> torch.Tensor:
    """Checksums of every record in a flat ``uint8`` buffer of whole records; int64 ``[num_records]``.

    Works on any device. Records are processed ``rows_per_step`` at a time to bound the int64 temporaries.
    """
    if records.dtype != torch.uint8 or records.dim() != 1:
        raise TypeError(f"expected a flat uint8 buffer, got dtype={records.dtype} shape={tuple(records.shape)}")
    if page_bytes % WORD_BYTES or records.numel() % page_bytes:
        raise ValueError(f"buffer of {records.numel()} bytes is not whole records of {page_bytes} bytes")
    words_per_page = page_bytes // WORD_BYTES
    words = records.view(torch.int32).view(-1, words_per_page)
    weights = torch.arange(words_per_page, dtype=torch.int64, device=records.device) * 2 + 1
    out = torch.empty(words.shape[0], dtype=torch.int64, device=records.device)
    for start in range(0, words.shape[0], rows_per_step):
        block = words[start : start + rows_per_step].to(torch.int64) & _U32_MASK
        # int64 arithmetic wraps modulo 2**64, which is exactly the definition above.
        out[start : start + rows_per_step] = (block * weights).sum(dim=1)
    return out
