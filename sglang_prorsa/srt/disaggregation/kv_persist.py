"""Persist one request's KV to the KV store in blocks, and load a prefix of it back.

A block holds ``block_tokens`` consecutive tokens (a whole number of pool pages) as the export kernel's page-first
records; its key is the hash chain over the token prefix up to the block's end plus the model and KV-layout identity
(``kv_store.block_keys``), so a resumed request finds its blocks by tokens alone and another model's blocks can never
match. The last block may be partial.

With tensor parallelism each rank holds its shard of the KV heads and persists it under its own keys (the layout plus
its rank, ``keys_for``); the rank that loads recomputes its keys from the tokens, so a resume loads rank ``r``'s
shard into rank ``r`` and only between instances of the same parallel layout (``layout_of``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from sglang_prorsa.srt.common.paths import cache_root
from sglang_prorsa.srt.disaggregation.kv_store import FileKVStore, KVStore, block_keys, layout_id, rank_layout

# A block aims at a few MiB: per-entry costs (a file, a store round trip) dominate small blocks (measured: the file
# store writes 64-256 KiB blocks at ~0.2 GB/s and 1-8 MiB blocks at 0.5-1 GB/s), while one block is also the unit
# that must be read in full to resume from its middle.
TARGET_BLOCK_BYTES = 2 << 20
MIN_BLOCK_TOKENS, MAX_BLOCK_TOKENS = 16, 1024


def default_file_store() -> str:
    """The file KV store's root when ``--prorsa-kv-store-path`` is not given: ``kv-store`` in the cache root."""
    return str(cache_root() / "kv-store")


def open_store(kind: str, **kwargs: Any) -> KVStore:
    """``open_store("file", root=..., capacity_bytes=...)`` or ``open_store("mooncake", master_address=..., ...)``."""
    if kind == "file":
        return FileKVStore(**kwargs)
    if kind == "mooncake":
        # Imported here: only a Mooncake deployment needs the mooncake package loaded.
        from sglang_prorsa.srt.disaggregation.kv_store_mooncake import MooncakeKVStore

        return MooncakeKVStore.from_kwargs(**kwargs)
    raise ValueError(f"unknown KV store kind {kind!r}: want 'file' or 'mooncake'")


@dataclass(frozen=True)
class KVStoreConfig:
    """Where persisted KV blocks live; built once from ``ProrsaConfig`` and handed to the scheduler process."""

    kind: str = "file"  # file | mooncake
    path: str = ""  # file store root ("" = default_file_store())
    mooncake_master: str = ""  # HOST:PORT
    local_hostname: str = "127.0.0.1"  # the address this instance's Mooncake client advertises (its advertise host)
    capacity_bytes: int = 8 << 30
    block_tokens: int = 0  # 0: about TARGET_BLOCK_BYTES worth

    def open(self) -> KVStore:
        if self.kind == "file":
            return open_store("file", root=self.path or default_file_store(), capacity_bytes=self.capacity_bytes)
        if self.kind == "mooncake":
            if not self.mooncake_master:
                raise ValueError("the mooncake KV store needs a master address (--prorsa-mooncake-master)")
            return open_store("mooncake", master_address=self.mooncake_master, local_hostname=self.local_hostname)
        raise ValueError(f"KV store kind {self.kind!r}: expected 'file' or 'mooncake'")


