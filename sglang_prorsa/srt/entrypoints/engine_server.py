"""One engine instance: SGLang's HTTP server and schedulers, with our overrides, switch routes and lifecycle routes."""

from __future__ import annotations

import logging
import os
import threading

from fastapi import APIRouter

from sglang_prorsa import __version__
from sglang_prorsa.srt.overrides import REGISTRY, SGLANG_VERSION, apply_overrides
from sglang_prorsa.srt.server_flags import ProrsaFlags

logger = logging.getLogger("sglang_prorsa.launch")


def info_router() -> APIRouter:
    router = APIRouter()

    @router.get("/prorsa/info")
    def prorsa_info() -> dict:
        return {"sglang_prorsa": __version__, "sglang": SGLANG_VERSION, "overrides": REGISTRY.describe()}

    return router


def start_ticker(tick, interval_s: float = 0.25) -> threading.Event:
    """Refresh the forecast windows in the background (the control plane is thread-safe)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                tick()
            except Exception:  # a failed refresh must not kill the server; it is retried next tick
                logger.exception("lifecycle tick failed")

    threading.Thread(target=loop, name="prorsa-lifecycle-tick", daemon=True).start()
    return stop


def run_engine_server(flags: ProrsaFlags, sglang_argv: list[str]) -> None:
    from sglang.srt.entrypoints import http_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from sglang_prorsa.srt.disaggregation import kv_persist
    from sglang_prorsa.srt.entrypoints.engine_routes import (
        EngineSwitchState,
        install_admission_gate,
        make_engine_router,
    )
    from sglang_prorsa.srt.entrypoints.lifecycle_api import make_router
    from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane
    from sglang_prorsa.srt.managers.scheduler_process import run_scheduler_process
    from sglang_prorsa.srt.role_switch.control_channel import ENV_ADDRESS, ControlClient, new_address

    apply_overrides()
    server_args = prepare_server_args(sglang_argv)
    # Inherited by the spawned scheduler, which binds it (see role_switch/scheduler_mixin.py).
    address = os.environ.setdefault(ENV_ADDRESS, new_address())
    os.environ.setdefault(kv_persist.ENV_STORE, flags.prorsa_kv_store)
    if flags.prorsa_kv_store_path:
        os.environ.setdefault(kv_persist.ENV_STORE_PATH, flags.prorsa_kv_store_path)
    if flags.prorsa_mooncake_master:
        os.environ.setdefault(kv_persist.ENV_MOONCAKE_MASTER, flags.prorsa_mooncake_master)
    if os.environ[kv_persist.ENV_STORE] == "mooncake" and not os.environ.get(kv_persist.ENV_MOONCAKE_MASTER):
        raise SystemExit("--prorsa-kv-store mooncake needs --prorsa-mooncake-master HOST:PORT "
                         "(the adaptive front starts a master itself)")
    state = EngineSwitchState(ControlClient(address), f"http://{server_args.host}:{server_args.port}",
                              cpu=os.environ.get("SGLANG_PRORSA_NO_CUDA") == "1")
    control_plane = LifecycleControlPlane()
    app = http_server.app
    app.include_router(info_router())
    app.include_router(make_engine_router(state))
    app.include_router(make_router(control_plane))
    install_admission_gate(app, state)
    stop = start_ticker(control_plane.tick)
    try:
        http_server.launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    finally:
        stop.set()
        kill_process_tree(os.getpid(), include_parent=False)
