"""The KV store backed by the Mooncake Store (``mooncake.store.MooncakeDistributedStore``) over TCP on loopback.

Each stored value is our header (checksum, length, creation time) followed by the payload, so corruption and expiry
are detected on read exactly as in the file store.

What Mooncake itself provides, and what we add (observed with mooncake-transfer-engine-non-cuda 0.3.13.post1):

* Capacity: the pool is the sum of the segments the clients mount (``global_segment_size`` each). The master evicts a
  fraction (``--eviction_ratio``, 5 %) of objects once usage passes ``--eviction_high_watermark_ratio`` (90 %), in
  the background and only among objects whose lease has run out; a put that finds no space fails at once (-200)
  rather than waiting for that eviction. We add ``capacity_bytes``: an LRU bound over the entries this client knows
  (those it put or read), and on a failed put for lack of space we evict from that LRU until the put fits.
* Time-to-live: Mooncake has none for ordinary objects. Its *lease* (``--default_kv_lease_ttl``, 10 s) is the
  opposite: a minimum lifetime after each read during which the object can be neither evicted nor removed without
  ``force``. We add ``ttl_s`` from the creation time in our header (checked on every read, any client; ``contains``
  can only check it for entries this client has put or read, since reading the header means reading the value).
* Overwrites: ``put`` on an existing key keeps the old value and still returns 0, so we always ``upsert``.
* Staging: each value, and the sum of the values in one batch call, must fit in the client's ``local_buffer_size``
  (otherwise -600 / empty results); batches are split by bytes and by ``max_batch_entries`` (the transfer engine
  is known to fail batches of more than ~2048 entries on this machine).
* Segment ownership: values live in some client's mounted segment; when that client closes, its segment and the
  values in it go away. An instance that persists KV keeps its client open through the role switch.
* Network: the client advertises ``local_hostname`` (127.0.0.1), but in this build its P2P-handshake and TCP-transport
  listeners bind the wildcard address; no flag or environment variable we found narrows them.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, fields
from typing import Any, Sequence

from sglang_prorsa.policy.clock import Clock
from sglang_prorsa.srt.disaggregation.kv_store import (
    HEADER_SIZE,
    IndexedKVStore,
    KVStoreError,
    Payload,
)

logger = logging.getLogger(__name__)

# Mooncake error codes seen through the Python client.
ERR_NO_SPACE = -200  # no segment has room for the object
ERR_BUFFER = -600  # the value does not fit in the local staging buffer
ERR_NOT_FOUND = -704
ERR_HAS_LEASE = -706  # removal refused while a read lease is live (use force)

MiB = 1 << 20


@dataclass(frozen=True)
class MooncakeStoreConfig:
    """How to reach and size the Mooncake Store client (see the module docstring for what the numbers mean)."""

    master_address: str  # "127.0.0.1:PORT" of a mooncake_master
    local_hostname: str = "127.0.0.1"
    metadata_server: str = "P2PHANDSHAKE"  # no etcd or HTTP metadata server needed
    protocol: str = "tcp"
    device_name: str = ""
    global_segment_size: int = 256 * MiB  # memory this client contributes to the pool
    local_buffer_size: int = 64 * MiB  # staging buffer: bounds one value and one batch
    max_batch_entries: int = 512
    batch_buffer_fraction: float = 0.5  # share of the staging buffer one batch may use

    @property
    def max_batch_bytes(self) -> int:
        return int(self.local_buffer_size * self.batch_buffer_fraction)


class MooncakeKVStore(IndexedKVStore):
    """The Mooncake Store as a :class:`KVStore`; one client (and its segment) per instance."""

    def __init__(self, config: MooncakeStoreConfig, *, capacity_bytes: int | None = None, ttl_s: float | None = None,
                 clock: Clock | None = None, checksum: str = "xxh3") -> None:
        super().__init__(capacity_bytes, ttl_s, clock, checksum)
        self.config = config
        if config.local_hostname == "127.0.0.1":
            # Keeps the transfer engine from choosing a non-loopback address for anything it advertises.
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        from mooncake.store import MooncakeDistributedStore  # imported here: mooncake is optional for the package

        self._client = MooncakeDistributedStore()
        rc = self._client.setup(config.local_hostname, config.metadata_server, config.global_segment_size,
                                config.local_buffer_size, config.protocol, config.device_name, config.master_address)
        if rc != 0:
            raise KVStoreError(f"Mooncake store setup against {config.master_address} failed with {rc}")
        self._largest = 0  # the largest value seen: sizes batches of reads whose sizes we do not know

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "MooncakeKVStore":
        """Split keyword arguments between :class:`MooncakeStoreConfig` and the store (used by ``open_store``)."""
        names = {f.name for f in fields(MooncakeStoreConfig)}
        config = MooncakeStoreConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})
        return cls(config, **kwargs)

    @property
    def raw_client(self) -> Any:
        """The underlying ``MooncakeDistributedStore`` (tests use it to plant corrupt values)."""
        return self._client

    # ---- batching --------------------------------------------------------------------------------------------------

    def _chunks(self, sizes: Sequence[int]) -> list[range]:
        """Consecutive index ranges whose sizes fit one batch (by entries and by staging-buffer bytes)."""
        out: list[range] = []
        start, total = 0, 0
        cap_bytes, cap_n = self.config.max_batch_bytes, self.config.max_batch_entries
        for i, size in enumerate(sizes):
            if i > start and (i - start >= cap_n or total + size > cap_bytes):
                out.append(range(start, i))
                start, total = i, 0
            total += size
        if start < len(sizes):
            out.append(range(start, len(sizes)))
        return out

    def _check_fits(self, key: str, size: int) -> None:
        if size > self.config.local_buffer_size:
            raise KVStoreError(f"value for {key} ({size} bytes) exceeds the Mooncake local buffer "
                               f"({self.config.local_buffer_size} bytes); raise local_buffer_size")

    # ---- backend primitives ----------------------------------------------------------------------------------------

    def _write(self, key: str, header: bytes, payload: Payload) -> None:
        size = HEADER_SIZE + memoryview(payload).nbytes
        self._check_fits(key, size)
        rc = self._client.upsert_parts(key, header, payload)
        while rc == ERR_NO_SPACE and self._evict_for_retry(size):
            rc = self._client.upsert_parts(key, header, payload)
        if rc != 0:
            raise KVStoreError(f"Mooncake upsert of {key} ({size} bytes) failed with {rc}")
        self._largest = max(self._largest, size)

    def _write_many(self, items: Sequence[tuple[str, bytes, Payload]]) -> None:
        sizes = [HEADER_SIZE + memoryview(p).nbytes for _, _, p in items]
        for (key, _, _), size in zip(items, sizes):
            self._check_fits(key, size)
        for chunk in self._chunks(sizes):
            if len(chunk) == 1:
                key, header, payload = items[chunk[0]]
                self._write(key, header, payload)
                continue
            keys = [items[i][0] for i in chunk]
            # The batch call takes whole values, so header and payload are joined here (one copy per value).
            values = [b"".join((items[i][1], items[i][2])) for i in chunk]
            rc = self._client.upsert_batch(keys, values)
            while rc == ERR_NO_SPACE and self._evict_for_retry(sum(sizes[i] for i in chunk)):
                rc = self._client.upsert_batch(keys, values)
            if rc != 0:
                raise KVStoreError(f"Mooncake upsert_batch of {len(keys)} values failed with {rc}")
        self._largest = max([self._largest, *sizes])

    def _evict_for_retry(self, need: int) -> bool:
        """The pool is full: drop our least recently used entries worth ``need`` bytes; False if we hold none.

        Called in a loop until the write fits: our index can name entries the master has already evicted on its own
        (its watermark eviction runs in the background), and removing those frees nothing.
        """
        victims: list[str] = []
        freed = 0
        with self._lock:
            while freed < need and self._index:
                key = next(iter(self._index))
                freed += self._index_drop(key).size
                victims.append(key)
            self._counts["evictions"] += len(victims)
        if victims:
            logger.info("Mooncake pool full: evicting %d of our entries (%d bytes) and retrying", len(victims), freed)
            self._client.batch_remove(victims, True)
        return bool(victims)

    def _read(self, key: str) -> tuple[bytes, bytes] | None:
        return self._read_many([key])[0]

    def _read_many(self, keys: Sequence[str]) -> list[tuple[bytes, bytes] | None]:
        guess = max(self._largest, 1)
        with self._lock:
            sizes = [self._index[k].size if k in self._index else guess for k in keys]
        out: list[tuple[bytes, bytes] | None] = [None] * len(keys)
        for chunk in self._chunks(sizes):
            handles = self._client.batch_get_buffer([keys[i] for i in chunk])
            retry: list[int] = []
            for i, handle in zip(chunk, handles):
                if handle is None:
                    retry.append(i)  # a miss, or no room in the staging buffer: tell them apart one by one
                    continue
                out[i] = _split(handle)
                del handle  # returns the staging space at once
            del handles
            for i in retry:
                handle = self._client.get_buffer(keys[i])
                if handle is not None:
                    out[i] = _split(handle)
                    del handle
        return out

    def _remove(self, key: str) -> None:
        # force: a value read within the lease period (10 s) cannot be removed otherwise, and a corrupt or expired
        # value must go now.
        rc = self._client.remove(key, True)
        if rc not in (0, ERR_NOT_FOUND):
            logger.warning("Mooncake remove of %s failed with %s", key, rc)

    def _exists(self, key: str) -> bool:
        return self._client.is_exist(key) == 1

    def close(self) -> None:
        if not self._closed:
            self._client.close()
        super().close()


def _split(handle: Any) -> tuple[bytes, bytes]:
    """(header, payload) copied out of a staging buffer handle: one copy of the payload, not two."""
    ptr, size = handle.ptr(), handle.size()
    if size < HEADER_SIZE:
        return ctypes.string_at(ptr, size), b""  # verify() rejects it
    return ctypes.string_at(ptr, HEADER_SIZE), ctypes.string_at(ptr + HEADER_SIZE, size - HEADER_SIZE)
