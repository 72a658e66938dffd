"""FileKVStore and the key/value format: round trips, hash-chain keys, LRU capacity, TTL, corruption, atomic writes."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.srt.disaggregation.kv_persist import open_store
from sglang_prorsa.srt.disaggregation.kv_store import (
    HEADER_SIZE,
    FileKVStore,
    KVStoreError,
    block_keys,
    decode_header,
    encode_header,
    layout_id,
    verify,
)

LAYOUT = layout_id("tiny-llama", "torch.bfloat16", layers=2, kv_heads=4, head_dim=64)
MB = 1 << 20


def payload(i: int, n: int = 1000) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(n))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def store(tmp_path, clock) -> FileKVStore:
    s = FileKVStore(tmp_path / "kv", capacity_bytes=64 * MB, clock=clock)
    yield s
    s.close()


# ---- keys ------------------------------------------------------------------------------------------------------------


def test_layout_id_is_stable_and_normalises_dtype():
    a = layout_id("m", "torch.bfloat16", 2, 4, 64)
    assert a == layout_id("m", "bfloat16", 2, 4, 64)
    assert a != layout_id("m", "float16", 2, 4, 64)
    assert a != layout_id("m", "bfloat16", 2, 4, 64, kind="mla")
    with pytest.raises(ValueError):
        layout_id("m", "bfloat16", 0, 4, 64)


def test_block_keys_shared_prefix_shares_leading_keys():
    tokens = list(range(100))
    a = block_keys(tokens, 16, LAYOUT)
    b = block_keys(tokens[:64] + [999] * 36, 16, LAYOUT)
    assert len(a) == 7 and len(set(a)) == 7  # 6 full blocks + a partial one
    assert a[:4] == b[:4]
    assert all(x != y for x, y in zip(a[4:], b[4:]))
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in a)  # hex


def test_block_keys_changed_token_changes_that_block_and_all_later():
    tokens = list(range(80))
    a = block_keys(tokens, 16, LAYOUT)
    changed = list(tokens)
    changed[37] = 12345  # block 2
    b = block_keys(changed, 16, LAYOUT)
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:]))


def test_block_keys_layout_changes_every_key():
    tokens = list(range(48))
    other = layout_id("tiny-llama", "float32", 2, 4, 64)
    assert not set(block_keys(tokens, 16, LAYOUT)) & set(block_keys(tokens, 16, other))


def test_block_keys_partial_last_block():
    tokens = list(range(40))
    keys = block_keys(tokens, 16, LAYOUT)
    assert len(keys) == 3
    # The partial block's key is the chain over its prefix; extending it to a full block changes only the last key.
    longer = block_keys(list(range(48)), 16, LAYOUT)
    assert keys[:2] == longer[:2] and keys[2] != longer[2]
    # A prefix that ends exactly where a partial block ended gives the same keys (resume after the same tokens).
    assert block_keys(tokens, 16, LAYOUT) == keys
    assert block_keys([], 16, LAYOUT) == []


def test_block_keys_container_independent():
    tokens = list(range(50))
    expected = block_keys(tokens, 16, LAYOUT)
    assert block_keys(np.array(tokens, dtype=np.int32), 16, LAYOUT) == expected
    assert block_keys(tuple(tokens), 16, LAYOUT) == expected


# ---- value format ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["xxh3", "crc32", "none"])
def test_header_round_trip_and_verify(algo):
    data = payload(1, 5000)
    header = encode_header(data, 12.5, algo)
    assert len(header) == HEADER_SIZE
    parsed = verify(header, data)
    assert parsed is not None and parsed.length == 5000 and parsed.created_at == 12.5
    assert verify(header, data[:-1]) is None  # length mismatch is caught even without a checksum
    flipped = bytearray(data)
    flipped[100] ^= 0x01
    assert (verify(header, bytes(flipped)) is None) == (algo != "none")
    assert decode_header(b"garbage" * 10) is None


def test_checksum_covers_the_header_fields():
    data = payload(2)
    header = bytearray(encode_header(data, 5.0))
    header[16] ^= 0x40  # inside created_at
    assert verify(bytes(header), data) is None


# ---- store -----------------------------------------------------------------------------------------------------------


def test_round_trip(store):
    assert store.get("a") is None
    store.put("a", payload(1))
    store.put("b", bytearray(payload(2)))
    store.put("c", memoryview(np.arange(1000, dtype=np.float32)))  # a non-byte memoryview is taken as its bytes
    assert store.get("a") == payload(1)
    assert store.get("b") == payload(2)
    assert np.array_equal(np.frombuffer(store.get("c"), dtype=np.float32), np.arange(1000, dtype=np.float32))
    assert store.contains("a") and not store.contains("zzz")
    store.put("a", payload(9))  # overwrite
    assert store.get("a") == payload(9)
    store.delete("a")
    store.delete("a")  # deleting an absent key is fine
    assert store.get("a") is None and not store.contains("a")
    s = store.stats()
    assert s["puts"] == 4 and s["hits"] == 4 and s["misses"] == 2
    assert s["entries"] == 2 and s["bytes_stored"] == 2 * HEADER_SIZE + 1000 + 4000
    assert s["put_bytes"] == 1000 * 3 + 4000 and s["get_bytes"] == 1000 * 3 + 4000
    assert s["checksum_failures"] == 0 and s["evictions"] == 0


def test_empty_payload_and_bad_keys(store):
    store.put("empty", b"")
    assert store.get("empty") == b""
    for bad in ["", "../x", ".hidden", "a/b", "x" * 201]:
        with pytest.raises(ValueError):
            store.put(bad, b"1")


def test_lru_eviction_under_capacity(tmp_path, clock):
    entry = HEADER_SIZE + 1000
    s = FileKVStore(tmp_path, capacity_bytes=3 * entry, clock=clock)
    for k in "abc":
        s.put(k, payload(ord(k)))
    assert s.get("a") == payload(ord("a"))  # a is now the most recently used; b the least
    s.put("d", payload(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kv", "c.kv", "d.kv"]
    assert s.get("b") is None and s.lru_keys() == ["c", "a", "d"]
    s.put("e", payload(5, 2000))  # needs two slots: c and a go
    assert s.lru_keys() == ["d", "e"]
    assert {k: s.get(k) is not None for k in "abcde"} == dict(a=False, b=False, c=False, d=True, e=True)
    st = s.stats()
    assert st["evictions"] == 3 and st["bytes_stored"] == 2 * HEADER_SIZE + 3000 <= 3 * entry
    with pytest.raises(KVStoreError):
        s.put("huge", payload(6, 3 * entry))


def test_overwrite_does_not_evict(tmp_path, clock):
    entry = HEADER_SIZE + 1000
    s = FileKVStore(tmp_path, capacity_bytes=2 * entry, clock=clock)
    s.put("a", payload(1))
    s.put("b", payload(2))
    s.put("a", payload(3))
    assert s.get("b") == payload(2) and s.get("a") == payload(3) and s.stats()["evictions"] == 0


def test_ttl_with_manual_clock(tmp_path, clock):
    s = FileKVStore(tmp_path, capacity_bytes=MB, ttl_s=10.0, clock=clock)
    s.put("a", payload(1))
    clock.advance(5)
    s.put("b", payload(2))
    clock.advance(4.9)
    assert s.get("a") == payload(1) and s.contains("a")  # reads do not extend the TTL
    clock.advance(0.1)  # a is 10 s old
    assert s.get("a") is None and not (tmp_path / "a.kv").exists()
    assert s.contains("b")
    clock.advance(5)
    assert not s.contains("b") and not (tmp_path / "b.kv").exists()
    st = s.stats()
    assert st["expired"] == 2 and st["entries"] == 0 and st["misses"] == 1


def test_ttl_applies_to_entries_written_by_another_process_view(tmp_path, clock):
    writer = FileKVStore(tmp_path, capacity_bytes=MB, clock=clock)
    reader = FileKVStore(tmp_path, capacity_bytes=MB, ttl_s=10.0, clock=clock)  # opened before the write
    writer.put("x", payload(1))
    assert reader.get("x") == payload(1)  # not in reader's index at first: read from disk and adopted
    clock.advance(11)
    writer.put("y", payload(2))
    clock.advance(1)
    assert reader.purge_expired() == 1 and not (tmp_path / "x.kv").exists()
    assert reader.contains("y")


def test_purge_expired(tmp_path, clock):
    s = FileKVStore(tmp_path, capacity_bytes=MB, ttl_s=1.0, clock=clock)
    s.put_many([(f"k{i}", payload(i, 10)) for i in range(5)])
    clock.advance(2)
    assert s.purge_expired() == 5 and list(tmp_path.glob("*.kv")) == []


def test_corrupted_file_is_detected_counted_and_removed(store, tmp_path):
    store.put("good", payload(1))
    store.put("bad", payload(2))
    path = tmp_path / "kv" / "bad.kv"
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 500] ^= 0xFF
    path.write_bytes(raw)
    assert store.get("bad") is None
    assert not path.exists() and not store.contains("bad")
    assert store.get("good") == payload(1)
    st = store.stats()
    assert st["checksum_failures"] == 1 and st["entries"] == 1 and st["misses"] == 1


@pytest.mark.parametrize("damage", ["truncate", "extend", "header"])
def test_other_damage_is_a_checksum_failure(store, tmp_path, damage):
    store.put("k", payload(3))
    path = tmp_path / "kv" / "k.kv"
    raw = path.read_bytes()
    raw = {"truncate": raw[:-10], "extend": raw + b"x", "header": b"XXXX" + raw[4:]}[damage]
    path.write_bytes(raw)
    assert store.get("k") is None and store.stats()["checksum_failures"] == 1 and not path.exists()


def test_unchecksummed_store_still_detects_truncation(tmp_path):
    s = FileKVStore(tmp_path, capacity_bytes=MB, checksum="none")
    s.put("k", payload(1))
    path = tmp_path / "k.kv"
    path.write_bytes(path.read_bytes()[:-1])
    assert s.get("k") is None and s.stats()["checksum_failures"] == 1


def test_concurrent_writers_never_expose_a_torn_value(tmp_path):
    s = FileKVStore(tmp_path, capacity_bytes=256 * MB)
    values = [bytes([i]) * (2 * MB) for i in range(4)]
    errors: list[str] = []
    stop = threading.Event()

    def writer(i: int) -> None:
        for _ in range(15):
            s.put("shared", values[i])

    def reader() -> None:
        while not stop.is_set():
            got = s.get("shared")
            if got is not None and got not in values:
                errors.append("torn read")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert not errors and s.get("shared") in values
    assert s.stats()["checksum_failures"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.kv"]  # no temp files left behind
    assert s.stats()["entries"] == 1


def test_put_many_get_many(store):
    items = [(f"k{i}", payload(i, 100 + i)) for i in range(50)]
    store.put_many(items)
    got = store.get_many([k for k, _ in items] + ["missing"])
    assert got[:-1] == [v for _, v in items] and got[-1] is None
    st = store.stats()
    assert st["puts"] == 50 and st["hits"] == 50 and st["misses"] == 1 and st["entries"] == 50


def test_reopen_recovers_index_in_age_order(tmp_path, clock):
    entry = HEADER_SIZE + 1000
    s = FileKVStore(tmp_path, capacity_bytes=10 * entry, clock=clock)
    for k in "abc":
        s.put(k, payload(ord(k)))
        clock.advance(1)
    (tmp_path / ".tmp-stale").write_bytes(b"x")
    os.utime(tmp_path / ".tmp-stale", (0, 0))
    s.close()
    again = FileKVStore(tmp_path, capacity_bytes=2 * entry, clock=clock)  # smaller: the oldest goes at open
    assert again.lru_keys() == ["b", "c"] and not (tmp_path / "a.kv").exists()
    assert not (tmp_path / ".tmp-stale").exists()
    assert again.get("c") == payload(ord("c"))


def test_open_store_factory(tmp_path):
    s = open_store("file", root=tmp_path, capacity_bytes=MB, ttl_s=5.0)
    assert isinstance(s, FileKVStore) and s.ttl_s == 5.0
    with pytest.raises(ValueError):
        open_store("redis")
