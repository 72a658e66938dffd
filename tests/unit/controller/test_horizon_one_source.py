"""The horizon S has one source on a front: --prorsa-horizon (issue item 5).

The forecast, the allocator, the control interval (when it follows the horizon) and what /prorsa/decision and
/prorsa/info report all hold that one S; ``POST /lifecycle/config`` cannot move it (a 409 naming the field, nothing of
the body applied) -- before, it moved the forecast's S alone. The front's app is built in-process (no instance, no
lifespan) and called through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sglang_prorsa.config import ProrsaConfig, split_prorsa_flags
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.policy.role_switch.controller import ControllerConfig
from sglang_prorsa.srt.common.registry import Registry
from sglang_prorsa.srt.controller.app import Front, build_app
from sglang_prorsa.srt.controller.loop import ControlLoop


def _calls(argv: list[str], script):
    config, _ = split_prorsa_flags(argv)
    front = Front(config)
    app = build_app(front)

    async def scenario():
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front") as client:
                return front, await script(client)
        finally:
            await front.relay.close()
            await front.http.close()

    return asyncio.run(scenario())


async def _views(client: httpx.AsyncClient) -> dict:
    """S (and the control interval) as every route of the front reports it."""
    info = (await client.get("/prorsa/info")).json()
    return {"info": info["horizon_s"], "interval": info["control_interval_s"],
            "decision": (await client.get("/prorsa/decision")).json()["horizon_s"],
            "config": (await client.get("/lifecycle/config")).json()["horizon_s"],
            "forecast": (await client.get("/prorsa/forecast")).json()["horizon_s"]}


def test_a_front_reports_and_uses_the_flags_horizon_everywhere():
    front, views = _calls(["--pd-adaptive", "--prorsa-horizon", "4"], _views)
    assert views == {"info": 4.0, "interval": 4.0, "decision": 4.0, "config": 4.0, "forecast": 4.0}
    assert front.control_plane.config.horizon_s == 4.0
    assert front.loop.controller.config.horizon_s == 4.0  # Eq. 1, the planner's windows and costs
    assert front.config.control_interval_s == 4.0  # what the control loop sleeps between ticks


def test_a_set_control_interval_is_kept_beside_the_horizon():
    _, views = _calls(["--pd-static", "1:1", "--prorsa-horizon", "4", "--prorsa-control-interval", "2"], _views)
    assert views == {"info": 4.0, "interval": 2.0, "decision": 4.0, "config": 4.0, "forecast": 4.0}


def test_lifecycle_config_cannot_move_a_fronts_horizon_and_applies_nothing_of_the_refused_body():
    async def script(client):
        refused = await client.post("/lifecycle/config", json={"horizon_s": 6, "default_prompt_tokens": 100})
        after = await _views(client)
        prompt = (await client.get("/lifecycle/config")).json()["default_prompt_tokens"]
        same = await client.post("/lifecycle/config", json={"horizon_s": 4, "default_prompt_tokens": 100})
        malformed = await client.post("/lifecycle/config", json={"horizon_s": "ten"})
        return refused, after, prompt, same, malformed, await _views(client)

    front, (refused, after, prompt, same, malformed, final) = _calls(
        ["--pd-adaptive", "--prorsa-horizon", "4"], script)
    assert refused.status_code == 409
    body = refused.json()
    assert body["field"] == "horizon_s" and body["code"] == "fixed_setting" and body["index"] is None
    assert body["error"] == ("field 'horizon_s': this server's horizon S is 4 s, set by --prorsa-horizon for the "
                             "forecast, the allocation and the control interval alike; restart it with "
                             "--prorsa-horizon 6 to change it")
    assert after == {"info": 4.0, "interval": 4.0, "decision": 4.0, "config": 4.0, "forecast": 4.0}
    assert prompt is None  # refused whole: the other field of the body was not applied either
    # Posting back the S in force (e.g. what GET /lifecycle/config returned) is accepted, with the rest of the body.
    assert same.status_code == 200 and same.json()["horizon_s"] == 4.0 and same.json()["default_prompt_tokens"] == 100
    assert malformed.status_code == 422 and malformed.json()["field"] == "horizon_s"
    assert malformed.json()["code"] == "invalid"
    assert final == after and front.loop.controller.config.horizon_s == 4.0


def test_the_control_loop_refuses_a_control_plane_with_another_horizon():
    config, _ = split_prorsa_flags(["--pd-adaptive", "--prorsa-horizon", "4"])
    with pytest.raises(ValueError, match="control_plane_for"):
        ControlLoop(config, Registry(), orchestrator=None,
                    control_plane=LifecycleControlPlane(None, PredictorConfig(horizon_s=10.0)), http=None, health=None)


def test_the_horizons_default_is_declared_once():
    from sglang_prorsa import control_plane as standalone

    # The launcher's flag, the forecast's and the controller's configs and the standalone control plane's --horizon.
    assert ProrsaConfig().prorsa_horizon_s == PredictorConfig().horizon_s == ControllerConfig().horizon_s \
        == standalone.parse_args([]).horizon == DEFAULT_HORIZON_S == 10.0
