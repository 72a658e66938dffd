"""Fixtures for the KV export/import kernel tests.

``--kv-bench`` (or ``SGLANG_PRORSA_KV_BENCH=1``) turns on the microbenchmark tests in test_kv_bench.py.

The kernels live in ``kernels/`` and are installed as ``sglang_prorsa.kernels``; when the project is not installed
(a bare checkout), this conftest loads them under that name so the tests import them the same way either way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kv_kernels_path import REPO, ensure_kernels_importable

ensure_kernels_importable()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kv-bench", action="store_true", default=False, help="run the KV export/import microbenchmarks"
    )


@pytest.fixture(scope="session")
def kv_bench(request: pytest.FixtureRequest) -> bool:
    """True when microbenchmarks were asked for."""
    return bool(request.config.getoption("--kv-bench")) or os.environ.get("SGLANG_PRORSA_KV_BENCH") == "1"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
