"""One engine instance served by SGLang's own HTTP server, with our extension (``install.py``).

``run_instance(spec)`` checks the port first, installs the extension on SGLang's app (routes, middleware, the engine
side, the scheduler's runtime), then runs SGLang's ``launch_server`` with the extension's two process hooks; an
instance under a controller registers with it once it serves. A framework that starts SGLang its own way uses
``sglang_prorsa.engine.Engine`` instead.
"""

from __future__ import annotations

import errno
import logging
import os
import socket

from sglang_prorsa.config import InstanceSpec
from sglang_prorsa.srt.common.messages import PORT_TAKEN_EXIT

logger = logging.getLogger("sglang_prorsa.instance")


def run_instance(spec: InstanceSpec, server_args=None) -> None:
    """Serve ``spec`` until the server ends; ``server_args``: SGLang's record to start from instead of parsing
    ``spec.sglang_argv`` (``install.server_args_for``)."""
    exit_if_port_taken(spec.host, spec.port)  # before importing SGLang and loading the model, not a minute later
    from sglang.srt.entrypoints import http_server
    from sglang.srt.utils import kill_process_tree

    from sglang_prorsa.srt.instance.install import install

    logging.getLogger("uvicorn.error").addFilter(ExitWhenPortTaken(spec.port))
    installed = install(spec, server_args, http_server.app)
    try:
        http_server.launch_server(installed.server_args,
                                  init_tokenizer_manager_func=installed.tokenizer_manager_factory(),
                                  run_scheduler_process_func=installed.scheduler_process_entry(),
                                  launch_callback=installed.register_forever)  # from SGLang's warm-up thread
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def port_taken(host: str, port: int) -> OSError | None:
    """The error binding ``host:port`` would raise now, as uvicorn binds it (SO_REUSEADDR: a port left in TIME_WAIT
    is free), or None when it is free."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return e
            raise
    return None


def exit_if_port_taken(host: str, port: int) -> None:
    """Ends this instance with ``PORT_TAKEN_EXIT`` if its HTTP port is already bound, before SGLang loads the model.
    A process that binds it later is caught by ``ExitWhenPortTaken``."""
    taken = port_taken(host, port)
    if taken is not None:
        logger.error("port %d is bound by another process (%s): exiting with %d", port, taken, PORT_TAKEN_EXIT)
        logging.shutdown()
        os._exit(PORT_TAKEN_EXIT)


class ExitWhenPortTaken(logging.Filter):
    """Ends this instance with ``PORT_TAKEN_EXIT`` the moment uvicorn reports that another process holds its port.

    The port was free when the front chose it, but another process may bind it first. uvicorn then logs the OSError
    and shuts the lifespan down, which joins SGLang's warm-up thread -- and that thread polls the port for up to
    120 x 6 s (``http_server._execute_server_warmup``, SGLang 0.5.23), so the instance would live on without
    serving. Exiting here lets the front start it again on fresh ports at once (``controller/launcher.py``)."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.msg
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            from sglang.srt.utils import kill_process_tree

            logger.error("port %d is bound by another process (%s): exiting with %d", self.port, exc, PORT_TAKEN_EXIT)
            kill_process_tree(os.getpid(), include_parent=False)
            logging.shutdown()
            os._exit(PORT_TAKEN_EXIT)
        return True
