"""The engine extension installed into one instance's main process, however SGLang is started there.

``install(spec, server_args, app)`` does what every way of starting an instance shares: it applies the registered
overrides (``overrides.py``), fixes SGLang's record for the spec (``server_args_for``), builds the scheduler's runtime
and the ``EngineSide``, and mounts our routes and middleware on ``app`` -- SGLang's own FastAPI app, which the HTTP
server (``server.run_instance``) or a framework's own uvicorn (verl, AReaL: ``sglang_prorsa.engine.Engine``)
serves. The result wraps SGLang's two process hooks, composing with the caller's: the tokenizer-manager factory (the engine side learns
the tokenizer manager it makes) and the scheduler-process entry (our overrides and runtime in the scheduler process,
then the caller's entry, SGLang's by default).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from sglang_prorsa import __version__
from sglang_prorsa.config import ADDRESS_VARIABLES, InstanceSpec, ProrsaConfig
from sglang_prorsa.srt.common.auth import AuthKeys, mark_admin_routes, mount
from sglang_prorsa.srt.common.parallel import dp_ranks, replicas
from sglang_prorsa.srt.disaggregation.kv_persist import KVStoreConfig

logger = logging.getLogger("sglang_prorsa.instance")

REGISTER_EVERY_S = 5.0  # heartbeat: a controller that restarted learns of us again


def kv_store_config(spec: InstanceSpec) -> KVStoreConfig:
    """Where this instance's switched requests' KV goes; its Mooncake client advertises the instance's own address."""
    config = spec.prorsa
    return KVStoreConfig(kind=config.prorsa_kv_store, path=config.prorsa_kv_store_path,
                         mooncake_master=config.prorsa_mooncake_master, local_hostname=spec.advertise_host)


def server_args_for(spec: InstanceSpec, base=None):
    """SGLang's record from the user's flags (or a copy of ``base``, a ``ServerArgs`` a framework built itself:
    ``sglang_prorsa.launch_server.launch_server``, ``sglang_prorsa.engine.Engine``), then the fields the spec decides
    (never shadowed by a user flag). ``base`` is copied, not changed: the caller may still read it (slime reads ``url()``
    and ``api_key``)."""
    import copy

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


@dataclass
class Installed:
    """The extension in this process: SGLang's record as the instance runs it, the engine side, the scheduler's
    runtime (pickled into each scheduler process with the entry)."""

    spec: InstanceSpec
    server_args: Any
    side: Any  # EngineSide
    runtime: Any  # SchedulerRuntime
    keys: AuthKeys

    def tokenizer_manager_factory(self, inner: Callable | None = None) -> Callable:
        """SGLang's ``init_tokenizer_manager_func`` (``inner``, SGLang's own by default) that also hands the engine
        side the tokenizer manager it made."""
        from sglang.srt.entrypoints.engine import init_tokenizer_manager

        from sglang_prorsa.srt.common import sglang_internals

        make = inner or init_tokenizer_manager
        side = self.side

        def init_tokenizer_manager_with_extension(*args, **kwargs):
            tm, templates = make(*args, **kwargs)
            # The declared attributes were checked on the class at start-up; this confirms them on the live object.
            sglang_internals.check_instance(tm, "sglang.srt.managers.tokenizer_manager:TokenizerManager")
            side.tm = tm
            return tm, templates

        return init_tokenizer_manager_with_extension

    def scheduler_process_entry(self, inner: Callable | None = None) -> Callable:
        """SGLang's ``run_scheduler_process_func``: ours first, then ``inner`` (SGLang's by default; a framework's
        own entry, such as AReaL's, composes instead of being replaced). Picklable: SGLang spawns schedulers."""
        from sglang_prorsa.srt.instance.scheduler_process import run_scheduler_process

        return functools.partial(run_scheduler_process, self.runtime, inner=inner)

    def register_forever(self, wait_until_serving: bool = False) -> None:
        """Register with the spec's controller and heartbeat, in a daemon thread; ``wait_until_serving``: first wait
        for this instance's own ``/health`` (an in-process engine served by a framework's own HTTP server)."""
        if not self.spec.controller_url:
            return
        from sglang_prorsa.srt.common.gpus import instance_gpus

        gpus = instance_gpus(self.server_args) if str(self.server_args.device) != "cpu" else 1
        side = self.side

        def current() -> tuple[str, bool, int]:
            return side.role, side.switch is not None, side.switches

        threading.Thread(target=_register_forever, args=(self.spec, current, self.keys, gpus, wait_until_serving),
                         name="prorsa-register", daemon=True).start()


