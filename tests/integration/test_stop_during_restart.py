"""Issue 29, item 4: a front stopped while it restarts a lost instance ends that instance too -- no process of the
deployment outlives its front.

A front with two instances; one is SIGKILLed, and as soon as the front has started its replacement (a new PID in
``GET /prorsa/instances``), the front gets SIGTERM while the replacement still loads. The front must exit within
``STOP_WITHIN_S``; then no process may be left in any of the deployment's sessions (the front and every instance run
in their own) nor name the deployment's log directory on its command line, and the replacement must never have
finished loading (the stop ended it, rather than waiting for it). Whatever is found is SIGKILLed by PID, so a failure
leaks nothing either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from tests_support import ENGINE_FLAGS

from sglang_prorsa.srt.utils import processes

pytestmark = pytest.mark.integration

STOP_WITHIN_S = 20.0  # what the suite's own fronts get (tests_support.running_front) before SIGKILL
RESTART_SEEN_WITHIN_S = 30.0


def test_a_front_stopped_during_a_restart_leaves_no_process(tiny_model, log_dir):
    port = processes.free_port()
    front_logs = log_dir / f"stop-during-restart-{port}"
    front = processes.start(
        ["--pd-adaptive", "--prorsa-instances", "2", "--prorsa-initial-prefill", "1", "--prorsa-manual-switch",
         "--prorsa-log-dir", str(front_logs), "--host", processes.LOOPBACK, "--port", str(port), *ENGINE_FLAGS],
        name=f"front-stop-during-restart-{port}", port=port, log_dir=log_dir)
    sessions = {front.pid}  # the front and each instance lead their own session (start_new_session)
    try:
        front.wait_ready(timeout=900)
        pids = _instance_pids(front.url)
        assert len(pids) == 2 and all(pids.values()), pids
        sessions |= set(pids.values())

        victim = "1"
        os.killpg(pids[victim], signal.SIGKILL)  # the instance and every process of its group: a crash
        new_pid = _wait_for_new_pid(front.url, victim, pids[victim])
        sessions.add(new_pid)
        assert _alive(new_pid), "the replacement ended before the front was stopped: nothing left to test"
        replacement_url = f"http://{processes.LOOPBACK}:{_instance_port(front.url, victim)}"
        assert not _answers(replacement_url), \
            "the replacement was ready before the front was stopped: the stop did not land mid-restart"
        assert requests.get(front.url + "/prorsa/instances", timeout=10).json()["failures"] == \
            {"lost": 1, "restarts": 1, "suspected_poison": 0}

        os.kill(front.pid, signal.SIGTERM)
        t0 = time.monotonic()
        answered = threading.Event()  # the replacement finished loading after the stop: the stop waited for it
        watcher = threading.Thread(target=_watch, args=(replacement_url, front, answered), daemon=True)
        watcher.start()
        try:
            front.proc.wait(timeout=STOP_WITHIN_S)
            exited = True
        except subprocess.TimeoutExpired:
            exited = False
            os.kill(front.pid, signal.SIGKILL)  # as a supervisor whose stop timeout ran out would
            front.proc.wait(timeout=10)
        took = time.monotonic() - t0
        watcher.join(timeout=5)
        time.sleep(3.0)  # a child told to end by its parent's death (PR_SET_PDEATHSIG) gets a moment to do so
        left = _deployment_processes(sessions, front_logs)
        assert exited, f"the front did not exit within {STOP_WITHIN_S} s of SIGTERM; left behind: {left}\n" \
                       f"{front.log_tail()}"
        assert not left, f"processes of the deployment outlived its front (exited after {took:.1f} s): {left}\n" \
                         f"{front.log_tail()}"
        assert not answered.is_set(), f"the front's stop waited {took:.1f} s for the replacement to load"
    finally:
        front.stop(grace_s=5)
        for pid in _deployment_processes(sessions, front_logs):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _instances(url: str) -> list[dict]:
    return requests.get(url + "/prorsa/instances", timeout=10).json()["instances"]


def _instance_pids(url: str) -> dict[str, int]:
    return {i["instance"]: i["pid"] for i in _instances(url)}


def _instance_port(url: str, iid: str) -> int:
    return int(next(i["url"] for i in _instances(url) if i["instance"] == iid).rsplit(":", 1)[1])


def _wait_for_new_pid(url: str, iid: str, old_pid: int) -> int:
    deadline = time.monotonic() + RESTART_SEEN_WITHIN_S
    while time.monotonic() < deadline:
        pid = _instance_pids(url).get(iid)
        if pid and pid != old_pid:
            return pid
        time.sleep(0.1)
    raise AssertionError(f"the front did not restart instance {iid} within {RESTART_SEEN_WITHIN_S} s")


def _watch(url: str, front: processes.ServerProcess, answered: threading.Event) -> None:
    while front.alive() and not answered.is_set():
        if _answers(url):
            answered.set()
        time.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _alive(pid: int) -> bool:
    return pid in _live_pids()


def _live_pids() -> dict[int, tuple[int, int]]:
    """pid -> (process group, session) of every process that is not a zombie."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        if fields[0] != "Z":
            out[int(entry.name)] = (int(fields[2]), int(fields[3]))
    return out


def _deployment_processes(sessions: set[int], logs: Path) -> dict[int, str]:
    """Live processes in one of ``sessions`` (as session or process group), or naming ``logs`` on their command line:
    pid -> command line."""
    me = os.getpid()
    found = {}
    for pid, (pgrp, sid) in _live_pids().items():
        if pid == me:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if sid in sessions or pgrp in sessions or str(logs) in cmdline:
            found[pid] = cmdline.strip()[:300]
    return found
