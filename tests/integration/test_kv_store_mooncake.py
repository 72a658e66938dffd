"""MooncakeKVStore against a real ``mooncake_master`` on 127.0.0.1 (no SGLang server needed).

The master is started once for the module on a free loopback port and ended by PID even when a test fails. Each
test opens its own small client (a 64 MiB segment), so a test that fills the pool does not disturb the others.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

pytest.importorskip("mooncake.store")

from sglang_prorsa.policy.clock import ManualClock  # noqa: E402
from sglang_prorsa.srt.disaggregation.kv_persist import open_store  # noqa: E402
from sglang_prorsa.srt.disaggregation.kv_store import HEADER_SIZE, encode_header  # noqa: E402
from sglang_prorsa.srt.disaggregation.kv_store_mooncake import MooncakeKVStore, MooncakeStoreConfig  # noqa: E402
from sglang_prorsa.srt.disaggregation.mooncake_master import MasterProcess, start_mooncake_master  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1 << 20


@pytest.fixture(scope="module")
def master(tmp_path_factory) -> MasterProcess:
    m = start_mooncake_master(log_dir=tmp_path_factory.mktemp("mooncake"))
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def store(master):
    s = MooncakeKVStore(MooncakeStoreConfig(master.address, global_segment_size=64 * MiB, local_buffer_size=32 * MiB))
    try:
        yield s
    finally:
        s.raw_client.remove_all(True)  # the pool is shared by the module's tests
        s.close()


def _listeners(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_master_binds_loopback_only(master):
    assert master.alive() and master.address.startswith("127.0.0.1:")
    with socket.create_connection(("127.0.0.1", master.port), timeout=2):
        pass
    listeners = _listeners(master.pid)
    assert listeners, "ss shows no listener for the master"
    assert all(addr.startswith("127.0.0.1:") for addr in listeners), listeners


def test_round_trip_of_several_megabytes(store):
    data = os.urandom(6 * MiB)
    store.put("big", data)
    store.put("small", b"hello")
    assert store.contains("big")
    assert store.get("big") == data
    assert store.get("small") == b"hello"
    store.put("small", b"again")  # Mooncake's plain put would keep the old value; ours replaces it
    assert store.get("small") == b"again"
    store.delete("small")  # just read, so under a Mooncake lease: removal must still work
    assert store.get("small") is None and not store.contains("small")
    s = store.stats()
    assert s["hits"] == 3 and s["misses"] == 1 and s["put_bytes"] == 6 * MiB + 10 and s["entries"] == 1


def test_miss_returns_none(store):
    assert store.get("never-written") is None
    assert store.get_many(["nope-1", "nope-2"]) == [None, None]
    assert not store.contains("never-written")
    assert store.stats()["misses"] == 3


def test_corrupted_value_is_detected_counted_and_removed(store):
    good = os.urandom(100_000)
    store.put("ok", good)
    # A value whose header promises different bytes, written straight through the raw client.
    header = encode_header(good, time.time())
    tampered = bytearray(good)
    tampered[12345] ^= 0x5A
    assert store.raw_client.upsert("bad", header + bytes(tampered)) == 0
    assert store.raw_client.upsert("junk", b"not a kv value at all") == 0
    assert store.get("bad") is None
    assert store.get_many(["junk", "ok"]) == [None, good]
    assert store.raw_client.is_exist("bad") == 0 and store.raw_client.is_exist("junk") == 0
    assert store.stats()["checksum_failures"] == 2


def test_batch_larger_than_the_caps_is_split(store):
    # 3000 entries (more than the transfer engine's ~2048) and more bytes than one staging buffer (32 MiB).
    items = [(f"blk-{i}", i.to_bytes(4, "little") * 16) for i in range(3000)]
    items += [(f"page-{i}", os.urandom(3 * MiB)) for i in range(12)]
    store.put_many(items)
    keys = [k for k, _ in items]
    got = store.get_many(keys)
    assert got == [v for _, v in items]
    # A reader that knows none of the sizes (a fresh client, as on the resuming instance) gets them all too.
    assert store.stats()["entries"] == len(items)


def test_other_client_reads_what_one_wrote(master, store):
    other = MooncakeKVStore(MooncakeStoreConfig(master.address, global_segment_size=0, local_buffer_size=32 * MiB))
    try:
        pages = [(f"p{i}", os.urandom(2 * MiB + i)) for i in range(10)]
        store.put_many(pages)
        assert other.get_many([k for k, _ in pages]) == [v for _, v in pages]
        assert other.stats()["hits"] == 10
    finally:
        other.close()


def test_ttl_and_capacity_on_our_side(master):
    clock = ManualClock(100.0)
    entry = HEADER_SIZE + MiB
    s = open_store("mooncake", master_address=master.address, global_segment_size=64 * MiB,
                   local_buffer_size=16 * MiB, capacity_bytes=3 * entry, ttl_s=30.0, clock=clock)
    try:
        for k in "abc":
            s.put(k, bytes([ord(k)]) * MiB)
        assert s.get("a") is not None
        s.put("d", b"d" * MiB)  # b is the least recently used
        assert s.lru_keys() == ["c", "a", "d"] and s.raw_client.is_exist("b") == 0
        clock.advance(30)
        assert s.get("c") is None and s.stats()["expired"] == 1 and s.raw_client.is_exist("c") == 0
    finally:
        s.raw_client.remove_all(True)
        s.close()


def test_full_pool_evicts_our_lru_and_retries(master):
    s = MooncakeKVStore(MooncakeStoreConfig(master.address, global_segment_size=32 * MiB, local_buffer_size=16 * MiB))
    try:
        for i in range(10):  # 40 MiB into a 32 MiB pool, no capacity bound of ours: Mooncake says no space
            s.put(f"f{i}", os.urandom(4 * MiB))
        st = s.stats()
        assert st["evictions"] >= 1 and s.get("f9") is not None and s.get("f0") is None
    finally:
        s.raw_client.remove_all(True)
        s.close()
