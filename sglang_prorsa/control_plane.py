"""Standalone Prorsa control plane: the lifecycle and forecast routes with no engine behind them.

    python -m sglang_prorsa.control_plane --host 127.0.0.1 --port 30100 [--clock wall|trace]

For trainers' dry runs, trace replay (engine events posted over HTTP) and tests. ``--clock trace`` replays a trace
faster than real time: the clock is the trace's (each event's ``ts``, each ``GET /prorsa/forecast?at=``), every
window closes at its scheduled end on the way, no background refresher runs, and ``POST /lifecycle/reset`` starts a
new replay (nothing tracked or learned kept, the configuration kept). The SGLang server mounts the same
router (``make_router``). The API has no authentication, so it binds to loopback unless ``--allow-remote`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from fastapi import FastAPI

from sglang_prorsa.policy.clock import TraceClock, WallClock
from sglang_prorsa.policy.control_plane import REFRESH_INTERVAL_S, LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.srt.common.auth import mount
from sglang_prorsa.srt.common.http_utils import SERVER_KEEPALIVE_S
from sglang_prorsa.srt.lifecycle_routes import make_router

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
TICK_INTERVAL_S = REFRESH_INTERVAL_S  # refresh lag bound: windows close within this of their scheduled end

logger = logging.getLogger("sglang_prorsa.control_plane")


def build_app(control_plane: LifecycleControlPlane | None = None) -> FastAPI:
    control_plane = control_plane or LifecycleControlPlane()

    replay = isinstance(control_plane.clock, TraceClock)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # A background thread closes accuracy windows on time and keeps a fresh forecast ready, off the event loop
        # (on a trace clock, time moves only with the replay: windows close as it moves).
        if not replay:
            control_plane.start(TICK_INTERVAL_S)
        try:
            yield
        finally:
            control_plane.stop()

    app = FastAPI(title="sglang-prorsa control plane", lifespan=lifespan)
    mount(app, make_router(control_plane))
    app.state.control_plane = control_plane

    if replay:
        @app.post("/lifecycle/reset")
        async def reset() -> dict:
            await asyncio.to_thread(control_plane.reset)  # waits for the lock a forecast may hold
            return {"ok": True, "horizon_s": control_plane.config.horizon_s}

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30100)
    parser.add_argument("--allow-remote", action="store_true", help="permit a non-loopback --host (no auth!)")
    # Here the forecast is S's only consumer (no allocation, no control loop), so POST /lifecycle/config may still
    # move it; a server built by the launcher fixes it at --prorsa-horizon (srt/lifecycle_routes.control_plane_for).
    parser.add_argument("--horizon", type=float, default=DEFAULT_HORIZON_S,
                        help=f"forecast horizon S in seconds (Appendix B; default: {DEFAULT_HORIZON_S:g})")
    parser.add_argument("--clock", choices=("wall", "trace"), default="wall",
                        help="wall: a live control plane; trace: time follows the posted events' ts and ?at= "
                             "(replay a trace faster than real time; POST /lifecycle/reset starts over)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if not (args.horizon > 0):
        parser.error(f"--horizon must be > 0, got {args.horizon}")
    if args.host not in LOOPBACK_HOSTS and not args.allow_remote:
        parser.error(f"--host {args.host} is not loopback; the API is unauthenticated (pass --allow-remote to insist)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import uvicorn

    logging.basicConfig(level=args.log_level.upper())
    clock = TraceClock() if args.clock == "trace" else WallClock()
    app = build_app(LifecycleControlPlane(clock, config=PredictorConfig(horizon_s=args.horizon)))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_keep_alive=SERVER_KEEPALIVE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
