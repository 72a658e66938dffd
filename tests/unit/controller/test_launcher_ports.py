"""A front's instance whose port another process bound first starts again on fresh ports (controller/launcher.py).

The instances here are stand-ins for the retry logic alone; that a real engine instance exits with
``PORT_TAKEN_EXIT`` when its port is taken is tests/integration/test_port_taken.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_prorsa.config import InstanceSpec, ProrsaConfig
from sglang_prorsa.srt.common.messages import PORT_TAKEN_EXIT
from sglang_prorsa.srt.controller import launcher


class StandIn:
    """A started instance process as ``ready_instance`` sees it: ready, or exited with ``returncode``."""

    def __init__(self, spec: InstanceSpec, returncode: int | None) -> None:
        self.spec, self.name, self.pid = spec, f"instance-{spec.instance_id}", 1000 + spec.port % 1000
        self.proc = SimpleNamespace(returncode=returncode)

    def wait_ready(self, timeout: float) -> float:
        if self.proc.returncode is not None:
            raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}")
        return 1.0


def spec(port: int = 4000, bootstrap: int | None = 5000) -> InstanceSpec:
    return InstanceSpec("0", "127.0.0.1", port, "prefill", bootstrap, (), ProrsaConfig(pd_adaptive=True),
                        switchable=True)


def test_a_taken_port_starts_the_instance_again_on_fresh_ports(monkeypatch, tmp_path):
    outcomes = [PORT_TAKEN_EXIT, PORT_TAKEN_EXIT, None]  # two retries, then it serves
    starts = []

    def start_instance(sp, log_dir, attempt=0):
        starts.append((sp, attempt))
        return StandIn(sp, outcomes[len(starts)])

    monkeypatch.setattr(launcher, "start_instance", start_instance)
    first = spec()
    started = {"0": StandIn(first, outcomes[0])}
    final, srv = launcher.ready_instance(first, started["0"], tmp_path, started)
    assert [a for _, a in starts] == [1, 2]
    assert final is starts[-1][0] and started["0"] is srv and srv.spec is final
    assert final.port != first.port and final.bootstrap_port not in (None, first.bootstrap_port)
    assert (final.instance_id, final.role, final.switchable) == ("0", "prefill", True)


def test_a_colocated_instance_keeps_having_no_bootstrap_port(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "start_instance", lambda sp, log_dir, attempt=0: StandIn(sp, None))
    first = spec(bootstrap=None)
    started = {"0": StandIn(first, PORT_TAKEN_EXIT)}
    final, _ = launcher.ready_instance(first, started["0"], tmp_path, started)
    assert final.bootstrap_port is None and final.port != first.port


@pytest.mark.parametrize("returncode", [1, -9])
def test_any_other_exit_fails_the_start(monkeypatch, tmp_path, returncode):
    monkeypatch.setattr(launcher, "start_instance", lambda *a, **k: pytest.fail("restarted a failed instance"))
    first = spec()
    started = {"0": StandIn(first, returncode)}
    with pytest.raises(RuntimeError, match=f"exited with {returncode}"):
        launcher.ready_instance(first, started["0"], tmp_path, started)


def test_the_retries_are_bounded(monkeypatch, tmp_path):
    starts = []
    monkeypatch.setattr(launcher, "start_instance",
                        lambda sp, log_dir, attempt=0: starts.append(attempt) or StandIn(sp, PORT_TAKEN_EXIT))
    first = spec()
    started = {"0": StandIn(first, PORT_TAKEN_EXIT)}
    with pytest.raises(RuntimeError, match=f"exited with {PORT_TAKEN_EXIT}"):
        launcher.ready_instance(first, started["0"], tmp_path, started)
    assert starts == list(range(1, launcher.PORT_RETRIES + 1))
