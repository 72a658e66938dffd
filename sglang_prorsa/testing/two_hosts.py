"""Two "hosts" on one machine for the multi-host tests: two network namespaces joined by a veth pair.

Each namespace has its own loopback and one address on the pair (``HOST_A`` / ``HOST_B``, a /24 between them), so a
process in one reaches the other only at the other's address, and 127.0.0.1 in each is its own: anything that
advertised loopback to the other host would reach the wrong process or nothing. The test driver (this process, in the
machine's namespace) reaches both hosts through a management link of its own to each (a second veth pair, a /30) and
a host route to each host's address over it; the traffic between the two hosts never leaves their pair.

Needs CAP_NET_ADMIN and ``ip`` (iproute2); ``unavailable()`` says why not, for a skip. Everything created here is
removed on exit (deleting a namespace removes its links), also after a failure half-way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

HOST_A, HOST_B = "10.231.0.1", "10.231.0.2"
_MGMT = {"a": ("10.232.1.1", "10.232.1.2"), "b": ("10.232.2.1", "10.232.2.2")}  # (this side, the host's side)


@dataclass(frozen=True)
class TwoHosts:
    ns_a: str
    ns_b: str
    host_a: str = HOST_A
    host_b: str = HOST_B


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why two namespaces cannot be made here, or None when they can (tried: one is created and deleted)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"prorsa-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a network namespace: {e}"
    try:
        _ip("netns", "del", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        pass
    return None


@contextmanager
def two_hosts() -> Iterator[TwoHosts]:
    """Create both namespaces, the pair between them and the driver's links; remove them all on exit."""
    tag = f"{os.getpid() % 100000}"
    hosts = TwoHosts(ns_a=f"prorsa-a-{tag}", ns_b=f"prorsa-b-{tag}")
    made: list[str] = []
    mgmt_links: list[str] = []
    try:
        for ns in (hosts.ns_a, hosts.ns_b):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        # The pair between the hosts: created in the machine's namespace, then one end moved into each host.
        pa, pb = f"pa{tag}", f"pb{tag}"
        _ip("link", "add", pa, "type", "veth", "peer", "name", pb)
        for dev, ns, addr in ((pa, hosts.ns_a, hosts.host_a), (pb, hosts.ns_b, hosts.host_b)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        # The driver's management link to each host, and a route to the host's address over it.
        for side, ns, addr in (("a", hosts.ns_a, hosts.host_a), ("b", hosts.ns_b, hosts.host_b)):
            here, there = _MGMT[side]
            mine, theirs = f"m{side}{tag}", f"n{side}{tag}"
            _ip("link", "add", mine, "type", "veth", "peer", "name", theirs)
            mgmt_links.append(mine)
            _ip("link", "set", theirs, "netns", ns)
            _ip("addr", "add", f"{here}/30", "dev", mine)
            _ip("link", "set", mine, "up")
            _ip("-n", ns, "addr", "add", f"{there}/30", "dev", theirs)
            _ip("-n", ns, "link", "set", theirs, "up")
            _ip("route", "add", f"{addr}/32", "via", there, "dev", mine)
        yield hosts
    finally:
        for link in mgmt_links:  # its route goes with it
            try:
                _ip("link", "del", link)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                pass
        for ns in made:
            try:
                _ip("netns", "del", ns)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                pass


def listening(ns: str) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket listening in ``ns`` (``ss``), to see what a host exposes to the other."""
    done = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htln"], capture_output=True, text=True, timeout=30)
    out = []
    for line in done.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 4 and ":" in cols[3]:
            addr, port = cols[3].rsplit(":", 1)
            out.append((addr.strip("[]"), int(port)))
    return out


def connections(ns: str) -> list[tuple[str, str]]:
    """(local, peer) ``ADDR:PORT`` of every established TCP connection in ``ns``."""
    done = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htn", "state", "established"], capture_output=True,
                          text=True, timeout=30)
    out = []
    for line in done.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 4:
            out.append((cols[2], cols[3]))
    return out


def listening_pids(ns: str | None, port: int) -> list[int]:
    """PIDs of the processes listening on TCP ``port`` in ``ns`` (this namespace for None)."""
    prefix = ["ip", "netns", "exec", ns] if ns else []
    done = subprocess.run([*prefix, "ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True, timeout=30)
    return sorted({int(pid) for pid in re.findall(r"pid=(\d+)", done.stdout)})
