"""A controller restarted after it died learns the roles as they are (``Registry.register``, ``workers.join``): an
instance that registers mid-switch (a switch the dead controller began) is held out of every pool until it reports
the switch done, then adopted in the role it switched to; an active instance that reports another role after more
completed switches is adopted in it; a report older than a switch of the controller's own changes nothing; the
external router's pools follow (``RouterPools.place``: out of the wrong pool first). Over real loopback HTTP with
the fake instances and router of ``test_worker_api``."""

from __future__ import annotations

from test_worker_api import run

from sglang_prorsa.srt.common.registry import Registry, State


def body(url: str, role: str, **extra) -> dict:
    return {"instance_id": "i1", "url": url, "role": role, "bootstrap_port": 9001, "bootstrap_host": "127.0.0.1",
            **extra}


def test_an_instance_registering_mid_switch_stays_out_of_the_pools_until_it_reports_the_switch_done():
    async def script(client, front, fakes, urls):
        fakes.router[urls[1]] = {"url": urls[1], "worker_type": "decode", "id": "old"}  # the dead controller's add
        first = await client.post("/prorsa/register", json=body(urls[1], "decode", switching=True, switches=2))
        during = (front.registry.get("i1").state, [i.instance_id for i in front.registry.routable("decode")],
                  dict(fakes.router))
        again = await client.post("/prorsa/register", json=body(urls[1], "decode", switching=True, switches=2))
        still = front.registry.get("i1").state
        done = await client.post("/prorsa/register", json=body(urls[1], "prefill", switching=False, switches=3))
        return first, during, again, still, done, front, fakes, urls

    first, during, again, still, done, front, fakes, urls = run(script)
    assert first.status_code == again.status_code == done.status_code == 200
    assert first.json()["new"] is True and done.json()["new"] is False
    state, routable, router = during
    assert state is State.SWITCHING and routable == [] and still is State.SWITCHING
    assert router == {urls[1]: {"url": urls[1], "worker_type": "decode", "id": "old"}}  # not touched mid-switch
    inst = front.registry.get("i1")
    assert (inst.role, inst.state, inst.epoch, inst.adopted_switch) == ("prefill", State.ACTIVE, 1, False)
    assert [i.instance_id for i in front.registry.routable("prefill")] == ["0", "i1"]
    # Out of the decode pool (DELETE of the router's id), then into the prefill pool with its bootstrap port.
    calls = [(m, p) for who, m, p, _ in fakes.seen if who == "router" and m != "GET"]
    assert calls == [("DELETE", "/workers/old"), ("POST", "/workers")]
    assert fakes.router == {urls[1]: {"url": urls[1], "worker_type": "prefill", "bootstrap_port": 9001, "id": "r0"}}


def test_an_instance_already_in_its_pool_is_left_there():
    async def script(client, front, fakes, urls):
        fakes.router[urls[1]] = {"url": urls[1], "worker_type": "decode", "id": "kept"}
        r = await client.post("/prorsa/register", json=body(urls[1], "decode", switches=0))
        return r, fakes, urls

    r, fakes, urls = run(script)
    assert r.status_code == 200
    assert [(m, p) for who, m, p, _ in fakes.seen if who == "router" and m != "GET"] == []
    assert fakes.router[urls[1]]["id"] == "kept"


def test_a_newer_report_of_another_role_is_adopted_and_an_older_one_is_not():
    reg = Registry()
    inst, new = reg.register("i1", "http://h:1", "decode", "h", 9001, switches=3)
    assert new and inst.state is State.ACTIVE and inst.reported_switches == 3
    # A heartbeat sent before a switch of this controller's own, arriving after it: no more switches than known.
    reg.set_role(inst, "prefill")
    reg.register("i1", "http://h:1", "decode", "h", 9001, switches=3)
    assert (inst.role, inst.epoch) == ("prefill", 0)
    reg.register("i1", "http://h:1", "prefill", "h", 9001, switches=4)
    assert (inst.role, inst.epoch, inst.reported_switches) == ("prefill", 0, 4)
    # It switched to decode without this controller (the one before it began the switch): adopted.
    version = reg.version
    reg.register("i1", "http://h:1", "decode", "h", 9001, switches=5)
    assert (inst.role, inst.state, inst.epoch, inst.reported_switches) == ("decode", State.ACTIVE, 1, 5)
    assert reg.version > version
    # While this controller switches it (draining), a report of any role changes nothing.
    reg.set_state(inst, State.DRAINING, target_role="prefill")
    reg.register("i1", "http://h:1", "prefill", "h", 9001, switches=6)
    assert (inst.role, inst.state, inst.target_role) == ("decode", State.DRAINING, "prefill")
    # An instance that reports no count (an older build) is never re-roled by a heartbeat.
    other, _ = reg.register("i2", "http://h:2", "decode", "h", 9002)
    reg.register("i2", "http://h:2", "prefill", "h", 9002)
    assert other.role == "decode"


def test_bad_switch_fields_are_refused_naming_the_field():
    async def script(client, front, fakes, urls):
        a = await client.post("/prorsa/register", json=body(urls[1], "decode", switching="yes"))
        b = await client.post("/prorsa/register", json=body(urls[1], "decode", switches=-1))
        c = await client.post("/prorsa/register", json=body(urls[1], "decode", switches=True))
        return a, b, c, front

    a, b, c, front = run(script)
    assert (a.status_code, a.json()["field"]) == (422, "switching")
    assert (b.status_code, b.json()["field"]) == (422, "switches")
    assert (c.status_code, c.json()["field"]) == (422, "switches")
    assert "i1" not in front.registry.instances
