"""Start and stop a local ``mooncake_master`` (the Mooncake Store's metadata/allocation service).

The master only keeps metadata; the bytes live in the segments the store clients mount (``global_segment_size``).
Its RPC service (``--rpc_address``) binds the address its clients reach it at: loopback by default, a front's own
address when instances on other machines use it. Its HTTP metrics/admin server (``--metrics_host``) stays on
loopback; its embedded HTTP metadata server stays off (clients use P2P handshake metadata).

It runs in its own process group and is ended by PID: SIGTERM, then SIGKILL of the group. An ``atexit`` hook stops
masters still running when the interpreter exits, so an interrupted test run leaves none behind.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sglang_prorsa.srt.utils.processes import free_port

LOOPBACK = "127.0.0.1"
_LIVE: dict[int, "MasterProcess"] = {}


def find_master_binary() -> Path:
    """The native ``mooncake_master``: the package's own binary first (the venv's ``bin/mooncake_master`` is a Python
    wrapper that ``execv``s it, which keeps the PID but costs an interpreter start), then the venv's bin, then PATH."""
    spec = importlib.util.find_spec("mooncake")
    candidates: list[Path] = []
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "mooncake_master")
    candidates.append(Path(sys.executable).parent / "mooncake_master")
    found = shutil.which("mooncake_master")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file():
            if not os.access(path, os.X_OK):
                raise PermissionError(f"{path} is not executable")
            return path
    raise FileNotFoundError(f"mooncake_master not found (looked in {[str(p) for p in candidates]}); "
                            "install mooncake-transfer-engine(-non-cuda)")


@dataclass
class MasterProcess:
    """A running master. ``address`` is what store clients pass as ``master_server_addr``."""

    proc: subprocess.Popen
    port: int
    metrics_port: int
    log_path: Path
    host: str = LOOPBACK  # the address clients reach it at (it binds that one, or every address for a wildcard)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Until the RPC port accepts connections; raises (after stopping it) if it dies or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"mooncake_master not listening on {self.address} within {timeout_s} s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the group, wait, then SIGKILL the group. Idempotent."""
        _LIVE.pop(self.pid, None)
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)  # our own group: started with start_new_session=True
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:
                # The leader is gone; make sure nothing it started outlives it.
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        if self.proc.poll() is None:
            self.proc.wait(timeout=5.0)


def master_argv(binary: Path, port: int, metrics_port: int, extra_args: Sequence[str] = (),
                bind: str = LOOPBACK) -> list[str]:
    """The master's command line: its RPC port on ``bind`` (every address for 0.0.0.0), the rest on loopback."""
    return [
        str(binary),
        f"--rpc_address={bind}",
        f"--rpc_port={port}",
        f"--metrics_host={LOOPBACK}",
        f"--metrics_port={metrics_port}",
        "--enable_http_metadata_server=false",
        f"--http_metadata_server_host={LOOPBACK}",  # in case a caller turns it on through extra_args
        "--enable_metric_reporting=false",  # otherwise it logs a long metrics line every few seconds
        "--rpc_thread_num=2",  # a small machine; the master only handles metadata
        *extra_args,
    ]


def start_mooncake_master(
    port: int | None = None,
    *,
    log_dir: str | Path | None = None,
    metrics_port: int | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 20.0,
    bind: str = LOOPBACK,
    advertise: str = LOOPBACK,
) -> MasterProcess:
    """Start a master on ``bind:port`` (a free port when None) and wait until it accepts connections at
    ``advertise:port``, the address its clients on other machines are given (a front's: from ``--host`` /
    ``--prorsa-advertise-url``, ``config.advertise_host``).

    ``extra_args`` pass through, e.g. ``["--default_kv_lease_ttl=1000", "--eviction_high_watermark_ratio=0.8"]``.
    """
    binary = find_master_binary()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="prorsa-mooncake-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    attempts = 1 if port is not None else 3  # a free port can be taken between probing and binding it
    last: Exception | None = None
    for _ in range(attempts):
        rpc_port = port if port is not None else free_port()
        m_port = metrics_port if metrics_port is not None else free_port()
        log_path = log_dir / f"mooncake_master-{rpc_port}.log"
        env = dict(os.environ)
        env["MC_TCP_BIND_ADDRESS"] = advertise
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(master_argv(binary, rpc_port, m_port, extra_args, bind), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, cwd=log_dir)
        master = MasterProcess(proc=proc, port=rpc_port, metrics_port=m_port, log_path=log_path, host=advertise)
        _LIVE[proc.pid] = master
        try:
            master.wait_ready(ready_timeout_s)
            return master
        except (RuntimeError, TimeoutError) as e:
            master.stop()
            last = e
    raise RuntimeError(f"could not start mooncake_master: {last}")


def stop_all() -> None:
    for master in list(_LIVE.values()):
        master.stop(grace_s=2.0)


atexit.register(stop_all)
