"""The KV store for pages persisted when a busy instance is switched (issue 6, item 1).

A switched instance exports each running request's KV pages and puts them here, one value per block of
``block_tokens`` tokens; the instance that resumes the request gets them back instead of recomputing the prefix.

Keys are a hash chain over the token prefix, block by block, like a path in SGLang's radix tree: block ``i``'s key
depends on every token up to and including block ``i`` and on the KV layout (model, dtype, shape, tensor-parallel size
and the rank holding the shard: ``rank_layout``), so a key names exactly one KV content and two requests sharing a
prefix share the leading keys.

Every value carries a fixed header (magic, checksum algorithm, payload length, creation time, checksum). A value whose
header or checksum does not verify is counted (``stats()["checksum_failures"]``), deleted and reported as a miss, so
the resume path falls back to recomputation and can count it.

Two backends share the semantics implemented by :class:`IndexedKVStore` (capacity bound with LRU eviction,
time-to-live, statistics): :class:`FileKVStore` (a directory on one machine) and ``MooncakeKVStore``
(the Mooncake Store, in ``kv_store_mooncake``, which imports this module; ``kv_persist.open_store`` picks one).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import threading
import time
import uuid
import zlib
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import xxhash

from sglang_prorsa.policy.clock import Clock, WallClock

logger = logging.getLogger(__name__)

Payload = bytes | bytearray | memoryview

# --------------------------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------------------------

_KEY_DIGEST_BYTES = 16  # 128-bit blake2b: collisions are negligible for any realistic number of blocks
_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")  # safe as a file name and as a Mooncake key


def layout_id(model: str, dtype: str, layers: int, kv_heads: int, head_dim: int, kind: str = "mha", *,
              page_size: int = 1, tp_size: int = 1) -> str:
    """A stable, human-readable identity of an instance's *parallel* KV layout; KV bytes are only reusable under an
    identical one. ``kv_heads`` are the heads one tensor-parallel rank holds, and ``tp_size`` says how many ranks
    share the heads: two instances with equal layouts split the heads the same way, so rank ``r`` of one holds
    exactly the bytes rank ``r`` of the other needs (the source and destination of a resume must agree on this).
    ``page_size`` is in it because a stored record holds a whole page, buffer after buffer: the page size decides
    the byte order within a block.

    ``dtype`` may be given as ``torch.bfloat16`` or ``bfloat16``; both give the same identity.
    """
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("page_size", page_size),
                        ("tp_size", tp_size)):
        if int(value) <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    dtype = str(dtype).removeprefix("torch.")
    return f"{model}|{dtype}|L{int(layers)}|H{int(kv_heads)}|D{int(head_dim)}|{kind}|P{int(page_size)}|TP{int(tp_size)}"


def rank_layout(layout: str, tp_rank: int) -> str:
    """The key layout of one tensor-parallel rank: the parallel layout plus the rank. Each rank holds its own shard
    of the heads, so each derives its own block keys from this and never writes (or reads) another rank's bytes."""
    if int(tp_rank) < 0:
        raise ValueError(f"tp_rank must be non-negative, got {tp_rank}")
    return f"{layout}|R{int(tp_rank)}"