def block_tokens_for(page_size: int, bytes_per_token: int, configured: int = 0) -> int:
    """Tokens per store block: ``configured`` if set, else about TARGET_BLOCK_BYTES worth (a power of two within
    [16, 1024]); always a whole number of pages."""
    want = configured
    if not want:
        want = MIN_BLOCK_TOKENS
        while want < MAX_BLOCK_TOKENS and (want * 2) * bytes_per_token <= TARGET_BLOCK_BYTES:
            want *= 2
    return max(page_size, (want // page_size) * page_size)


def layout_of(scheduler: Any, codec: Any, tp_size: int = 1) -> str:
    """The instance's parallel KV layout: model, dtype, layers, the heads one rank holds, head size, kind, page size
    and tensor-parallel size. Blocks written under another layout never match, and a resume between two instances
    whose layouts differ is refused (their ranks' shards have other shapes or another byte order)."""
    lay = codec.layout
    first = lay.buffers[0]
    kind = str(getattr(lay.kind, "value", lay.kind))
    per_layer = 2 if kind == "mha" else 1  # MHA: a K and a V buffer per layer; MLA: one latent buffer
    model = str(scheduler.server_args.model_path)
    return layout_id(model=model, dtype=str(first.dtype), layers=len(lay.buffers) // per_layer,
                     kv_heads=int(first.shape[1]), head_dim=int(first.shape[-1]), kind=kind,
                     page_size=int(lay.page_size), tp_size=tp_size)


def keys_for(tokens: Sequence[int], block_tokens: int, layout: str, tp_rank: int = 0) -> list[str]:
    """The store keys of one tensor-parallel rank's blocks of ``tokens`` (``kv_store.rank_layout``)."""
    return block_keys(tokens, block_tokens, rank_layout(layout, tp_rank))


def persist_request_kv(codec: Any, store: KVStore, tokens: Sequence[int], slots: torch.Tensor,
                       layout: str, block_tokens: int = 0, tp_rank: int = 0) -> tuple[list[str], int, int]:
    """Export the KV of ``tokens`` (held in pool ``slots``) and put it into ``store`` block by block, under the keys
    of ``tp_rank`` (this process's shard of the heads).

    One export-kernel launch for the whole request; blocks are then views into that buffer.
    Returns (keys, block_tokens, bytes written).
    """
    page = codec.layout.page_size
    bt = block_tokens_for(page, codec.page_bytes // page, block_tokens)
    n = len(tokens)
    if n % page:
        # Only whole pages can be exported; the partial tail page is recomputed on resume.
        n -= n % page
    pages = codec.pages_of_slots(slots[:n], page)
    exported = codec.export_pages(pages)
    records = exported.records().cpu()
    keys = keys_for(list(tokens[:n]), bt, layout, tp_rank)
    per_block = bt // page
    # Rows of one contiguous buffer: each block is a zero-copy view the store writes straight from.
    flat = records.numpy()
    items = [(key, memoryview(flat[i * per_block:(i + 1) * per_block])) for i, key in enumerate(keys)]
    store.put_many(items)
    return keys, bt, sum(v.nbytes for _, v in items)


@dataclass
class LoadedBlocks:
    """Blocks covering ``[start, end)``; ``tokens`` counts the leading tokens from ``start`` that are usable."""

    start: int
    block_tokens: int
    first_block: int
    blobs: list[bytes] = field(default_factory=list)
    tokens: int = 0
    missing_blocks: int = 0
    checksum_failures: int = 0

    def records_for(self, codec: Any, tokens: int, page: int) -> torch.Tensor:
        """The page records of tokens ``[start, start + tokens)`` as one uint8 tensor on the pool's device."""
        flat = torch.frombuffer(bytearray().join(self.blobs), dtype=torch.uint8)  # one copy, writable
        skip = (self.start - self.first_block * self.block_tokens) // page
        pb = codec.page_bytes
        out = flat[skip * pb:(skip + tokens // page) * pb]
        return out.to(codec.layout.buffers[0].device)


def load_blocks(store: KVStore, keys: Sequence[str], block_tokens: int, start: int, end: int) -> LoadedBlocks:
    """Fetch the blocks covering tokens ``[start, end)``; stop at the first missing or corrupted block (a prefix
    cache can only use a contiguous prefix)."""
    first = start // block_tokens
    last = min(len(keys), -(-end // block_tokens))
    before = store.stats().get("checksum_failures", 0)
    got = store.get_many(list(keys[first:last]))
    failures = store.stats().get("checksum_failures", 0) - before
    out = LoadedBlocks(start=start, block_tokens=block_tokens, first_block=first, checksum_failures=failures)
    out.missing_blocks = max(0, sum(b is None for b in got) - failures)
    covered = first * block_tokens
    for blob in got:
        if blob is None:
            break
        out.blobs.append(blob)
        covered = min(end, covered + block_tokens)
    out.tokens = max(0, covered - start)
    return out
