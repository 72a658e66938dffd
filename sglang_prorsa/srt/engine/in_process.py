"""A whole request from an in-process caller on a PD instance (``sglang_prorsa.engine.Engine``), paired here.

SGLang serves a request on a prefill or decode instance only as one half of a pair, with a bootstrap room; a
caller that holds the tokenizer manager in its own process (verl's ``generate``, ``Engine.generate``) sends a whole
request, with none. The engine pairs it itself, so such a caller needs no PD dispatch of its own and keeps working
across switches of the instance it holds:

- on a decode instance that admits requests, its prefill half goes to the least loaded active prefill peer over
  HTTP and its decode half runs here -- so a switch takes it off and resumes it like any decode half;
- otherwise (a prefill instance, a switch running, no prefill peer yet) it is continued on a pair of peers from its
  prompt, as a request handed on at arrival (``Resumer.hand_on_at_arrival``), which waits for a pair if none is up.

A request that carries a bootstrap room is a half its caller paired itself (verl's PD replicas do) and is served as
SGLang serves it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Any

import orjson

from sglang_prorsa.srt.common.messages import ROLE_HEADER
from sglang_prorsa.srt.engine.continuation import CARRIED_FIELDS, continuation_rid
from sglang_prorsa.srt.engine.peers import NoPair

if TYPE_CHECKING:
    from sglang_prorsa.srt.engine.side import EngineSide

logger = logging.getLogger(__name__)


def needs_pairing(obj: Any, request: Any, role: str) -> bool:
    """An in-process caller's whole request (no HTTP request, no bootstrap room) on a PD instance."""
    return request is None and role in ("prefill", "decode") and obj.bootstrap_room is None


def pairs_here(side: EngineSide) -> bool:
    """Its decode half can run here: a decode instance admitting requests, with an active prefill peer."""
    if side.role != "decode" or not side.admission.admitting:
        return False
    try:
        side.peers.pick("prefill")
    except NoPair:
        return False
    return True


_SENDING: set[asyncio.Task] = set()  # prefill halves on their way (the loop keeps only weak references to tasks)


async def send_prefill_half(side: EngineSide, obj: Any) -> None:
    """Points ``obj`` at a prefill peer (a fresh bootstrap room) and posts its prefill half there, in a task of
    its own: the caller reads the decode half's answer, here, and a prefill half that fails leaves the decode half
    to the orphan watch, which takes it off and continues it."""
    prefill = side.peers.pick("prefill")
    ids = await side.tm_view.prompt_ids(obj)
    obj.bootstrap_host, obj.bootstrap_port = prefill.bootstrap_host, prefill.bootstrap_port
    obj.bootstrap_room = random.getrandbits(63)
    body = {k: getattr(obj, k) for k in CARRIED_FIELDS if getattr(obj, k) is not None}
    body.update(input_ids=ids, sampling_params=dict(obj.sampling_params or {}), rid=continuation_rid(),
                bootstrap_host=obj.bootstrap_host, bootstrap_port=obj.bootstrap_port, bootstrap_room=obj.bootstrap_room)
    side.counters["in_process_paired"] += 1
    side.peers.acquire(prefill)

    async def post() -> None:
        try:
            status, text = await side.client.post_raw(prefill.url + "/generate", orjson.dumps(body),
                                                      {ROLE_HEADER: "prefill", "Content-Type": "application/json"})
            if status != 200:  # the decode half then waits on its room until the orphan watch takes it off
                logger.warning("prefill half of %s on %s answered %s: %s", obj.rid, prefill.instance_id, status,
                               text[:300])
        except Exception as e:  # the same: the decode half is looked after by the orphan watch
            logger.warning("prefill half of %s on %s failed: %s", obj.rid, prefill.instance_id, e)
        finally:
            side.peers.release(prefill)

    task = asyncio.ensure_future(post())
    _SENDING.add(task)
    task.add_done_callback(_SENDING.discard)
