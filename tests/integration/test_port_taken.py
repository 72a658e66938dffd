"""An engine instance whose HTTP port another process bound first exits at once with ``PORT_TAKEN_EXIT`` (the front
that started it starts it again on fresh ports: tests/unit/controller/test_launcher_ports.py), instead of living on
with SGLang's warm-up thread waiting for a server that never answers."""

from __future__ import annotations

import socket

from tests_support import ENGINE_FLAGS

from sglang_prorsa.srt.common.messages import PORT_TAKEN_EXIT
from sglang_prorsa.srt.utils import processes


def test_an_instance_whose_port_is_taken_exits_with_port_taken(tiny_model, log_dir):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((processes.LOOPBACK, 0))
        holder.listen()
        port = holder.getsockname()[1]
        srv = processes.start(["--host", processes.LOOPBACK, "--port", str(port), *ENGINE_FLAGS],
                              name=f"port-taken-{port}", port=port, log_dir=log_dir)
        try:
            rc = srv.proc.wait(timeout=300)  # checked before SGLang is imported: seconds, not a model load
        finally:
            srv.stop(grace_s=2.0)
    assert rc == PORT_TAKEN_EXIT, srv.log_tail()
    assert f"port {port} is bound by another process" in srv.log_tail(), srv.log_tail()
