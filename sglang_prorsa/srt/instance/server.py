"""One engine instance: SGLang's own HTTP server, tokenizer manager and schedulers, with our extensions.

``run_instance(spec)`` builds SGLang's server arguments from the user's SGLang flags plus the typed fields of the
spec (port, role, bootstrap port), hands the scheduler its runtime whole (``scheduler/process.py``), installs the
engine extension (``EngineSide``) when SGLang creates the tokenizer manager, mounts our routes, and -- for an
instance under a controller -- registers with it once it serves. A single server (no controller) also mounts the
lifecycle routes with its own control plane; an instance under a controller runs none (its events go there).
"""

from __future__ import annotations

import copy
import errno
import functools
import json
import logging
import os
import socket
import threading
import time

from sglang_prorsa import __version__
from sglang_prorsa.config import InstanceSpec, ProrsaConfig
from sglang_prorsa.srt.common.auth import AuthKeys, mark_admin_routes, mount
from sglang_prorsa.srt.common.messages import PORT_TAKEN_EXIT
from sglang_prorsa.srt.disaggregation.kv_persist import KVStoreConfig

logger = logging.getLogger("sglang_prorsa.instance")

REGISTER_EVERY_S = 5.0  # heartbeat: a controller that restarted learns of us again


def kv_store_config(config: ProrsaConfig) -> KVStoreConfig:
    return KVStoreConfig(kind=config.prorsa_kv_store, path=config.prorsa_kv_store_path,
                         mooncake_master=config.prorsa_mooncake_master)


def server_args_for(spec: InstanceSpec, base=None):
    """SGLang's record from the user's flags (or a copy of ``base``, a ``ServerArgs`` a framework built itself:
    ``sglang_prorsa.launch_server.launch_server``), then the fields the spec decides (never shadowed by a user flag).
    ``base`` is copied, not changed: the caller may still read it (slime reads ``url()`` and ``api_key``)."""
    if base is not None:
        args = copy.copy(base)
    else:
        from sglang.srt.server_args import prepare_server_args

        args = prepare_server_args(list(spec.sglang_argv))
    args.host, args.port = spec.host, spec.port
    if spec.role in ("prefill", "decode"):
        args.disaggregation_mode = spec.role
        if spec.bootstrap_port is not None:
            args.disaggregation_bootstrap_port = spec.bootstrap_port
        if args.disaggregation_transfer_backend in (None, "", "fake"):
            args.disaggregation_transfer_backend = "mooncake"
    if spec.switchable:
        args.enable_pd_role_switch = True
        # SGLang decides at start-up whether an instance has a prefix cache, and a decode instance has none by
        # default; one that later switches to prefill would then recompute every resumed prefix.
        args.disaggregation_decode_enable_radix_cache = True
    return args


