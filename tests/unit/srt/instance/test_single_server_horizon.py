"""A single server (``launch_server`` without a mode) builds its control plane with --prorsa-horizon (issue item 5:
it used the default 10 s whatever the flag said), and, like a front, keeps it against ``POST /lifecycle/config``.

``mount_lifecycle`` is what ``install`` calls for a server without a controller; here it mounts on a bare
FastAPI app (no SGLang), called through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from sglang_prorsa.config import Mode, split_prorsa_flags
from sglang_prorsa.srt.instance.install import mount_lifecycle


def test_a_single_server_takes_its_horizon_from_the_flag_and_keeps_it():
    config, rest = split_prorsa_flags(["--prorsa-horizon", "4", "--model-path", "m"])
    assert config.mode is Mode.SINGLE and rest == ["--model-path", "m"]
    app = FastAPI()
    control_plane = mount_lifecycle(app, config)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://single") as client:
            before = (await client.get("/lifecycle/config")).json()["horizon_s"]
            forecast = (await client.get("/prorsa/forecast")).json()["horizon_s"]
            moved = await client.post("/lifecycle/config", json={"horizon_s": 10})
            kept = await client.post("/lifecycle/config", json={"horizon_s": 4.0, "kv_page_size": 16})
            after = (await client.get("/lifecycle/config")).json()
        return before, forecast, moved, kept, after

    try:
        assert control_plane.running  # the refresher runs, as on the server
        before, forecast, moved, kept, after = asyncio.run(scenario())
    finally:
        control_plane.stop()
    assert control_plane.config.horizon_s == 4.0
    assert before == forecast == 4.0
    assert moved.status_code == 409 and moved.json()["field"] == "horizon_s"
    assert moved.json()["code"] == "fixed_setting"
    assert kept.status_code == 200 and after["horizon_s"] == 4.0 and after["kv_page_size"] == 16
