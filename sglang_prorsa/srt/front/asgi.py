"""The front's ASGI entry: generation requests go straight to the relay, everything else through the FastAPI app.

Why: the relay is the front's hot path, and on a host whose cores the instances keep busy its CPU per request is
its latency. FastAPI's stack around a route (error, telemetry, body-limit, exit-stack and exception middleware, route
matching) was ~10 % of the front's CPU per relayed 1-token request (py-spy, 2 cores, 16 concurrent), for nothing the
relay uses: it reads the body itself and answers its own errors. Only without API keys: with keys, SGLang's key
middleware on the app must see every request (``auth.py``), so everything goes through the app.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from sglang_prorsa.srt.common.messages import Code
from sglang_prorsa.srt.front.relay import Relay

logger = logging.getLogger(__name__)


class GenerationFastPath:
    def __init__(self, app: Any, relay: Relay, paths: tuple[str, ...]) -> None:
        self.app = app
        self.relay = relay
        self.paths = frozenset(paths)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        try:
            response = await self.relay.handle(Request(scope, receive))
        except Exception:  # what FastAPI's error middleware did on this path: a 500 the caller can read, and a log
            logger.exception("relaying %s failed", scope["path"])
            self.relay.stats["failed"] += 1
            response = JSONResponse({"error": "the front failed to relay this request (see its log)",
                                     "code": Code.UPSTREAM.value}, status_code=500)
        await response(scope, receive, send)
