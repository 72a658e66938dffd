"""sglang-router 0.3.2's worker API on the front, so a trainer that registers engines with "the router" (slime posts
each engine to ``POST /workers`` at start-up and lists ``GET /workers`` to abort every engine at the end of a rollout)
can be pointed at the front unchanged.

Facts for sglang-router 0.3.2 (read off the installed binary): ``POST /workers {url, worker_type, bootstrap_port}``
answers 202 ``{"status": "accepted", "worker_id", "url", "location": "/workers/{id}", "message"}`` with a
``Location`` header and adds the worker in the background; ``worker_type`` is ``regular`` (the default), ``prefill``
or ``decode``; the same URL posted again answers with the same ``worker_id``. ``DELETE /workers/{worker_id}`` takes
the id that ``POST`` answered and ``GET /workers`` lists (a UUID there, not the URL: a URL is refused with 400), and
answers 202 ``{"status": "accepted", "worker_id", "message"}``, or 404 ``WORKER_NOT_FOUND``.

Here a registration is synchronous (the worker is in the registry, the peer lists and the external router's pool
when the answer comes: 200, same body keys), and goes through ``join``, the one path ``POST /prorsa/register`` takes
too: a worker added by URL switches roles like any other instance. Its id is ``HOST:PORT`` of its URL
(``worker_id``): what an instance started without ``--prorsa-instance-id`` calls itself, so the peer list names it as
it names itself. A URL the registry knows already, under any id, answers that entry (idempotent, never a second
entry); the controller's role wins over the posted ``worker_type`` (it may have switched the instance since).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sglang_prorsa.srt.common.auth import admin
from sglang_prorsa.srt.common.http_utils import coded_error, field_error, json_object
from sglang_prorsa.srt.common.messages import Code
from sglang_prorsa.srt.common.registry import Instance, State
from sglang_prorsa.srt.controller.router_pools import RouterPoolError

logger = logging.getLogger(__name__)

ROLE_OF_TYPE = {"prefill": "prefill", "decode": "decode", "regular": "null"}  # router worker_type -> our role
TYPE_OF_ROLE = {role: kind for kind, role in ROLE_OF_TYPE.items()}


def worker_id(url: str) -> str:
    """``HOST:PORT`` of ``url`` (the scheme's default port when it names none), the host lower-cased."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = (parts.hostname or "").lower()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_worker(body: dict[str, Any]) -> tuple[str, str] | None:
    """What is wrong with a ``POST /workers`` body, as (field, message); None when nothing is."""
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return "url", "must be http://HOST:PORT"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a port that is not a number or out of range
    except ValueError as e:
        return "url", f"must be http://HOST:PORT ({e})"
    if not parts.hostname or parts.path.strip("/") or parts.query or parts.fragment:
        return "url", "must be http://HOST:PORT, without a path"
    kind = body.get("worker_type", "regular")
    if kind is None:
        kind = "regular"
    if kind not in ROLE_OF_TYPE:
        return "worker_type", f"must be 'prefill', 'decode' or 'regular', got {kind!r}"
    port = body.get("bootstrap_port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        return "bootstrap_port", "must be a port number or null"
    return None


async def _bootstrap_port(front: Any, url: str) -> int | None:
    """The PD instance's own bootstrap port (``disaggregation_bootstrap_port``): slime posts it for a prefill engine
    only, but a decode instance the controller switches to prefill serves KV from that port too."""
    try:
        status, info = await front.http.get(url + "/get_server_info", timeout_s=10)
    except (OSError, asyncio.TimeoutError, aiohttp.ClientError):
        return None
    port = info.get("disaggregation_bootstrap_port") if status == 200 and isinstance(info, dict) else None
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None


def describe(inst: Instance) -> dict[str, Any]:
    """One worker as ``GET /workers`` lists it (sglang-router's keys, plus our ``status``)."""
    return {"id": inst.instance_id, "url": inst.url, "worker_type": TYPE_OF_ROLE.get(inst.role, inst.role),
            "bootstrap_port": inst.bootstrap_port, "is_healthy": inst.state is State.ACTIVE,
            "status": inst.state.value}


async def join(front: Any, instance_id: str, url: str, role: str, bootstrap_host: str,
               bootstrap_port: int | None, events_to: str | None = None, gpus: Any = None,
               switching: bool = False, switches: int | None = None) -> tuple[Instance, bool]:
    """An instance joins (or announces itself again): into the registry, every instance's peer list and, for a PD
    role, the external router's pool. (its entry, whether it is new). ``events_to``: the controller's URL as the
    instance's registrar reached it, for an instance that does not know its controller (registered by a trainer's
    ``POST /workers``): the peer push tells it, and its request events then feed this controller's forecast."""
    prev = front.registry.instances.get(instance_id) or front.registry.by_url(url)
    was = (prev.role, prev.state) if prev is not None else None
    inst, new = front.registry.register(instance_id, url, role, bootstrap_host, bootstrap_port, gpus,
                                        switching=switching, switches=switches)
    if new and events_to:
        inst.controller_url = events_to
    # Every announcement, not only a new one: an instance that did not accept the last list (it restarted under its
    # id before the health checks saw it die, so the push reached the dead process) gets it now; one that has it
    # costs nothing here.
    await front.orchestrator.push_peers()
    if new:
        logger.info("instance %s registered from %s as %s%s", inst.instance_id, inst.url, inst.role,
                    " (switching)" if inst.adopted_switch else "")
    elif was != (inst.role, inst.state):
        logger.info("instance %s reports role %s (%s): adopted", inst.instance_id, inst.role, inst.state.value)
    if (new or was != (inst.role, inst.state)) and inst.state is State.ACTIVE:
        if front.orchestrator.router is not None and inst.role in ("prefill", "decode"):
            # In its role's pool and no other: a controller restarted after it died mid-switch finds the instance
            # out of every pool, or still in its old role's (the instance finished the switch on its own).
            await front.orchestrator.router.place(inst.url, inst.role, inst.bootstrap_port)
    return inst, new


async def leave(front: Any, inst: Instance) -> None:
    """``inst`` leaves: out of the routing (draining), of the external router's pool (confirmed), then of the
    registry and every peer list. Under the orchestrator's lock: no switch or control operation is in flight on it.
    Its process is left running: requests it already holds finish there."""
    async with front.orchestrator.lock:
        front.registry.set_state(inst, State.DRAINING)
        await front.orchestrator.push_peers()
        if front.orchestrator.router is not None:
            try:
                await front.orchestrator.router.remove(inst.url)
            except (RouterPoolError, OSError, asyncio.TimeoutError, aiohttp.ClientError) as e:
                # It leaves the registry all the same; the router drops a worker it cannot reach by its own checks.
                logger.warning("router did not confirm the removal of %s: %s", inst.instance_id, e)
        front.registry.remove(inst.instance_id)
        front.orchestrator.forget(inst.instance_id)
        await front.orchestrator.push_peers()
    logger.info("instance %s (%s) removed", inst.instance_id, inst.url)


def mount(app: FastAPI, front: Any) -> None:
    @app.get("/workers")
    async def list_workers():
        """sglang-router's listing shape. Every instance is listed whatever its state (a draining or switching one
        still holds requests, so an abort loop over this list must reach it), with its ``status``."""
        items = [describe(i) for i in front.registry]
        stats = {f"{kind}_count": sum(w["worker_type"] == kind for w in items)
                 for kind in ("prefill", "decode", "regular")}
        return {"workers": items, "total": len(items), "stats": stats}

    @app.get("/workers/{wid}")
    async def get_worker(wid: str):
        inst = front.registry.instances.get(wid)
        if inst is None:
            return coded_error(404, Code.UNKNOWN_INSTANCE, f"Worker {wid} not found", field="worker_id")
        return describe(inst)

    @app.post("/workers")
    @admin
    async def add_worker(request: Request):
        body = await json_object(request)
        if isinstance(body, JSONResponse):
            return body
        problem = check_worker(body)
        if problem:
            return field_error(*problem, status=400)
        url = body["url"].rstrip("/")
        known = front.registry.by_url(url)
        iid = known.instance_id if known is not None else worker_id(url)
        role = known.role if known is not None else ROLE_OF_TYPE[body.get("worker_type") or "regular"]
        port = body.get("bootstrap_port")
        if known is None and port is None and role in ("prefill", "decode"):
            port = await _bootstrap_port(front, url)
        inst, new = await join(front, iid, url, role, urlsplit(url).hostname or "127.0.0.1", port,
                               events_to=str(request.base_url).rstrip("/"))
        message = "Worker added" if new else f"Worker already registered (as {TYPE_OF_ROLE.get(inst.role)})"
        location = f"/workers/{inst.instance_id}"
        return JSONResponse({"status": "accepted", "worker_id": inst.instance_id, "url": inst.url,
                             "location": location, "message": message, "new": new, "worker": describe(inst)},
                            headers={"Location": location})

    @app.delete("/workers/{wid}")
    @admin
    async def delete_worker(wid: str):
        inst = front.registry.instances.get(wid)
        if inst is None:
            return coded_error(404, Code.UNKNOWN_INSTANCE,
                               f"Worker {wid} not found (ids: {sorted(front.registry.instances)})",
                               field="worker_id")
        if inst.started_here:
            return coded_error(409, Code.STARTED_HERE,
                               f"instance {wid} was started by this front, which restarts it when it exits: stop "
                               "the front to end it", field="worker_id")
        await leave(front, inst)
        return {"status": "accepted", "worker_id": wid, "message": "Worker removed"}
