"""Start and stop real server processes for tests and benchmarks, bound to 127.0.0.1 (or, for the two-host tests,
in a network namespace of their own, ``netns``), ended by PID.

Every process is started in its own session (process group) and recorded; ``stop`` sends SIGTERM to the group, waits,
then SIGKILLs the group (SGLang servers do not always exit within seconds of SIGTERM). An ``atexit`` hook stops
whatever is still recorded, so an interrupted test run leaves nothing behind.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import requests

from sglang_prorsa.config import ADDRESS_VARIABLES, address_variables

LOOPBACK = "127.0.0.1"
_LIVE: dict[int, "ServerProcess"] = {}


class Stopped(Exception):
    """``wait_ready`` was told to stop waiting: whoever waited is shutting down, and ends the process itself."""


# The bands ``free_port`` draws from. A server binds its port 20-60 s after we choose it (after the model loads), so
# the port must not be one anybody else is handed meanwhile: not the kernel's ephemeral range (bind(0) and every
# outgoing connection draw from it; a CI run lost a server to that), nor SGLang's own band for the ports its children
# bind later (22000-29999, ``get_free_port_below_ephemeral``, 0.5.23), nor Mooncake's transfer-engine RPC band
# (15000-17000).
PORT_BANDS = ((10000, 14999), (17001, 21999))
_HANDED_OUT: set[int] = set()  # never hand the same port out twice from one process


def free_port() -> int:
    """A loopback TCP port that is free now and that nobody else is likely to bind before our server does."""
    ephemeral_low = _ephemeral_low()
    candidates = [p for low, high in PORT_BANDS for p in range(low, min(high, ephemeral_low - 1) + 1)]
    for port in random.sample(candidates, min(len(candidates), 256)):
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the bands are full: let the kernel choose
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def loopback_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every server we start on this host gets: nothing is advertised beyond loopback."""
    env = user_env()
    env.update(address_variables(LOOPBACK), MOONCAKE_PROTOCOL="tcp")
    env.update(extra or {})
    return env


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a user's shell would give a server: this one without the address variables (what it
    advertises then comes from its flags alone), unbuffered output, and no ``./`` on the module path."""
    env = {k: v for k, v in os.environ.items() if k not in ADDRESS_VARIABLES}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONSAFEPATH", "1")  # never let a ./kernels in the working directory shadow PyPI's `kernels`
    env.update(extra or {})
    return env


@dataclass
class ServerProcess:
    name: str
    argv: list[str]
    port: int
    proc: subprocess.Popen
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    ready_s: float | None = None
    env: dict[str, str] | None = None  # what it was started with beyond ours (a restart starts it with the same)
    host: str = LOOPBACK  # where this process reaches it
    netns: str | None = None  # the network namespace it runs in (None: this process's)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def wait_ready(self, timeout: float = 180.0, path: str = "/health", stop: threading.Event | None = None) -> float:
        """Seconds from start until ``path`` answers 200. ``stop``, set from another thread, ends the wait within a
        poll (``Stopped``) instead of its ``timeout``: a front told to stop must not wait for an instance to load."""
        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stop.is_set():
                raise Stopped(f"stopped waiting for server {self.name} (pid {self.pid})")
            if not self.alive():
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + path, timeout=2).status_code == 200:
                    self.ready_s = time.monotonic() - self.started_at
                    return self.ready_s
            except requests.RequestException:
                pass
            stop.wait(0.5)
        self.stop()
        raise TimeoutError(f"server {self.name} not ready within {timeout} s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 8.0) -> None:
        _LIVE.pop(self.pid, None)
        if not self.alive():
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)  # our own process group: started with start_new_session=True
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                if sig == signal.SIGKILL:
                    return
            except subprocess.TimeoutExpired:
                continue
        # The leader exited on SIGTERM; still make sure none of its children outlive it.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(
    module_args: list[str],
    *,
    name: str,
    port: int,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    module: str = "sglang_prorsa.launch_server",
    die_with_parent: bool = False,
    netns: str | None = None,
    host: str = LOOPBACK,
) -> ServerProcess:
    """Start ``python -m module *module_args`` (the caller puts --host/--port in ``module_args``).

    ``die_with_parent``: the kernel sends the child SIGTERM when this process dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so a front that is killed outright leaves no instance behind.
    ``netns``: run it in that network namespace (``ip netns exec``, which execs it under the same PID), as a user
    would on another host: with the user's environment (``user_env``), so what it advertises comes from its flags;
    ``host`` is where this process then reaches it.
    """
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="prorsa-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    argv = [sys.executable, "-m", module, *module_args]
    prefix = ["ip", "netns", "exec", netns] if netns else []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            prefix + argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=user_env(env) if netns else loopback_env(env), start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    server = ServerProcess(name=name, argv=argv, port=port, proc=proc, log_path=log_path, env=env, host=host,
                           netns=netns)
    _LIVE[proc.pid] = server
    return server


def ready_or_restarted(srv: ServerProcess, restart: Callable[[int], ServerProcess], retries: int,
                       timeout: float) -> tuple[ServerProcess, float]:
    """Wait for ``srv``. Its ports were free when chosen, but another process may bind one first: the server then
    exits with ``PORT_TAKEN_EXIT`` and ``restart(attempt)`` starts it again on fresh ports, up to ``retries`` times.
    Returns the process that serves and how long it took to be ready."""
    from sglang_prorsa.srt.common.messages import PORT_TAKEN_EXIT

    for attempt in range(1, retries + 2):
        try:
            return srv, srv.wait_ready(timeout=timeout)
        except RuntimeError:
            if srv.proc.returncode != PORT_TAKEN_EXIT or attempt > retries:
                raise
        srv = restart(attempt)
    raise AssertionError("unreachable")


def _die_with_parent() -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_many(servers: list[ServerProcess], grace_s: float = 8.0) -> None:
    """Stop several servers at once: SIGTERM to every group, one shared grace period, then SIGKILL what is left."""
    live = [s for s in servers if s.alive()]
    for s in live:
        try:
            os.killpg(s.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for s in live:
        try:
            s.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for s in servers:
        _LIVE.pop(s.pid, None)
        try:
            os.killpg(s.pid, signal.SIGKILL)  # the leader may be gone while a child of its group lingers
        except ProcessLookupError:
            pass


def stop_all() -> None:
    stop_many(list(_LIVE.values()), grace_s=3.0)


atexit.register(stop_all)
