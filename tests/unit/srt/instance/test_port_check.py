"""An instance checks its HTTP port before SGLang loads the model (srt/instance/server.py)."""

from __future__ import annotations

import errno
import socket

from sglang_prorsa.srt.instance.server import port_taken


def test_a_listening_port_is_taken_and_a_released_one_is_free():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = port_taken("127.0.0.1", port)
        assert taken is not None and taken.errno == errno.EADDRINUSE
    assert port_taken("127.0.0.1", port) is None  # closed: free again (SO_REUSEADDR, as uvicorn binds)


def test_a_port_with_a_connection_left_in_time_wait_is_free():
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
        client.close()
    assert port_taken("127.0.0.1", port) is None
