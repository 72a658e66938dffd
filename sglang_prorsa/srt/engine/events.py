"""The engine side of the lifecycle (paper §4.1.1): ready / prefill / decode transitions of requests that carry a
trajectory id, batched and sent to the controller's tracker in the background (never on a request's path).

The instance that holds the caller reports (a decode instance, or a colocated one); prefill halves and resumed
continuations do not, so each request counts once. prefill_end is stamped when the scheduler first runs the request
in its decode batch (a ``Decoding`` note over the instance's channel), or at its first output if that comes first:
a non-streamed request has no output before it finishes, and waiting for it made every decode look like prefill.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from sglang_prorsa.srt.common.messages import Decoding

if TYPE_CHECKING:
    from sglang_prorsa.srt.engine.peer_client import PeerClient

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.05
MAX_BUFFERED = 50_000  # beyond this the oldest events are dropped (and counted): the forecast degrades, serving goes on


class EngineEvents:
    def __init__(self, controller_url: str, client: PeerClient | None) -> None:
        self.url = controller_url.rstrip("/") + "/lifecycle" if controller_url else ""
        self.client = client  # carries the batches to the controller (None: a single server's ``local`` only)
        self.local: Callable[[list[dict]], Any] | None = None  # a single server's own control plane
        self._buffer: list[dict[str, Any]] = []
        self.dropped = 0
        self.sent = 0
        self._task: asyncio.Task | None = None
        self._prefilling: OrderedDict[str, tuple[str, str]] = OrderedDict()  # rid -> (trajectory, prefill instance)

    def follow(self, controller_url: str) -> None:
        """Send to ``controller_url`` from now on, when no controller was given at start: an instance registered by
        a trainer's ``POST /workers`` on a front learns its controller from the peer push, and its request events
        then feed that controller's forecast instead of its own single-server control plane."""
        if self.url or self.client is None:
            return  # a controller from the flags stays; a single server without a peer client has nowhere to send
        self.url, self.local = controller_url.rstrip("/") + "/lifecycle", None

    @property
    def enabled(self) -> bool:
        return bool(self.url or self.local)

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    def _add(self, event: dict[str, Any], ts: float | None = None) -> None:
        if not self.enabled:
            return
        if len(self._buffer) >= MAX_BUFFERED:
            del self._buffer[0]
            self.dropped += 1
        # Stamped when it happened, not when the batch arrives: the trainer's hints race these, and the tracker orders
        # the two channels by ts (a late report of a response the trainer already acted on must not rewind it).
        event["ts"] = time.time() if ts is None else ts
        self._buffer.append(event)

    def arrived(self, rid: str, tid: str, prompt_tokens: int, prefill_instance: str) -> None:
        self._add({"trajectory_id": tid, "event": "request_arrived", "prompt_tokens": int(prompt_tokens)})
        self._add({"trajectory_id": tid, "event": "prefill_start", "instance": prefill_instance})
        self._prefilling[rid] = (tid, prefill_instance)
        if len(self._prefilling) > MAX_BUFFERED:  # requests that ended without any output (aborted at entry)
            self._prefilling.popitem(last=False)

    def prefilled(self, rid: str, ts: float | None = None) -> None:
        """prefill_end of ``rid``, once: from the scheduler's ``Decoding`` note or the request's first output."""
        entry = self._prefilling.pop(rid, None)
        if entry is not None:
            self._add({"trajectory_id": entry[0], "event": "prefill_end", "instance": entry[1]}, ts)

    def decoding(self, note: Decoding) -> None:
        for rid in note.rids:
            self.prefilled(rid, note.ts)

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
                    status, answer = await self.client.post_json(self.url, {"events": batch}, timeout_s=10,
                                                                 generation=True)
                    if status != 200:
                        logger.warning("controller refused %d lifecycle events (%s): %s", len(batch), status, answer)
                self.sent += len(batch)
            except Exception as e:  # the controller may be restarting: keep serving, count the loss
                self.dropped += len(batch)
                logger.warning("lifecycle events not delivered (%d dropped): %s", len(batch), e)