def run_instance(spec: InstanceSpec, server_args=None) -> None:
    """Serve ``spec`` until the server ends; ``server_args``: SGLang's record to start from instead of parsing
    ``spec.sglang_argv`` (see ``server_args_for``)."""
    exit_if_port_taken(spec.host, spec.port)  # before importing SGLang and loading the model, not a minute later
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.engine import init_tokenizer_manager as sglang_init_tokenizer_manager
    from sglang.srt.utils import kill_process_tree

    from sglang_prorsa.srt.common import sglang_internals
    from sglang_prorsa.srt.common.channel import ChannelAddresses, EngineChannel
    from sglang_prorsa.srt.engine import hooks
    from sglang_prorsa.srt.engine.middleware import EngineMiddleware
    from sglang_prorsa.srt.engine.routes import make_engine_router
    from sglang_prorsa.srt.engine.side import EngineSide
    from sglang_prorsa.srt.instance.overrides import REGISTRY, SGLANG_VERSION, apply_overrides
    from sglang_prorsa.srt.instance.scheduler_process import run_scheduler_process
    from sglang_prorsa.srt.scheduler.extension import SchedulerRuntime

    apply_overrides()
    logging.getLogger("uvicorn.error").addFilter(ExitWhenPortTaken(spec.port))
    server_args = server_args_for(spec, server_args)
    # SGLang sets the root level from --log-level; our switch and resume events stay visible at INFO (a few lines
    # per switch, none per request).
    logging.getLogger("sglang_prorsa").setLevel(logging.INFO)
    addresses = ChannelAddresses.fresh()
    runtime = SchedulerRuntime(instance_id=spec.instance_id, channel=addresses,
                               kv_store=kv_store_config(spec.prorsa),
                               cpu_threads=spec.cpu_threads if str(server_args.device) == "cpu" else 0,
                               crash_on_tokens=spec.prorsa.crash_marker)
    keys = AuthKeys.of(server_args)
    side = EngineSide(spec, EngineChannel(addresses), tokenizer_manager=None, keys=keys)
    hooks.ENGINE = side

    def init_tokenizer_manager(*args, **kwargs):
        tm, templates = sglang_init_tokenizer_manager(*args, **kwargs)
        # The declared attributes were checked on the class at start-up; this confirms them on the live object.
        sglang_internals.check_instance(tm, "sglang.srt.managers.tokenizer_manager:TokenizerManager")
        side.tm = tm
        return tm, templates

    app = http_server.app
    mount(app, make_engine_router(side, cpu=str(server_args.device) == "cpu"))

    @app.get("/prorsa/info")
    def prorsa_info() -> dict:
        return {"sglang_prorsa": __version__, "sglang": SGLANG_VERSION, "instance": spec.instance_id,
                "controller": spec.controller_url or None, "events_to": side.events.url or None,
                "overrides": REGISTRY.describe()}

    if not spec.controller_url:
        control_plane = mount_lifecycle(app, spec.prorsa)
        side.events.local = lambda events: control_plane.ingest_payload({"events": events})
    app.add_middleware(EngineMiddleware, side=side, cpu=str(server_args.device) == "cpu")

    def on_serving() -> None:  # SGLang calls this from its warm-up thread once the server answers
        if spec.controller_url:
            threading.Thread(target=_register_forever, args=(spec, lambda: side.role, keys), name="prorsa-register",
                             daemon=True).start()

    try:
        http_server.launch_server(server_args, init_tokenizer_manager_func=init_tokenizer_manager,
                                  run_scheduler_process_func=functools.partial(run_scheduler_process, runtime),
                                  launch_callback=on_serving)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def mount_lifecycle(app, config: ProrsaConfig):
    """A single server's own lifecycle control plane (no controller), its routes mounted on ``app``: S from
    ``--prorsa-horizon`` (``control_plane_for``), refreshed in its own thread (a daemon: it ends with the server)."""
    from sglang_prorsa.srt.lifecycle_routes import control_plane_for, make_router

    control_plane = control_plane_for(config)
    control_plane.start()
    mount(app, make_router(control_plane))
    mark_admin_routes(app, {("POST", "/lifecycle/config")})
    return control_plane


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


def registration(spec: InstanceSpec, role: str) -> dict:
    host = spec.url.split("://", 1)[1].rsplit(":", 1)[0]
    return {"instance_id": spec.instance_id, "url": spec.url, "role": role,
            "bootstrap_port": spec.bootstrap_port, "bootstrap_host": host}


def _register_forever(spec: InstanceSpec, current_role, keys: AuthKeys) -> None:
    import requests

    logged = False
    while True:
        body = json.dumps(registration(spec, current_role()))
        try:
            r = requests.post(spec.controller_url.rstrip("/") + "/prorsa/register", data=body, timeout=10,
                              headers={"Content-Type": "application/json", **keys.admin_headers()})
            if r.status_code == 200 and not logged:
                logger.info("registered with the controller at %s as %s", spec.controller_url, spec.instance_id)
                logged = True
            elif r.status_code != 200:
                logger.warning("controller refused registration (%s): %s", r.status_code, r.text[:500])
        except requests.RequestException as e:
            logger.warning("controller at %s unreachable: %s", spec.controller_url, e)
            logged = False
        time.sleep(REGISTER_EVERY_S)
