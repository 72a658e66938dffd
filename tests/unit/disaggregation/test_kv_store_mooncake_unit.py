"""Mooncake pieces that need no running master: the master's command line and the batch splitting."""

from __future__ import annotations

from pathlib import Path

from sglang_prorsa.srt.disaggregation.kv_store_mooncake import MooncakeKVStore, MooncakeStoreConfig
from sglang_prorsa.srt.disaggregation.mooncake_master import master_argv

MiB = 1 << 20


def test_master_command_line_binds_loopback_only():
    argv = master_argv(Path("/x/mooncake_master"), 5555, 5556, ["--default_kv_lease_ttl=1000"])
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert flags["rpc_address"] == "127.0.0.1" and flags["rpc_port"] == "5555"
    assert flags["metrics_host"] == "127.0.0.1" and flags["metrics_port"] == "5556"
    assert flags["enable_http_metadata_server"] == "false"
    assert flags["http_metadata_server_host"] == "127.0.0.1"
    assert flags["default_kv_lease_ttl"] == "1000"
    assert not any("0.0.0.0" in a for a in argv)


def _splitter(entries: int, buffer: int) -> MooncakeKVStore:
    store = object.__new__(MooncakeKVStore)  # no client: only the batching arithmetic is under test
    store.config = MooncakeStoreConfig("127.0.0.1:1", local_buffer_size=buffer, max_batch_entries=entries,
                                       batch_buffer_fraction=0.5)
    return store


def test_batches_split_by_entries_and_by_staging_bytes():
    s = _splitter(entries=512, buffer=64 * MiB)  # at most 32 MiB per batch
    chunks = s._chunks([100] * 3000)
    assert [len(c) for c in chunks] == [512] * 5 + [440]
    assert [i for c in chunks for i in c] == list(range(3000))
    chunks = s._chunks([10 * MiB] * 7)
    assert [len(c) for c in chunks] == [3, 3, 1]
    # A value bigger than the batch share still goes, alone (it only has to fit the whole staging buffer).
    assert [len(c) for c in s._chunks([MiB, 40 * MiB, MiB])] == [1, 1, 1]
    assert s._chunks([]) == []
