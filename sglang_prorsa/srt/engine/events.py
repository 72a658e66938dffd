"""The engine side of the lifecycle (paper §4.1.1): ready / prefill / decode transitions of requests that carry a
trajectory id, batched and sent to the controller's tracker in the background (never on a request's path).

The instance that holds the caller reports (a decode instance, or a colocated one); prefill halves and resumed
continuations do not, so each request counts once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.05
MAX_BUFFERED = 50_000  # beyond this the oldest events are dropped (and counted): the forecast degrades, serving goes on


class EngineEvents:
    def __init__(self, controller_url: str, side: Any) -> None:
        self.url = controller_url.rstrip("/") + "/lifecycle" if controller_url else ""
        self.side = side
        self.local: Callable[[list[dict]], Any] | None = None  # a single server's own control plane
        self._buffer: list[dict[str, Any]] = []
        self.dropped = 0
        self.sent = 0
        self._task: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.url or self.local)

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    def _add(self, event: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if len(self._buffer) >= MAX_BUFFERED:
            del self._buffer[0]
            self.dropped += 1
        # Stamped when it happened, not when the batch arrives: the trainer's hints race these, and the tracker orders
        # the two channels by ts (a late report of a response the trainer already acted on must not rewind it).
        event["ts"] = time.time()
        self._buffer.append(event)

    def arrived(self, tid: str, prompt_tokens: int, prefill_instance: str) -> None:
        self._add({"trajectory_id": tid, "event": "request_arrived", "prompt_tokens": int(prompt_tokens)})
        self._add({"trajectory_id": tid, "event": "prefill_start", "instance": prefill_instance})

    def prefilled(self, tid: str, prefill_instance: str) -> None:
        self._add({"trajectory_id": tid, "event": "prefill_end", "instance": prefill_instance})

    def decoded(self, tid: str, output_tokens: int | None = None) -> None:
        event = {"trajectory_id": tid, "event": "decode_end"}
        if output_tokens is not None:
            event["output_tokens"] = int(output_tokens)
        self._add(event)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            if not self._buffer:
                continue
            batch, self._buffer = self._buffer, []
            try:
                if self.local is not None:
                    await asyncio.to_thread(self.local, batch)
                else:
                    status, answer = await self.side.post_json(self.url, {"events": batch}, timeout_s=10,
                                                               generation=True)
                    if status != 200:
                        logger.warning("controller refused %d lifecycle events (%s): %s", len(batch), status, answer)
                self.sent += len(batch)
            except Exception as e:  # the controller may be restarting: keep serving, count the loss
                self.dropped += len(batch)
                logger.warning("lifecycle events not delivered (%d dropped): %s", len(batch), e)
