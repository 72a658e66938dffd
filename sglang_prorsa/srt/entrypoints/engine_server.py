"""One engine instance: SGLang's HTTP server and schedulers, with our overrides and routes."""

from __future__ import annotations

import logging
import os

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


def run_engine_server(flags: ProrsaFlags, sglang_argv: list[str]) -> None:
    from sglang.srt.entrypoints import http_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from sglang_prorsa.srt.managers.scheduler_process import run_scheduler_process

    apply_overrides()
    server_args = prepare_server_args(sglang_argv)
    http_server.app.include_router(info_router())
    try:
        http_server.launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