def block_keys(token_ids: Sequence[int], block_tokens: int, layout: str) -> list[str]:
    """Keys of the blocks of ``token_ids``: ``key_i = H(key_{i-1}, tokens of block i, layout)``.

    The last block may be partial and still gets a key; its length is hashed too, so a partial block never shares a key
    with a full block that starts with the same tokens. Tokens are hashed as little-endian int64 so the keys do not
    depend on the caller's container (list, numpy array, torch tensor) or on the machine.
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    tokens = np.asarray(token_ids, dtype="<i8")
    if tokens.ndim != 1:
        raise ValueError(f"token_ids must be one-dimensional, got shape {tokens.shape}")
    layout_bytes = layout.encode()
    prev = b""
    keys: list[str] = []
    for start in range(0, len(tokens), block_tokens):
        block = tokens[start:start + block_tokens]
        h = hashlib.blake2b(digest_size=_KEY_DIGEST_BYTES)
        h.update(prev)
        h.update(struct.pack("<II", len(layout_bytes), len(block)))  # lengths make the encoding unambiguous
        h.update(layout_bytes)
        h.update(block.tobytes())
        prev = h.digest()
        keys.append(prev.hex())
    return keys


def check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"invalid KV store key {key!r}: want 1-200 chars of [A-Za-z0-9._:-], not starting with a dot")
    return key


# --------------------------------------------------------------------------------------------------------------------
# Value format: header + payload
# --------------------------------------------------------------------------------------------------------------------

MAGIC = b"PKV1"
# magic, checksum algorithm, 3 pad bytes, payload length, created_at (store clock seconds), checksum
_HEADER = struct.Struct("<4sB3xQdQ")
HEADER_SIZE = _HEADER.size  # 32
_CHECKSUMMED_PREFIX = HEADER_SIZE - 8  # the checksum covers the header fields too, not only the payload

CHECKSUM_ALGOS = {"none": 0, "xxh3": 1, "crc32": 2}
_ALGO_NAMES = {v: k for k, v in CHECKSUM_ALGOS.items()}


class KVStoreError(RuntimeError):
    """A backend refused or failed an operation (for example, no space left after eviction)."""


@dataclass(frozen=True)
class Header:
    algo: int
    length: int
    created_at: float
    checksum: int


def _checksum(algo: int, prefix: bytes, payload: Payload) -> int:
    if algo == 1:
        h = xxhash.xxh3_64(prefix)
        h.update(payload)
        return h.intdigest()
    if algo == 2:
        return zlib.crc32(payload, zlib.crc32(prefix))
    return 0


def encode_header(payload: Payload, created_at: float, checksum: str = "xxh3") -> bytes:
    """The header to store in front of ``payload``."""
    algo = CHECKSUM_ALGOS[checksum]
    n = memoryview(payload).nbytes
    prefix = _HEADER.pack(MAGIC, algo, n, created_at, 0)[:_CHECKSUMMED_PREFIX]
    return _HEADER.pack(MAGIC, algo, n, created_at, _checksum(algo, prefix, payload))


def decode_header(raw: Payload) -> Header | None:
    """The parsed header, or None when it is not one of ours (wrong size, magic or algorithm)."""
    if memoryview(raw).nbytes < HEADER_SIZE:
        return None
    magic, algo, length, created_at, checksum = _HEADER.unpack_from(raw, 0)
    if magic != MAGIC or algo not in _ALGO_NAMES:
        return None
    return Header(algo, length, created_at, checksum)


def verify(header_bytes: Payload, payload: Payload) -> Header | None:
    """The header when ``payload`` matches it (length and checksum), else None."""
    header = decode_header(header_bytes)
    if header is None or memoryview(payload).nbytes != header.length:
        return None
    prefix = bytes(memoryview(header_bytes)[:_CHECKSUMMED_PREFIX])
    if header.algo and _checksum(header.algo, prefix, payload) != header.checksum:
        return None
    return header


# --------------------------------------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------------------------------------


class KVStore(ABC):
    """Persisted KV blocks by key. ``get`` returns None on a miss, an expired entry or a failed checksum."""

    @abstractmethod
    def put(self, key: str, payload: Payload) -> None:
        """Store ``payload`` (replacing any value under ``key``); raises :class:`KVStoreError` when it cannot."""

    @abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abstractmethod
    def contains(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def put_many(self, items: Sequence[tuple[str, Payload]]) -> None: ...

    @abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Entry:
    size: int  # bytes as stored: header + payload
    created_at: float


_COUNTERS = ("puts", "hits", "misses", "checksum_failures", "evictions", "expired", "put_bytes", "get_bytes",
             "put_failures")


class IndexedKVStore(KVStore):
    """Capacity, LRU eviction, time-to-live and statistics over a backend's raw operations.

    The index is this process's view of the store: entries it put or read, plus whatever the backend reports at open.
    When several processes share one store each enforces the bound over its own view (documented per backend).

    Counting: ``misses`` includes expired entries and failed checksums (the caller got None); ``checksum_failures`` and
    ``expired`` count those causes separately. ``bytes_stored``/``entries`` are the index's (header bytes included).
    """

    def __init__(self, capacity_bytes: int | None, ttl_s: float | None, clock: Clock | None, checksum: str) -> None:
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        if checksum not in CHECKSUM_ALGOS:
            raise ValueError(f"checksum must be one of {sorted(CHECKSUM_ALGOS)}, got {checksum!r}")
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.clock: Clock = clock or WallClock()
        self.checksum = checksum
        self._index: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._lock = threading.RLock()
        self._closed = False

    # ---- backend primitives ----------------------------------------------------------------------------------------

    @abstractmethod
    def _write(self, key: str, header: bytes, payload: Payload) -> None:
        """Store header + payload atomically under key; raise KVStoreError on failure."""

    @abstractmethod
    def _read(self, key: str) -> tuple[bytes, bytes] | None:
        """(header bytes, payload bytes) as stored, or None when absent."""

    @abstractmethod
    def _remove(self, key: str) -> None:
        """Remove key; absent keys are not an error."""

    @abstractmethod
    def _exists(self, key: str) -> bool: ...

    def _write_many(self, items: Sequence[tuple[str, bytes, Payload]]) -> None:
        for key, header, payload in items:
            self._write(key, header, payload)

    def _read_many(self, keys: Sequence[str]) -> list[tuple[bytes, bytes] | None]:
        return [self._read(key) for key in keys]

    def _created_at(self, key: str) -> float | None:
        """Creation time of a stored entry this process has not indexed, where the backend can tell cheaply."""
        return None

    # ---- bookkeeping ---------------------------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _index_set(self, key: str, entry: _Entry) -> None:
        with self._lock:
            self._index_drop(key)
            self._index[key] = entry
            self._bytes += entry.size

    def _index_drop(self, key: str) -> _Entry | None:
        with self._lock:
            entry = self._index.pop(key, None)
            if entry is not None:
                self._bytes -= entry.size
            return entry

    def _expired(self, created_at: float) -> bool:
        return self.ttl_s is not None and self.clock.now() - created_at >= self.ttl_s

    def _make_room(self, incoming: dict[str, int]) -> None:
        """Evict least recently used entries until ``incoming`` (key -> stored size) fits under the capacity."""
        if self.capacity_bytes is None:
            return
        need = sum(incoming.values())
        if need > self.capacity_bytes:
            raise KVStoreError(f"{need} bytes cannot fit in a store of capacity {self.capacity_bytes}")
        victims: list[str] = []
        with self._lock:
            # Entries being replaced stop counting now; they are overwritten, not evicted.
            for key in incoming:
                self._index_drop(key)
            while self._bytes + need > self.capacity_bytes and self._index:
                key, _ = next(iter(self._index.items()))
                self._index_drop(key)
                victims.append(key)
            self._counts["evictions"] += len(victims)
        for key in victims:
            self._remove(key)

    def _encode(self, key: str, payload: Payload) -> tuple[bytes, memoryview]:
        check_key(key)
        view = memoryview(payload)
        if not view.contiguous:
            raise ValueError("payload must be a contiguous buffer")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        return encode_header(view, self.clock.now(), self.checksum), view

    def _accept(self, key: str, raw: tuple[bytes, bytes] | None) -> bytes | None:
        """Turn what the backend read into the caller's answer, counting and cleaning up on the way."""
        if raw is None:
            self._index_drop(key)  # gone behind our back (another process, or the backend's own eviction)
            self._count("misses")
            return None
        header_bytes, payload = raw
        header = verify(header_bytes, payload)
        if header is None:
            logger.warning("KV store: checksum failure for key %s; dropping the entry", key)
            self._index_drop(key)
            self._remove(key)
            with self._lock:
                self._counts["checksum_failures"] += 1
                self._counts["misses"] += 1
            return None
        if self._expired(header.created_at):
            self._index_drop(key)
            self._remove(key)
            with self._lock:
                self._counts["expired"] += 1
                self._counts["misses"] += 1
            return None
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
            else:
                self._index[key] = _Entry(HEADER_SIZE + header.length, header.created_at)
                self._bytes += HEADER_SIZE + header.length
            self._counts["hits"] += 1
            self._counts["get_bytes"] += header.length
        return payload

    # ---- the interface -------------------------------------------------------------------------------------------

    def put(self, key: str, payload: Payload) -> None:
        self.put_many([(key, payload)])

    def put_many(self, items: Sequence[tuple[str, Payload]]) -> None:
        encoded: dict[str, tuple[bytes, memoryview]] = {}
        for key, payload in items:
            encoded[key] = self._encode(key, payload)  # a key given twice: the last value wins, as with repeated puts
        sizes = {key: HEADER_SIZE + view.nbytes for key, (_, view) in encoded.items()}
        self._make_room(sizes)
        try:
            self._write_many([(key, header, view) for key, (header, view) in encoded.items()])
        except Exception:
            self._count("put_failures", len(encoded))
            for key in encoded:  # some may have been written; the index must not claim any of them
                self._index_drop(key)
            raise
        with self._lock:
            for key, (header, _view) in encoded.items():
                self._index_set(key, _Entry(sizes[key], _HEADER.unpack(header)[3]))
            self._counts["puts"] += len(encoded)
            self._counts["put_bytes"] += sum(view.nbytes for _, view in encoded.values())

    def get(self, key: str) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        keys = [check_key(k) for k in keys]
        out: list[bytes | None] = [None] * len(keys)
        to_read: list[int] = []
        for i, key in enumerate(keys):
            with self._lock:
                entry = self._index.get(key)
            if entry is not None and self._expired(entry.created_at):
                self._expire(key)  # known expired: no need to read it
                self._count("misses")
            else:
                to_read.append(i)
        raws = self._read_many([keys[i] for i in to_read]) if to_read else []
        for i, raw in zip(to_read, raws):
            out[i] = self._accept(keys[i], raw)
        return out

    def _expire(self, key: str) -> None:
        self._index_drop(key)
        self._remove(key)
        self._count("expired")

    def contains(self, key: str) -> bool:
        """Whether ``get`` would find the entry (not verifying its checksum, which would need reading it)."""
        check_key(key)
        with self._lock:
            entry = self._index.get(key)
        created = entry.created_at if entry is not None else self._created_at(key)
        if created is not None and self._expired(created):
            self._expire(key)
            return False
        if self._exists(key):
            return True
        self._index_drop(key)
        return False

    def delete(self, key: str) -> None:
        check_key(key)
        self._index_drop(key)
        self._remove(key)

    def purge_expired(self) -> int:
        """Remove every indexed entry past its time-to-live; returns how many. (``get`` also expires lazily.)"""
        if self.ttl_s is None:
            return 0
        with self._lock:
            stale = [k for k, e in self._index.items() if self._expired(e.created_at)]
        for key in stale:
            self._expire(key)
        return len(stale)

    def lru_keys(self) -> list[str]:
        """Indexed keys, least recently used first (the eviction order)."""
        with self._lock:
            return list(self._index)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            out["bytes_stored"] = self._bytes
            out["entries"] = len(self._index)
        out["capacity_bytes"] = self.capacity_bytes
        out["ttl_s"] = self.ttl_s
        out["checksum"] = self.checksum
        return out

    def close(self) -> None:
        self._closed = True


