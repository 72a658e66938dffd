"""Standalone Prorsa control plane: the lifecycle and forecast routes with no engine behind them.

    python -m sglang_prorsa.control_plane --host 127.0.0.1 --port 30100

For trainers' dry runs, trace replay (engine events posted over HTTP) and tests. The SGLang server mounts the same
router (``make_router``). The API has no authentication, so it binds to loopback unless ``--allow-remote`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from fastapi import FastAPI

from sglang_prorsa.srt.entrypoints.lifecycle_api import make_router
from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
TICK_INTERVAL_S = 0.25  # refresh lag bound: windows close within this of their scheduled end

logger = logging.getLogger("sglang_prorsa.control_plane")


def build_app(control_plane: LifecycleControlPlane | None = None) -> FastAPI:
    control_plane = control_plane or LifecycleControlPlane()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Refresh every S even when no request comes in, so accuracy windows are closed on time.
        async def ticker() -> None:
            while True:
                control_plane.tick()
                await asyncio.sleep(TICK_INTERVAL_S)

        task = asyncio.create_task(ticker())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="sglang-prorsa control plane", lifespan=lifespan)
    app.include_router(make_router(control_plane))
    app.state.control_plane = control_plane

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30100)
    parser.add_argument("--allow-remote", action="store_true", help="permit a non-loopback --host (no auth!)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if args.host not in LOOPBACK_HOSTS and not args.allow_remote:
        parser.error(f"--host {args.host} is not loopback; the API is unauthenticated (pass --allow-remote to insist)")

    import uvicorn

    logging.basicConfig(level=args.log_level.upper())
    uvicorn.run(build_app(), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
