"""sglang-router 0.3.2's worker API on the front (srt/controller/workers.py), over real loopback HTTP: fake instances
and a fake router record what the front sends them; the front's app runs in-process (no lifespan).

A worker posted by URL joins by the path ``POST /prorsa/register`` takes (registry, peer lists, the router's pool);
posting a known URL again is idempotent; bad input is a 4xx naming the field; a removed worker leaves the registry,
the routing and the router's pool; an instance the front started is not removed by id.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import httpx
from aiohttp import web
from unit_support import loopback_upstream

from sglang_prorsa.config import split_prorsa_flags
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.app import Front, build_app
from sglang_prorsa.srt.controller.workers import worker_id


class Fakes:
    """What every fake instance and the fake router were sent: (base url, method, path, json body)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, object]] = []
        self.router: dict[str, dict] = {}  # the fake router's pools: url -> worker

    async def instance(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.seen.append((f"http://{request.host}", request.method, request.path, body))
        if request.path == "/get_server_info":
            return web.json_response({"disaggregation_bootstrap_port": 8998, "tp_size": 1})
        return web.json_response({"success": True})

    async def router_workers(self, request: web.Request) -> web.Response:
        self.seen.append(("router", request.method, request.path, None))
        if request.method == "GET":
            return web.json_response({"workers": list(self.router.values())})
        if request.method == "POST":
            w = await request.json()
            self.router[w["url"]] = {**w, "id": f"r{len(self.router)}"}
            return web.json_response({"status": "accepted"}, status=202)
        wid = request.match_info["wid"]
        self.router = {u: w for u, w in self.router.items() if w["id"] != wid}
        return web.json_response({"status": "accepted"}, status=202)


def run(script, instances: int = 3):
    """``script(client, front, fakes, urls)`` against a front over ``instances`` fake instances (the first one
    registered as started by the front, id "0") and a fake router."""
    fakes = Fakes()

    async def scenario():
        async with AsyncExitStack() as stack:
            urls = [await stack.enter_async_context(loopback_upstream([("*", "/{tail:.*}", fakes.instance)]))
                    for _ in range(instances)]
            router = await stack.enter_async_context(loopback_upstream(
                [("GET", "/workers", fakes.router_workers), ("POST", "/workers", fakes.router_workers),
                 ("DELETE", "/workers/{wid}", fakes.router_workers)]))
            config, _ = split_prorsa_flags(["--pd-adaptive", "--prorsa-router", router])
            registry = Registry()
            registry.add(Instance("0", urls[0], "prefill", bootstrap_port=9000, state=State.ACTIVE, started_here=True))
            front = Front(config, registry)
            transport = httpx.ASGITransport(app=build_app(front))
            try:
                async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
                    return await script(client, front, fakes, urls)
            finally:
                await front.relay.close()
                await front.http.close()

    return asyncio.run(scenario())


def test_a_worker_posted_by_url_joins_like_a_registered_one_in_the_routers_shapes():
    async def script(client, front, fakes, urls):
        r = await client.post("/workers", json={"url": urls[1], "worker_type": "decode"})
        return r, front, fakes, urls, client

    r, front, fakes, urls, client = run(script)
    wid = worker_id(urls[1])
    assert wid == "127.0.0.1:" + urls[1].rsplit(":", 1)[1]
    assert r.status_code == 200 and r.headers["location"] == f"/workers/{wid}"
    worker = {"id": wid, "url": urls[1], "worker_type": "decode", "bootstrap_port": 8998, "is_healthy": True,
              "status": "active"}
    assert r.json() == {"status": "accepted", "worker_id": wid, "url": urls[1], "location": f"/workers/{wid}",
                        "message": "Worker added", "new": True, "worker": worker}
    inst = front.registry.get(wid)
    assert (inst.role, inst.state, inst.bootstrap_host, inst.started_here) == ("decode", State.ACTIVE, "127.0.0.1",
                                                                             False)
    # The join: every instance learns the new peer list (the new one included), the router gets it in its pool.
    pushed = {base: body for base, method, path, body in fakes.seen if path == "/prorsa/peers"}
    assert set(pushed) == {urls[0], urls[1]}
    # The worker posted by URL does not know its controller: the push tells it (the URL the POST reached), so its
    # request events feed this front's forecast; the instance the front started is told nothing new.
    assert pushed[urls[1]]["controller"] == str(client.base_url) and "controller" not in pushed[urls[0]]
    assert inst.controller_url == str(client.base_url)
    assert fakes.router == {urls[1]: {"url": urls[1], "worker_type": "decode", "id": "r0"}}
    assert [i.instance_id for i in front.registry.routable("decode")] == [wid]


def test_posting_a_known_url_again_is_idempotent_and_keeps_the_controllers_role():
    async def script(client, front, fakes, urls):
        first = await client.post("/workers", json={"url": urls[1], "worker_type": "decode"})
        version = front.registry.version
        again = await client.post("/workers", json={"url": urls[1] + "/", "worker_type": "prefill",
                                                     "bootstrap_port": 7000})
        started = await client.post("/workers", json={"url": urls[0], "worker_type": "prefill"})
        # The same engine registering itself under another id is the same entry, not a second one.
        self_reg = await client.post("/prorsa/register", json={"instance_id": "engine-x", "url": urls[1],
                                                               "role": "decode"})
        listed = (await client.get("/workers")).json()
        return first, again, started, self_reg, listed, version, front

    first, again, started, self_reg, listed, version, front = run(script)
    wid = first.json()["worker_id"]
    assert again.status_code == 200 and again.json()["worker_id"] == wid and again.json()["new"] is False
    assert again.json()["message"] == "Worker already registered (as decode)"
    assert again.json()["worker"]["worker_type"] == "decode" and again.json()["worker"]["bootstrap_port"] == 8998
    assert started.json()["worker_id"] == "0" and started.json()["new"] is False
    assert self_reg.status_code == 200 and self_reg.json()["new"] is False
    assert self_reg.json()["instance"]["instance"] == wid
    assert front.registry.version == version  # nothing changed
    assert listed["total"] == 2 and sorted(w["id"] for w in listed["workers"]) == sorted(["0", wid])
    assert listed["stats"] == {"prefill_count": 1, "decode_count": 1, "regular_count": 0}


def test_a_regular_worker_is_a_colocated_instance_and_a_draining_one_stays_listed():
    async def script(client, front, fakes, urls):
        r = await client.post("/workers", json={"url": urls[2]})  # worker_type defaults to regular, as the router's
        front.registry.set_state(front.registry.get("0"), State.DRAINING, target_role="decode")
        return r, (await client.get("/workers")).json(), front, fakes

    r, listed, front, fakes = run(script)
    assert front.registry.get(r.json()["worker_id"]).role == "null"
    assert r.json()["worker"]["worker_type"] == "regular" and r.json()["worker"]["bootstrap_port"] is None
    assert not [s for s in fakes.seen if s[2] == "/get_server_info"]  # no bootstrap port to look up
    assert {w["id"]: (w["worker_type"], w["status"], w["is_healthy"]) for w in listed["workers"]} == {
        "0": ("prefill", "draining", False), r.json()["worker_id"]: ("regular", "active", True)}
    assert listed["stats"] == {"prefill_count": 1, "decode_count": 0, "regular_count": 1}
    assert fakes.router == {}  # a colocated instance is in no PD pool


def test_bad_input_is_a_4xx_naming_the_field():
    bodies = [({"worker_type": "decode"}, "url"), ({"url": 5}, "url"), ({"url": "ftp://h:1"}, "url"),
              ({"url": "http://127.0.0.1:1/v1"}, "url"), ({"url": "http://127.0.0.1:99999"}, "url"),
              ({"url": "http://127.0.0.1:1", "worker_type": "bogus"}, "worker_type"),
              ({"url": "http://127.0.0.1:1", "bootstrap_port": -1}, "bootstrap_port"),
              ({"url": "http://127.0.0.1:1", "bootstrap_port": "8998"}, "bootstrap_port"),
              ({"url": "http://127.0.0.1:1", "bootstrap_port": True}, "bootstrap_port"),
              ({"url": "http://127.0.0.1:1", "bootstrap_port": 70000}, "bootstrap_port")]

    async def script(client, front, fakes, urls):
        out = [(await client.post("/workers", json=b), f) for b, f in bodies]
        out.append((await client.post("/workers", content=b"[1]"), "body"))
        out.append((await client.post("/workers", content=b"{"), "body"))
        out.append((await client.delete("/workers/nobody"), "worker_id"))
        out.append((await client.get("/workers/nobody"), "worker_id"))
        return out, len(front.registry)

    out, size = run(script)
    for r, name in out:
        assert 400 <= r.status_code < 500 and r.json()["field"] == name, (name, r.status_code, r.text)
    assert [r.status_code for r, _ in out] == [400] * 12 + [404, 404]
    assert {r.json()["code"] for r, _ in out[:12]} == {"invalid"}
    assert {r.json()["code"] for r, _ in out[12:]} == {"unknown_instance"}
    assert size == 1  # nothing registered


def test_a_deleted_worker_leaves_registry_routing_and_router_and_a_started_one_is_refused():
    async def script(client, front, fakes, urls):
        wid = (await client.post("/workers", json={"url": urls[1], "worker_type": "decode"})).json()["worker_id"]
        fakes.seen.clear()
        gone = await client.delete(f"/workers/{wid}")
        again = await client.delete(f"/workers/{wid}")
        refused = await client.delete("/workers/0")
        back = await client.post("/workers", json={"url": urls[1], "worker_type": "decode"})
        return wid, gone, again, refused, back, front, fakes, urls

    wid, gone, again, refused, back, front, fakes, urls = run(script)
    assert gone.status_code == 200 and gone.json() == {"status": "accepted", "worker_id": wid,
                                                        "message": "Worker removed"}
    assert again.status_code == 404 and again.json()["field"] == "worker_id"
    assert refused.status_code == 409 and refused.json()["code"] == "started_here"
    assert refused.json()["field"] == "worker_id"
    # out of the router's pool (confirmed there) and of every peer list before the answer
    assert ("router", "DELETE", "/workers/r0", None) in fakes.seen
    last_push = [body for base, _, path, body in fakes.seen if path == "/prorsa/peers" and base == urls[0]][1]
    assert [p["instance_id"] for p in last_push["instances"]] == ["0"]
    # registered again later: a new entry under the same id, pushed the peer list afresh
    assert back.json()["new"] is True and back.json()["worker_id"] == wid
    assert sorted(front.registry.instances) == sorted(["0", wid])