# --------------------------------------------------------------------------------------------------------------------
# One machine: a directory
# --------------------------------------------------------------------------------------------------------------------

_SUFFIX = ".kv"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0  # temp files this old are leftovers of a crashed writer, not a write in progress


class FileKVStore(IndexedKVStore):
    """A directory with one file per key, written to a temp file and ``os.replace``d into place (atomic: a reader sees
    the old value or the new one, never a torn one, even with concurrent writers to the same key).

    Several processes on one machine may share ``root``: a key written by one is readable by all. Each process bounds
    the bytes it knows about (what it wrote or read, plus what was there when it opened); ``rescan()`` refreshes that
    view from the directory. ``fsync=True`` makes puts durable across a machine crash (slower; KV is recomputable, so
    it is off by default).
    """

    def __init__(self, root: str | Path, capacity_bytes: int, ttl_s: float | None = None, clock: Clock | None = None,
                 *, checksum: str = "xxh3", fsync: bool = False) -> None:
        super().__init__(capacity_bytes, ttl_s, clock, checksum)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.rescan()

    def _path(self, key: str) -> Path:
        return self.root / (key + _SUFFIX)

    def rescan(self) -> None:
        """Rebuild the index from the directory, oldest entry first; remove stale temp files and expired entries."""
        found: list[tuple[float, str, int]] = []
        now = time.time()
        for path in self.root.iterdir():
            name = path.name
            if name.startswith(_TMP_PREFIX):
                try:
                    if now - path.stat().st_mtime > _STALE_TMP_S:
                        path.unlink(missing_ok=True)
                except OSError:
                    pass
                continue
            if not name.endswith(_SUFFIX):
                continue
            try:
                with open(path, "rb") as f:
                    header = decode_header(f.read(HEADER_SIZE))
                size = path.stat().st_size
            except OSError:
                continue
            # Unreadable headers are indexed at the front so they are evicted first; get() will count them.
            found.append((header.created_at if header else float("-inf"), name[: -len(_SUFFIX)], size))
        found.sort()
        with self._lock:
            self._index.clear()
            self._bytes = 0
            for created, key, size in found:
                self._index[key] = _Entry(size, created)
                self._bytes += size
        self.purge_expired()
        if self.capacity_bytes is not None and self._bytes > self.capacity_bytes:
            self._make_room({})

    def _write(self, key: str, header: bytes, payload: Payload) -> None:
        tmp = self.root / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, header)
                _write_all(fd, payload)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._path(key))
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise KVStoreError(f"cannot write {key}: {e}") from e

    def _read(self, key: str) -> tuple[bytes, bytes] | None:
        try:
            with open(self._path(key), "rb") as f:
                header_bytes = f.read(HEADER_SIZE)
                header = decode_header(header_bytes)
                if header is None:
                    return header_bytes, b""  # not ours or truncated: verify() rejects it
                payload = f.read(header.length)
                if f.read(1):  # trailing bytes: the file is not what was written
                    return header_bytes, b""
                return header_bytes, payload
        except FileNotFoundError:
            return None

    def _remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _created_at(self, key: str) -> float | None:
        try:
            with open(self._path(key), "rb") as f:
                header = decode_header(f.read(HEADER_SIZE))
        except OSError:
            return None
        return header.created_at if header else None


def _write_all(fd: int, data: Payload) -> None:
    view = memoryview(data)
    while view.nbytes:
        n = os.write(fd, view)
        view = view[n:]
