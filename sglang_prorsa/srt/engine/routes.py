"""HTTP routes one engine instance adds beside SGLang's own (every instance stays a complete SGLang server).

    POST /prorsa/switch_role {"new_role", "timeout_s"?}   this instance's side of a busy switch (``switch.py``)
    POST /prorsa/migrate_out                             one sweep without a rebuild: requests here continue elsewhere
    POST /prorsa/admission {"accept": bool}              stop (or resume) serving new requests here: hand them on
    POST /prorsa/release {"rooms": [int], "only_not_started"?}   the other halves of these PD pairs moved: take ours
                                                         off (a prefill instance may keep those it began)
    POST /prorsa/expect {"rooms": [int]}                 the other halves are about to move: book records for ours
    POST /prorsa/peer_lost {"bootstrap_host", "bootstrap_port", "dead"?}   a prefill instance died (or, "dead": false,
                                                         stopped answering): continue what waited on it
    POST /prorsa/held_rooms {"rooms": [int]}             which of these PD rooms this instance still holds ("held"),
                                                         and which of those wait on a handshake that is not coming
                                                         ("stuck"; prefill only, see watchdog.py)
    POST /prorsa/kv/load {"token_ids", "keys", "block_tokens", "hold_for_rid"?, "layout"?}   load a persisted prefix
                                                         ("layout": the source's parallel KV layout; another than
                                                         ours is refused, "refused" in the answer)
    POST /prorsa/peers {"instances": [...], "version"?, "controller"?}  the controller's registry, for continuing
                                                     requests (and, for an instance registered by POST /workers on
                                                     the front, where its request events go)
    GET  /prorsa/status                                  role, idle, loads, KV, counters, busy intervals, engine state,
                                                         gpus (tp × pp × dp of its SGLang arguments; 1 on CPU)
    GET  /prorsa/metrics                                 the same in Prometheus text

Errors are ``{"error": ..., "code": ..., "field"?: ...}`` with a typed ``code`` (``srt/messages.Code``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from sglang_prorsa.srt.common.auth import admin
from sglang_prorsa.srt.common.gpus import instance_gpus
from sglang_prorsa.srt.common.http_utils import coded_error, field_error, json_body
from sglang_prorsa.srt.common.messages import ChannelError, Code
from sglang_prorsa.srt.disaggregation.kv_store import check_key
from sglang_prorsa.srt.engine.peers import Peer
from sglang_prorsa.srt.engine.side import EngineSide
from sglang_prorsa.srt.engine.switch import SwitchFailed
from sglang_prorsa.srt.engine.watchdog import held_rooms, stuck_rooms
from sglang_prorsa.srt.scheduler.counters import prometheus_text

logger = logging.getLogger(__name__)

ROLES = ("prefill", "decode")
STUCK_CHECK_TIMEOUT_S = 3.0
MAX_LAYOUT_CHARS = 4096  # a model path and a few fields


def _store_key(k: Any) -> bool:
    try:
        check_key(k)
        return True
    except ValueError:
        return False


def _non_negative_int(v: Any) -> bool:
    # Token ids, rooms and versions go into int64 arrays and SGLang's own fields: anything larger is no id.
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _rooms(v: Any) -> bool:
    return isinstance(v, list) and all(_non_negative_int(r) for r in v)


def make_engine_router(side: EngineSide, cpu: bool) -> APIRouter:
    router = APIRouter()

    @router.post("/prorsa/switch_role")
    @admin
    @json_body
    async def switch_role(body: dict[str, Any]):
        new_role = body.get("new_role")
        if new_role not in ROLES:
            return field_error("new_role", f"must be one of {list(ROLES)}, got {new_role!r}")
        timeout_s = body.get("timeout_s", 300)
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not 0 < timeout_s <= 3600:
            return field_error("timeout_s", "must be a number of seconds in (0, 3600]")
        if side.switch is not None:
            return coded_error(409, Code.SWITCHING, "a switch is already running on this instance")
        if side.held:
            return coded_error(409, Code.CONTROL_OPERATION, f"switches are held: {', '.join(sorted(side.held))}")
        if side.role == new_role:
            return coded_error(409, Code.ALREADY_IN_ROLE, f"instance is already {new_role}", field="new_role")
        job = side.switch = side.switch_job(new_role, float(timeout_s), cpu)
        try:
            async with side.ops_lock:  # a weight update or pause arriving now waits for the rebuilt role
                report = await job.run()
        except SwitchFailed as e:
            return coded_error(e.status, Code.UPSTREAM, f"switch failed: {e}", detail=job.report())
        except (ChannelError, TimeoutError) as e:
            return coded_error(503, Code.TIMEOUT, f"switch failed: {e}", detail=job.report())
        finally:
            side.switch = None
        side.switches += 1
        side.last_switch = report
        return JSONResponse(report)

    @router.post("/prorsa/migrate_out")
    @admin
    async def migrate_out():
        if side.switch is not None:
            return coded_error(409, Code.SWITCHING, "a switch is running on this instance")
        side.admission.admitting = False  # stays closed until POST /prorsa/admission {"accept": true}
        job = side.switch_job(side.role, timeout_s=60, cpu=cpu)
        persist_s = await job.sweep()
        taken = set(job.taken)
        records = [r.to_json() for r in side.book.recent if r.rid in taken]
        return JSONResponse({"role": side.role, "requests": records, "persist_s": persist_s,
                             "persisted_bytes": job.persisted_bytes, "released_elsewhere": job.report()[
                                 "released_elsewhere"]})

    @router.post("/prorsa/admission")
    @admin
    @json_body
    async def admission(body: dict[str, Any]):
        accept = body.get("accept")
        if not isinstance(accept, bool):
            return field_error("accept", "must be true or false")
        if side.switch is not None:
            return coded_error(409, Code.SWITCHING, "a switch is running; admission resumes when it ends")
        side.admission.admitting = accept
        return JSONResponse({"admitting": side.admission.admitting})

    @router.post("/prorsa/release")
    @admin
    @json_body
    async def release(body: dict[str, Any]):
        rooms, only = body.get("rooms"), body.get("only_not_started", False)
        if not _rooms(rooms):
            return field_error("rooms", "must be a list of non-negative integers (bootstrap rooms)")
        if not isinstance(only, bool):
            return field_error("only_not_started", "must be true or false")
        rids, taken = await side.scheduler.release(rooms, only)
        return JSONResponse({"released": rids, "rooms": taken})

    @router.post("/prorsa/peer_lost")
    @admin
    @json_body
    async def peer_lost(body: dict[str, Any]):
        host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
        if not isinstance(host, str) or not host:
            return field_error("bootstrap_host", "must be a host name or address")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return field_error("bootstrap_port", "must be a port number")
        dead = body.get("dead", True)
        if not isinstance(dead, bool):
            return field_error("dead", "must be true (the process died) or false (it stopped answering)")
        if side.role != "decode":
            return JSONResponse({"released": []})
        res = await side.scheduler.peer_lost(host, port, dead)
        side.counters["released_for_lost_prefill"] += len(res.rids)
        return JSONResponse({"released": res.rids})

    @router.post("/prorsa/held_rooms")
    @admin
    @json_body
    async def held(body: dict[str, Any]):
        rooms = body.get("rooms")
        if not _rooms(rooms):
            return field_error("rooms", "must be a list of non-negative integers (bootstrap rooms)")
        held = held_rooms(side.tm, set(rooms))
        stuck: list[int] = []
        if held and side.role == "prefill" and side.switch is None and not side.held:  # a paused one waits by intent
            try:  # briefly: the asker treats a prefill instance that does not answer within 10 s as lost
                stuck = stuck_rooms(await side.scheduler.inventory(timeout_s=STUCK_CHECK_TIMEOUT_S), set(held))
            except TimeoutError:
                pass  # a scheduler too busy to answer is not idle: nothing of it is stuck
        return JSONResponse({"held": held, "stuck": stuck})

    @router.post("/prorsa/expect")
    @admin
    @json_body
    async def expect(body: dict[str, Any]):
        rooms = body.get("rooms")
        if not _rooms(rooms):
            return field_error("rooms", "must be a list of non-negative integers (bootstrap rooms)")
        return JSONResponse({"expected": await side.scheduler.expect(rooms)})

    @router.post("/prorsa/kv/load")
    @admin
    @json_body
    async def kv_load(body: dict[str, Any]):
        ids, keys, bt = body.get("token_ids"), body.get("keys"), body.get("block_tokens")
        hold = body.get("hold_for_rid", "")
        if not isinstance(ids, list) or not all(_non_negative_int(t) for t in ids):
            return field_error("token_ids", "must be a list of non-negative integers")
        if not isinstance(keys, list) or not all(_store_key(k) for k in keys):
            return field_error("keys", "must be a list of KV store keys (1-200 chars of [A-Za-z0-9._:-])")
        if not isinstance(bt, int) or isinstance(bt, bool) or bt <= 0:
            return field_error("block_tokens", "must be a positive integer")
        layout = body.get("layout", "")
        if not isinstance(layout, str) or len(layout) > MAX_LAYOUT_CHARS:
            return field_error("layout", f"must be a KV layout identity (a string of at most {MAX_LAYOUT_CHARS} "
                                         "chars; \"\" for none)")
        if not layout and len(keys) < -(-len(ids) // bt):  # with a layout each rank derives its own keys
            return field_error("keys", f"{len(keys)} keys cannot cover {len(ids)} tokens in blocks of {bt}")
        if not isinstance(hold, str):
            return field_error("hold_for_rid", "must be a string (the rid of the request that will use it)")
        r = await side.scheduler.load_prefix(ids, keys, bt, hold, layout)
        return JSONResponse(vars(r))

    @router.post("/prorsa/peers")
    @admin
    @json_body
    async def peers(body: dict[str, Any]):
        items, version = body.get("instances"), body.get("version")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            return field_error("instances", "must be a list of objects")
        try:
            parsed = [Peer.from_json(i) for i in items]
        except (KeyError, TypeError, ValueError) as e:
            return field_error("instances", f"each needs instance_id, url, role ({e})")
        if version is not None and not _non_negative_int(version):
            return field_error("version", "must be a non-negative integer")
        controller = body.get("controller")
        if controller is not None and not (isinstance(controller, str) and controller.startswith(("http://", "https://"))):
            return field_error("controller", "must be the controller's URL, http://HOST:PORT")
        # What this instance's scheduler cached about a peer whose endpoints changed goes first, so no continuation
        # picks that peer under its new epoch while the old endpoints are still known here.
        forgotten = await side.scheduler.forget_prefills(side.peers.moved(parsed))
        side.peers.update(parsed, version)
        if controller:
            side.events.follow(controller)
        return JSONResponse({"peers": len(parsed), "version": side.peers.version, "forgotten": forgotten})

    @router.get("/prorsa/status")
    async def status(since: int = -1):
        st = await side.scheduler.status(since)
        d = dict(vars(st))
        d["busy_intervals"] = [vars(i) for i in st.busy_intervals]
        d["instance"] = side.instance_id
        d["gpus"] = 1 if cpu or side.tm is None else instance_gpus(side.tm.server_args)  # Eq. 1's G counts these
        d.update(side.status())
        return JSONResponse(d)

    @router.get("/prorsa/metrics")
    async def metrics():
        st = await side.scheduler.status()
        counters = {**st.counters, **{k: float(v) for k, v in side.counters.items()},
                    "switches": side.switches, "lifecycle_events_dropped": side.events.dropped,
                    "lifecycle_events_sent": side.events.sent}
        gauges = {"kv_footprint_tokens": st.kv_footprint_tokens, "kv_capacity_tokens": st.kv_capacity_tokens,
                  "prefix_cache_tokens": st.prefix_cache_tokens, "running_requests": st.running,
                  "queued_requests": st.queued, "idle": int(st.idle), "resuming_requests": side.resumer.resuming}
        return PlainTextResponse(prometheus_text(side.instance_id, st.role, counters, gauges))

    return router

