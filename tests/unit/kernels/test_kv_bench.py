"""Microbenchmarks of KV export/import (opt-in: ``pytest tests/unit/kernels --kv-bench``).

They reuse benchmarks/bench_kv_export.py's timing loop on a few sizes, print its table, and check the issue's targets:
on CPU, export at least 85 % of a plain copy of the same bytes (page size 16); on a GPU, at least 80 % of a
device-to-device copy for a large request, and faster than the naive per-layer path.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from unit_support import load_benchmark


@pytest.fixture(scope="module")
def bench(kv_bench: bool) -> ModuleType:
    if not kv_bench:
        pytest.skip("microbenchmark: run with --kv-bench or SGLANG_PRORSA_KV_BENCH=1")
    return load_benchmark("bench_kv_export")


def test_cpu_export_near_copy_bandwidth(bench: ModuleType) -> None:
    cases = [bench.Case(4096, 32, 16), bench.Case(16384, 32, 16), bench.Case(4096, 32, 1), bench.Case(4096, 32, 64)]
    results = [bench.run_case(c, torch.device("cpu"), rounds=5) for c in cases]
    print("\n" + bench.format_table(results))
    paged = [r for r in results if r.case.page_size == 16]
    for r in paged:
        assert r.ratio["export / copy"] >= 0.85, f"{r.case.label()}: export at {r.ratio['export / copy']:.2f} of copy"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_export_near_copy_bandwidth(bench: ModuleType, backend: str) -> None:
    cases = [bench.Case(t, 64, p, heads=8) for t in (4096, 32768) for p in (1, 16)]
    results = [bench.run_case(c, torch.device("cuda"), rounds=10, backend=backend) for c in cases]
    print("\n" + bench.format_table(results))
    for r in results:
        assert r.ratio["export / naive"] > 1.0, r.case.label()
        if r.case.tokens >= 32768:
            assert r.ratio["export / copy"] >= 0.8, f"{r.case.label()}: {r.ratio['export / copy']:.2f} of copy"
