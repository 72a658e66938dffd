"""KV store bandwidth (issue 6): put/get GB/s of the file and Mooncake backends, with and without checksums.

For block sizes typical of one request's KV (64 KiB ... 8 MiB) it moves ``--mib`` MiB of random blocks through
``put_many``/``get_many`` (the persist and resume paths use batches). Both checksum variants of a backend are run
interleaved, round by round, and each reports its best of ``--repeats`` rounds after a warm-up round: the machine is
shared, and other tenants only ever make a round slower.

Baselines measured in the same run: ``copy`` is ``bytes(bytearray)`` of every block, one copy into fresh memory (the
ratio columns ``/copy``); ``memcpy`` is a copy into preallocated memory. On this VM the ``bytes()`` copy pays a
first-touch page fault per 4 KiB and runs well below memcpy, so a store's ``get`` can beat it.

Backends: ``file`` writes to a temporary directory on the local disk (through the page cache: a reader on the same
machine shortly after a write does not wait for the disk). ``mooncake`` puts and gets through the client that owns the
segment (Mooncake copies locally); ``mooncake-peer`` gets through a second client without a segment, as the instance
resuming a migrated request would (through the TCP transport on loopback, judging by its speed; both clients live in
this one process). The ``mooncake_master`` is started on 127.0.0.1 and stopped by PID.

    PYTHONPATH=. python benchmarks/bench_kv_store.py [--quick] [--mib 32] [--repeats 5]

Prints a table and writes benchmarks/results/kv_store_bandwidth.{png,json,txt}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import xxhash
from tqdm import tqdm

from sglang_prorsa.srt.disaggregation.kv_store import FileKVStore, IndexedKVStore, KVStore
from sglang_prorsa.srt.disaggregation.mooncake_master import start_mooncake_master

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
KiB, MiB = 1 << 10, 1 << 20
SIZES = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB)
log = logging.getLogger("bench_kv_store")


@dataclass(frozen=True)
class Row:
    backend: str  # "copy" | "memcpy" (baselines) | "file" | "mooncake" | "mooncake-peer"
    checksum: str  # "xxh3" | "none" | "-"
    block_bytes: int
    put_gbps: float
    get_gbps: float


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def _best(fn: Callable[[], None], repeats: int) -> float:
    """Best of ``repeats`` timed runs after one untimed warm-up (first-touch page faults, connection set-up); the best,
    not the mean, because the machine is shared and every disturbance only ever makes a run slower."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _blocks(size: int, total: int) -> list[bytes]:
    n = max(4, total // size)
    seed = os.urandom(size)
    # Distinct blocks (a rotated seed) without paying os.urandom for every one of them.
    return [seed[i % size:] + seed[: i % size] for i in range(n)]


def measure_copy(blocks: list[bytes], repeats: int) -> float:
    """The baseline: ``bytes(buffer)`` of every block, i.e. one copy into freshly allocated memory, which is what a
    store's ``get`` must at least do to hand back a new ``bytes`` object."""
    srcs = [bytearray(b) for b in blocks]
    return _gbps(sum(len(b) for b in blocks), _best(lambda: [bytes(s) for s in srcs], repeats))


def measure_memcpy(blocks: list[bytes], repeats: int) -> float:
    """A copy into preallocated memory (no page faults): the machine's memory bandwidth seen from Python."""
    dsts = [bytearray(len(b)) for b in blocks]

    def run() -> None:
        for d, b in zip(dsts, blocks):
            d[:] = b

    return _gbps(sum(len(b) for b in blocks), _best(run, repeats))


def measure_store(store: IndexedKVStore, blocks: list[bytes], repeats: int, tag: str,
                  reader: KVStore | None = None, variants: tuple[str, ...] = ("xxh3", "none"),
                  ) -> dict[str, tuple[float, float]]:
    """put_many then get_many of ``blocks`` under each checksum variant, interleaved round by round so that both see
    the same disturbances from the machine's other tenants; best of ``repeats`` rounds after a warm-up round.
    ``reader`` (default: the same store) is the one that gets the blocks back. Returns variant -> (put, get) GB/s."""
    reader = reader or store
    total = sum(len(b) for b in blocks)
    keys = {ck: [f"bench-{tag}-{ck}-{i}" for i in range(len(blocks))] for ck in variants}
    best = {ck: [float("inf"), float("inf")] for ck in variants}
    for round_ in range(repeats + 1):
        for ck in variants:
            store.checksum = ck  # the algorithm travels in each value's header, so one store serves every variant
            t0 = time.perf_counter()
            store.put_many(list(zip(keys[ck], blocks)))
            t1 = time.perf_counter()
            got = reader.get_many(keys[ck])
            t2 = time.perf_counter()
            if any(g is None for g in got):
                raise RuntimeError(f"{tag}/{ck}: a block went missing")
            del got
            if round_:
                best[ck] = [min(best[ck][0], t1 - t0), min(best[ck][1], t2 - t1)]
    for ck in variants:
        for key in keys[ck]:
            store.delete(key)
    return {ck: (_gbps(total, p), _gbps(total, g)) for ck, (p, g) in best.items()}


def measure_checksums(blocks: list[bytes], repeats: int) -> dict[str, float]:
    """Raw checksum speed over the same blocks the stores move (mostly cold in cache, as in a store)."""
    total = sum(len(b) for b in blocks)
    return {
        "xxh3": _gbps(total, _best(lambda: [xxhash.xxh3_64_intdigest(b) for b in blocks], repeats)),
        "crc32": _gbps(total, _best(lambda: [zlib.crc32(b) for b in blocks], repeats)),
    }


def plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    series = sorted({(r.backend, r.checksum) for r in rows})
    for ax, op in zip(axes, ("put", "get")):
        for backend, checksum in series:
            pts = sorted((r.block_bytes, getattr(r, f"{op}_gbps")) for r in rows
                         if r.backend == backend and r.checksum == checksum)
            label = {"copy": "bytes() copy (baseline)", "memcpy": "memcpy into preallocated memory"}.get(
                backend, f"{backend}, checksum={checksum}")
            style = {"copy": dict(linestyle="--", color="black"), "memcpy": dict(linestyle=":", color="grey")}.get(
                backend, dict(marker="o"))
            ax.plot([p[0] / KiB for p in pts], [p[1] for p in pts], label=label, **style)
        ax.set_xscale("log", base=2)
        ticks = sorted({r.block_bytes for r in rows})
        ax.set_xticks([t / KiB for t in ticks], [f"{t // KiB}K" if t < MiB else f"{t // MiB}M" for t in ticks])
        ax.set_yscale("log")
        ax.set_xlabel("block size")
        ax.set_title(f"{op} bandwidth")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[1].legend(fontsize=8)
    fig.suptitle("KV store bandwidth (one process, loopback, best of N)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def table(rows: list[Row]) -> str:
    """One line per case; ratios against the bytes() copy (fresh memory) and the memcpy into preallocated memory."""
    copy = {r.block_bytes: r.put_gbps for r in rows if r.backend == "copy"}
    mem = {r.block_bytes: r.put_gbps for r in rows if r.backend == "memcpy"}
    by_key = {(r.backend, r.checksum, r.block_bytes): r for r in rows}
    lines = [f"{'backend':<13} {'checksum':<8} {'block':>6} {'put GB/s':>9} {'get GB/s':>9} {'put/copy':>9} "
             f"{'get/copy':>9} {'put/memcpy':>10} {'get/memcpy':>10} {'ck cost put':>11} {'ck cost get':>11}"]
    for r in rows:
        size = f"{r.block_bytes // KiB}K" if r.block_bytes < MiB else f"{r.block_bytes // MiB}M"
        cost_put = cost_get = ""
        plain = by_key.get((r.backend, "none", r.block_bytes))
        if r.checksum not in ("none", "-") and plain:
            # Extra time per byte the checksum costs, relative to the same backend without it.
            cost_put = f"{plain.put_gbps / r.put_gbps - 1:+.0%}"
            cost_get = f"{plain.get_gbps / r.get_gbps - 1:+.0%}"
        c, m = copy[r.block_bytes], mem[r.block_bytes]
        lines.append(f"{r.backend:<13} {r.checksum:<8} {size:>6} {r.put_gbps:>9.2f} {r.get_gbps:>9.2f} "
                     f"{r.put_gbps / c:>9.2f} {r.get_gbps / c:>9.2f} {r.put_gbps / m:>10.2f} {r.get_gbps / m:>10.2f} "
                     f"{cost_put:>11} {cost_get:>11}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=32, help="MiB moved per measurement (per block size)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="16 MiB, 2 repeats, three block sizes")
    ap.add_argument("--no-mooncake", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("MOONCAKE_PROTOCOL", "tcp")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    sizes = (64 * KiB, 1 * MiB, 8 * MiB) if args.quick else SIZES
    total = (16 if args.quick else args.mib) * MiB
    repeats = 2 if args.quick else args.repeats

    tmp = Path(tempfile.mkdtemp(prefix="prorsa-bench-kv-"))
    master = None
    stores: dict[str, IndexedKVStore] = {}
    peer: IndexedKVStore | None = None
    rows: list[Row] = []
    checksums: dict[int, dict[str, float]] = {}
    t_start = time.monotonic()
    try:
        stores["file"] = FileKVStore(tmp / "file", capacity_bytes=4 * total)
        if not args.no_mooncake:
            from sglang_prorsa.srt.disaggregation.kv_store_mooncake import MooncakeKVStore, MooncakeStoreConfig

            master = start_mooncake_master(log_dir=tmp / "logs")
            # One client whose segment holds one measurement's blocks (both variants); emptied after each.
            stores["mooncake"] = MooncakeKVStore(MooncakeStoreConfig(
                master.address, global_segment_size=2 * total + 64 * MiB, local_buffer_size=32 * MiB))
            # A second client without a segment of its own, like the instance that resumes a migrated request: its
            # reads come over the TCP transport, while the owner's own reads are a local memcpy.
            peer = MooncakeKVStore(MooncakeStoreConfig(master.address, global_segment_size=0,
                                                       local_buffer_size=32 * MiB))
        backends = [*stores, *(["mooncake-peer"] if peer else [])]
        steps = [(size, case) for size in sizes for case in ("copy", "memcpy", *backends)]
        for size, case in tqdm(steps, desc="kv store bandwidth", unit="case"):
            blocks = _blocks(size, total)
            if case == "copy":
                bw = measure_copy(blocks, repeats)
                rows.append(Row(case, "-", size, bw, bw))
                checksums[size] = measure_checksums(blocks, repeats)
            elif case == "memcpy":
                bw = measure_memcpy(blocks, repeats)
                rows.append(Row(case, "-", size, bw, bw))
            else:
                store = stores["mooncake" if case == "mooncake-peer" else case]
                reader = peer if case == "mooncake-peer" else None
                for ck, (put, get) in measure_store(store, blocks, repeats, f"{case}-{size}", reader).items():
                    rows.append(Row(case, ck, size, put, get))
    finally:
        for store in [*stores.values(), *([peer] if peer else [])]:
            store.close()
        if master is not None:
            master.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    text = table(rows)
    print()
    print(text)
    print("\nraw checksum speed (GB/s): " + ", ".join(
        f"{s // KiB}K: xxh3 {c['xxh3']:.1f}, crc32 {c['crc32']:.1f}" for s, c in checksums.items()))
    print(f"elapsed {time.monotonic() - t_start:.1f} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(rows, RESULTS / "kv_store_bandwidth.png")
    (RESULTS / "kv_store_bandwidth.txt").write_text(text + "\n")
    (RESULTS / "kv_store_bandwidth.json").write_text(json.dumps(
        {"mib_per_case": total // MiB, "repeats": repeats, "rows": [asdict(r) for r in rows],
         "checksum_gbps": {str(k): v for k, v in checksums.items()}}, indent=1))
    print(f"wrote {RESULTS}/kv_store_bandwidth.png, .json and .txt")


if __name__ == "__main__":
    main()
