"""Session-scoped real servers: started once, shared by every integration test, ended by PID at the end.

Each SGLang server on this CPU costs ~2 GB of RAM and ~20–60 s to start, so tests share them. Servers are started in
their own process groups; teardown (and an atexit hook, for interrupted runs) kills the groups.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from sglang_prorsa.srt.utils import processes as servers
from sglang_prorsa.testing.tiny_model import ensure_default_model

CHUNK = 64  # small chunked-prefill size so a test prompt can span several chunks


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return ensure_default_model()


@pytest.fixture(scope="session")
def log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="prorsa-test-logs-"))


def _common(port: int) -> list[str]:
    return ["--host", servers.LOOPBACK, "--port", str(port), "--chunked-prefill-size", str(CHUNK),
            "--max-total-tokens", "65536", "--log-level", "warning"]


def _start_all(specs: list[tuple[str, list[str], int]], log_dir: Path) -> list[servers.ServerProcess]:
    started = [servers.start(args, name=name, port=port, log_dir=log_dir) for name, args, port in specs]
    try:
        for s in started:
            s.wait_ready()
    except BaseException:
        for s in started:
            s.stop()
        raise
    return started


@pytest.fixture(scope="session")
def single_server(tiny_model, log_dir):
    port = servers.free_port()
    (srv,) = _start_all([("single", _common(port), port)], log_dir)
    yield srv
    srv.stop()
