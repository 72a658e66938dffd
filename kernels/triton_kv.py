"""Triton backend: one launch moves every (record, buffer) chunk of a request, as 32-bit words.

Grid ``(num_pages, num_buffers)``: program ``(j, b)`` copies the chunk of pool buffer ``b`` at page ``pages[j]`` to or
from its place in record ``j`` (layout in ``kernels/layout.py``), looping over the chunk in ``BLOCK``-word steps.

Triton has no array-of-pointers argument, so the per-layer base addresses travel as a device array of *word offsets
from buffer 0* (``deltas``): ``buffer0 + deltas[b]`` is buffer ``b``'s base. Every buffer is 4-byte aligned (checked
by the layout), which makes those offsets whole words.

With checksums, each program also returns its chunk's share of the record checksum (``kernels/checksum.py``) in a
``[num_pages, num_buffers]`` array that a tiny torch reduction sums per record (sums wrap modulo 2**64 as int64).
Runs on GPUs, and on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests exercise it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import WORD_BYTES, KVPoolLayout

# Largest step (in words) a program takes through its chunk; 4096 words = 16 KiB, 32 words (8 x 16 B) per thread
# at 4 warps.
MAX_BLOCK = 4096


@triton.jit
def _move_chunks(
    base_ptr,  # int32 words of buffer 0; buffer b starts at base_ptr + deltas[b]
    deltas_ptr,  # int64 [num_buffers]
    chunk_words_ptr,  # int64 [num_buffers]: words of one page of buffer b
    offset_words_ptr,  # int64 [num_buffers]: where buffer b's chunk starts inside a record
    pages_ptr,  # int64 [num_pages]
    records_ptr,  # int32 words of the transfer buffer
    partials_ptr,  # int64 [num_pages, num_buffers] checksum shares (only written with CHECKSUM)
    page_words,  # words per record
    num_buffers,
    EXPORT: tl.constexpr,
    CHECKSUM: tl.constexpr,
    ALIGNED: tl.constexpr,  # every chunk start is 16-byte aligned on both sides: allow 16-byte vector accesses
    BLOCK: tl.constexpr,
):
    j = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    page = tl.load(pages_ptr + j)
    chunk = tl.load(chunk_words_ptr + b)
    first = tl.load(offset_words_ptr + b)
    pool_start = tl.load(deltas_ptr + b) + page * chunk
    record_start = j * page_words + first
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for step in range(0, chunk, BLOCK):
        lane = step + tl.arange(0, BLOCK)
        mask = lane < chunk
        pool_off = pool_start + lane
        record_off = record_start + lane
        if ALIGNED:
            pool_off = tl.max_contiguous(tl.multiple_of(pool_off, 4), BLOCK)
            record_off = tl.max_contiguous(tl.multiple_of(record_off, 4), BLOCK)
        if EXPORT:
            words = tl.load(base_ptr + pool_off, mask=mask, other=0)
            tl.store(records_ptr + record_off, words, mask=mask)
        else:
            words = tl.load(records_ptr + record_off, mask=mask, other=0)
            tl.store(base_ptr + pool_off, words, mask=mask)
        if CHECKSUM:
            unsigned = words.to(tl.int64) & 0xFFFFFFFF
            acc += unsigned * (2 * (first + lane) + 1)  # masked lanes hold 0 and add nothing
    if CHECKSUM:
        tl.store(partials_ptr + j * num_buffers + b, tl.sum(acc, axis=0))


def _block_and_warps(max_chunk_words: int) -> tuple[int, int]:
    block = min(MAX_BLOCK, max(16, triton.next_power_of_2(max_chunk_words)))
    # About 32 words per thread at the largest block, never fewer than one warp.
    return block, max(1, min(8, block // 1024))


class TritonBackend:
    """The Triton kernel above; tables (deltas, chunk sizes) are built once per layout and kept on its device."""

    name = "triton"

    def _tables(self, layout: KVPoolLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        def build() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
            ptrs = [t.data_ptr() for t in layout.buffers]
            deltas = [(p - ptrs[0]) // WORD_BYTES for p in ptrs]
            chunk_words = [c // WORD_BYTES for c in layout.chunk_bytes]
            offset_words = [o // WORD_BYTES for o in layout.chunk_offsets]
            aligned = all(p % 16 == 0 for p in ptrs) and all(c % 4 == 0 for c in chunk_words + offset_words)
            aligned = aligned and (layout.page_bytes // WORD_BYTES) % 4 == 0
            dev = layout.device
            as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
            return as_tensor(deltas), as_tensor(chunk_words), as_tensor(offset_words), aligned

        return layout.cached("triton", build)

    def _launch(
        self, layout: KVPoolLayout, pages: torch.Tensor, records: torch.Tensor, sums: torch.Tensor | None, export: bool
    ) -> None:
        deltas, chunk_words, offset_words, aligned = self._tables(layout)
        num_pages, num_buffers = pages.numel(), len(layout.buffers)
        aligned = aligned and records.data_ptr() % 16 == 0
        partials = (
            torch.empty((num_pages, num_buffers), dtype=torch.int64, device=layout.device)
            if sums is not None
            else deltas  # never written: a placeholder pointer
        )
        block, warps = _block_and_warps(max(layout.chunk_bytes) // WORD_BYTES)
        _move_chunks[(num_pages, num_buffers)](
            layout.buffers[0].view(-1).view(torch.int32),
            deltas,
            chunk_words,
            offset_words,
            pages,
            records.view(torch.int32),
            partials,
            layout.page_bytes // WORD_BYTES,
            num_buffers,
            EXPORT=export,
            CHECKSUM=sums is not None,
            ALIGNED=aligned,
            BLOCK=block,
            num_warps=warps,
        )
        if sums is not None:
            torch.sum(partials, dim=1, out=sums)

    def gather(self, layout: KVPoolLayout, pages: torch.Tensor, out: torch.Tensor, sums: torch.Tensor | None) -> None:
        self._launch(layout, pages, out, sums, export=True)

    def scatter(self, layout: KVPoolLayout, data: torch.Tensor, pages: torch.Tensor, sums: torch.Tensor | None) -> None:
        self._launch(layout, pages, data, sums, export=False)
