"""A front that stops while it restarts an instance (issue 29, item 4; controller/health.py): no restart starts after
``Health.stop``, one still waiting for its process to load ends that process at once, and every process a restart
started stays known, so the front's shutdown can end them all. Stand-in processes; the real thing is
tests/integration/test_poison_containment.py (its last test)."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller import launcher
from sglang_prorsa.srt.controller.health import Health
from sglang_prorsa.srt.utils import processes

PIDS = itertools.count(900001)


class StandIn:
    """An instance process as Health sees it. ``loads`` False: it never finishes loading, so only a stop (or the
    timeout) ends a wait for it -- as a restart a front is told to stop in the middle of."""

    def __init__(self, log_dir: Path, loads: bool = True) -> None:
        self.pid, self.port, self.loads = next(PIDS), 4001, loads
        self.name = f"stand-in-{self.pid}"
        self.argv = [sys.executable, "-m", launcher.INSTANCE_MODULE, "--spec", str(log_dir / "instance-1.json")]
        self.log_path = log_dir / f"{self.name}.log"
        self.env = {"SGLANG_HOST_IP": "127.0.0.1", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
        self.proc = SimpleNamespace(returncode=None)
        self.stopped = False
        self.on_stop = lambda: None

    def alive(self) -> bool:
        return not self.stopped

    def stop(self, grace_s: float = 8.0) -> None:
        self.on_stop()
        self.stopped = True

    def wait_ready(self, timeout: float, path: str = "/health", stop: threading.Event | None = None) -> float:
        if self.loads:
            return 0.1
        if (stop or threading.Event()).wait(timeout):
            raise processes.Stopped(self.name)
        raise TimeoutError(self.name)


def front_with_one_lost_instance(tmp_path: Path, monkeypatch) -> tuple[Health, Instance, StandIn, list[StandIn]]:
    """A Health over one decode instance this front started, whose process just died; ``processes.start`` hands out
    stand-ins (recorded in the returned list) that never finish loading."""
    registry = Registry()
    inst = registry.add(Instance("1", "http://127.0.0.1:4001", "decode", state=State.ACTIVE, started_here=True))
    first = StandIn(tmp_path)
    first.stopped = True  # it crashed
    orchestrator = SimpleNamespace(router=None, push_peers=_nothing)
    health = Health(registry, orchestrator, http=None, processes={"1": first}, specs={})
    started: list[StandIn] = []

    def start(module_args, **kwargs):
        assert kwargs["env"] == first.env  # a restart advertises the address the first start did
        started.append(StandIn(tmp_path, loads=False))
        return started[-1]

    monkeypatch.setattr(processes, "start", start)
    return health, inst, first, started


async def _nothing() -> None:
    return None


async def _until(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_stop_during_a_restart_ends_the_process_being_loaded_at_once(tmp_path, monkeypatch):
    health, inst, first, started = front_with_one_lost_instance(tmp_path, monkeypatch)

    async def scenario() -> float:
        await health.lost(inst)
        await _until(lambda: started)  # the restart started its process and waits for it to load
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        health.stop()
        await health.restarts_ended(timeout_s=10)
        return time.monotonic() - t0

    took = asyncio.run(scenario())
    assert took < 2.0  # not the 900 s a restart may take to load
    (replacement,) = started
    assert replacement.stopped, "the process the interrupted restart started is still running"
    assert health.started == [replacement]  # remembered, so the front's last act ends it whatever happened here
    assert health.processes["1"] is replacement and inst.pid == replacement.pid
    assert inst.state is State.DEAD  # never back in the pools
    assert health.restarts == 1 and health.lost_total == 1


def test_no_restart_starts_once_the_front_is_stopping(tmp_path, monkeypatch):
    health, inst, first, started = front_with_one_lost_instance(tmp_path, monkeypatch)

    async def scenario() -> None:
        health.stop()
        await health.lost(inst)
        await health.restarts_ended(timeout_s=1)

    asyncio.run(scenario())
    assert started == [] and health.started == [] and health.restarts == 0
    assert inst.state is State.DEAD and health.lost_total == 1  # still noticed as lost: out of every pool


def test_a_stop_that_arrives_while_the_old_process_ends_starts_nothing(tmp_path, monkeypatch):
    health, inst, first, started = front_with_one_lost_instance(tmp_path, monkeypatch)
    first.on_stop = health.stop  # the restart ends the old process first (it blocks up to seconds)

    async def scenario() -> None:
        await health.lost(inst)
        await health.restarts_ended(timeout_s=5)

    asyncio.run(scenario())
    assert started == [] and health.started == [] and inst.state is State.DEAD


def test_without_a_stop_a_restart_still_brings_the_instance_back(tmp_path, monkeypatch):
    health, inst, first, started = front_with_one_lost_instance(tmp_path, monkeypatch)
    monkeypatch.setattr(processes, "start", lambda module_args, **kw: started.append(StandIn(tmp_path)) or started[-1])

    async def scenario() -> None:
        await health.lost(inst)
        await _until(lambda: inst.state is State.ACTIVE)
        await health.restarts_ended(timeout_s=5)

    asyncio.run(scenario())
    (replacement,) = started
    assert not replacement.stopped and health.started == [replacement] and inst.epoch == 1


def test_wait_ready_ends_when_told_to_stop_instead_of_at_its_timeout(tmp_path):
    """The real ``ServerProcess.wait_ready`` over a process that never answers (nothing listens on its port)."""
    srv = processes.ServerProcess(name="never-ready", argv=[], port=processes.free_port(),
                                  proc=SimpleNamespace(pid=next(PIDS), poll=lambda: None, returncode=None),
                                  log_path=tmp_path / "never-ready.log")
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(processes.Stopped):
        srv.wait_ready(timeout=60, stop=stop)
    assert time.monotonic() - t0 < 3.0
    with pytest.raises(processes.Stopped):  # already set: no wait at all
        srv.wait_ready(timeout=60, stop=stop)


def test_the_front_stops_every_process_it_started_restarted_ones_included():
    a, b, c, d = (SimpleNamespace(pid=pid) for pid in (11, 12, 13, 14))
    started = {"0": a, "1": b}  # as launched
    front = SimpleNamespace(processes={"0": a, "1": c},  # instance 1 restarted as c (b was ended then)
                            health=SimpleNamespace(started=[d, c]))  # d: a restart the stop interrupted
    assert sorted(p.pid for p in launcher.deployment_processes(started, front)) == [11, 12, 13, 14]
    assert launcher.deployment_processes(started, None) == [a, b]  # stopped before the front was built


def test_a_failed_restart_is_tried_again_until_the_instance_is_back(tmp_path, monkeypatch):
    """A restart whose process does not load is not the end: the instance stayed out of every pool for good."""
    from sglang_prorsa.srt.controller import health as health_mod

    health, inst, first, started = front_with_one_lost_instance(tmp_path, monkeypatch)
    monkeypatch.setattr(health_mod, "RESTART_READY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(health_mod, "RESTART_PAUSE_S", 0.01)
    loads = iter([False, True])  # the first restart never loads (times out), the second does
    monkeypatch.setattr(processes, "start",
                        lambda module_args, **kw: started.append(StandIn(tmp_path, loads=next(loads))) or started[-1])

    async def scenario() -> None:
        await health.lost(inst)
        await _until(lambda: inst.state is State.ACTIVE)
        await health.restarts_ended(timeout_s=5)

    asyncio.run(scenario())
    assert len(started) == 2 and started[0].stopped and not started[1].stopped
    assert health.processes["1"] is started[1] and health.restarts == 2


def test_restarts_stop_after_the_last_attempt(tmp_path, monkeypatch):
    from sglang_prorsa.srt.controller import health as health_mod

    health, inst, first, started = front_with_one_lost_instance(tmp_path, monkeypatch)
    monkeypatch.setattr(health_mod, "RESTART_READY_TIMEOUT_S", 0.02)
    monkeypatch.setattr(health_mod, "RESTART_PAUSE_S", 0.01)

    async def scenario() -> None:
        await health.lost(inst)
        await health.restarts_ended(timeout_s=5)

    asyncio.run(scenario())
    assert len(started) == health_mod.RESTART_ATTEMPTS and inst.state is State.DEAD