def install(spec: InstanceSpec, server_args, app) -> Installed:
    """The extension for ``spec`` installed on SGLang's ``app`` (see the module docstring). Once per process: the
    tokenizer manager's hooks reach the one engine side through ``hooks.ENGINE``."""
    from sglang_prorsa.srt.common.channel import ChannelAddresses, EngineChannels
    from sglang_prorsa.srt.engine import hooks
    from sglang_prorsa.srt.engine.middleware import EngineMiddleware
    from sglang_prorsa.srt.engine.routes import make_engine_router
    from sglang_prorsa.srt.engine.side import EngineSide
    from sglang_prorsa.srt.instance.overrides import REGISTRY, SGLANG_VERSION, apply_overrides
    from sglang_prorsa.srt.scheduler.extension import SchedulerRuntime

    if hooks.ENGINE is not None:
        raise RuntimeError("prorsa: the engine extension is already installed in this process (one instance each)")
    apply_overrides()
    server_args = server_args_for(spec, server_args)
    # SGLang sets the root level from --log-level; our switch and resume events stay visible at INFO (a few lines
    # per switch, none per request).
    logging.getLogger("sglang_prorsa").setLevel(logging.INFO)
    cpu = str(server_args.device) == "cpu"
    if cpu:  # read by the scheduler processes SGLang spawns next (they inherit this environment)
        from sglang_prorsa.srt import cpu_recipe

        for name, value in cpu_recipe.parallel_environment(int(server_args.tp_size or 1), replicas(server_args),
                                                           dict(os.environ)).items():
            logger.info("CPU recipe: %s=%s (tensor/data parallel ranks on CPU)", name, value)
            os.environ[name] = value
    addresses = ChannelAddresses.fresh()
    runtime = SchedulerRuntime(instance_id=spec.instance_id, channel=addresses,
                               kv_store=kv_store_config(spec), cpu_threads=spec.cpu_threads if cpu else 0,
                               crash_on_tokens=spec.prorsa.crash_marker)
    keys = AuthKeys.of(server_args)
    # With data parallelism (replicas or attention-DP groups) each DP rank's scheduler group binds its own channel (its DP rank and size reach the
    # scheduler process through SGLang's spawn arguments: scheduler_process.py); the engine side talks to all.
    channels = EngineChannels.connect(addresses, dp_ranks(server_args))
    side = EngineSide(spec, channels, tokenizer_manager=None, keys=keys)
    hooks.ENGINE = side
    mount(app, make_engine_router(side, cpu=cpu))

    @app.get("/prorsa/info")
    def prorsa_info() -> dict:
        return {"sglang_prorsa": __version__, "sglang": SGLANG_VERSION, "instance": spec.instance_id,
                "controller": spec.controller_url or None, "events_to": side.events.url or None,
                "advertised": advertised(spec, runtime.kv_store), "overrides": REGISTRY.describe()}

    if not spec.controller_url:
        # No controller named (a single server, or a worker that will be registered by POST /workers and then learns
        # its controller from the peer push): its own lifecycle control plane until then.
        control_plane = mount_lifecycle(app, spec.prorsa)
        side.events.local = lambda events: control_plane.ingest_payload({"events": events})
    app.add_middleware(EngineMiddleware, side=side, cpu=cpu)
    return Installed(spec=spec, server_args=server_args, side=side, runtime=runtime, keys=keys)


def advertised(spec: InstanceSpec, store: KVStoreConfig) -> dict:
    """What this instance tells other hosts about where to reach it: its URL, its PD bootstrap address, its Mooncake
    Store client's address, and the address SGLang's KV transfer and Mooncake's transfer engine were handed
    (``launch_server.address_environment``; shown as this process has it, for an operator to check)."""
    return {"host": spec.advertise_host, "url": spec.url,
            "bootstrap": f"{spec.advertise_host}:{spec.bootstrap_port}" if spec.bootstrap_port else None,
            "kv_store_client": store.local_hostname if store.kind == "mooncake" else None,
            "transfer": {name: os.environ.get(name) for name in ADDRESS_VARIABLES}}


def mount_lifecycle(app, config: ProrsaConfig):
    """A single server's own lifecycle control plane (no controller), its routes mounted on ``app``: S from
    ``--prorsa-horizon`` (``control_plane_for``), refreshed in its own thread (a daemon: it ends with the server)."""
    from sglang_prorsa.srt.lifecycle_routes import control_plane_for, make_router

    control_plane = control_plane_for(config)
    control_plane.start()
    mount(app, make_router(control_plane))
    mark_admin_routes(app, {("POST", "/lifecycle/config")})
    return control_plane


def registration(spec: InstanceSpec, role: str, gpus: int = 1, switching: bool = False, switches: int = 0) -> dict:
    """What an instance registers: its id, URL, role, PD bootstrap address and the GPUs it occupies (Eq. 1's G), and
    whether a switch of its own is running and how many it has completed (a restarted controller learns the roles
    as they are: ``Registry.register``)."""
    host = spec.url.split("://", 1)[1].rsplit(":", 1)[0]
    return {"instance_id": spec.instance_id, "url": spec.url, "role": role,
            "bootstrap_port": spec.bootstrap_port, "bootstrap_host": host, "gpus": gpus,
            "switching": switching, "switches": switches}


def _wait_serving(spec: InstanceSpec) -> None:
    import requests

    while True:
        try:
            if requests.get(spec.url + "/health", timeout=10).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)


def _register_forever(spec: InstanceSpec, current: Callable[[], tuple[str, bool, int]], keys: AuthKeys, gpus: int = 1,
                      wait_until_serving: bool = False) -> None:
    """Register, then heartbeat every ``REGISTER_EVERY_S`` for good: a controller that restarted (or was down) learns
    of this instance again within one period. ``current()``: (role, switching, switches completed)."""
    import requests

    if wait_until_serving:
        _wait_serving(spec)
    logged = False
    while True:
        role, switching, switches = current()
        body = json.dumps(registration(spec, role, gpus, switching, switches))
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
