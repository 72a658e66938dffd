import json

import pytest

from sglang_prorsa.srt.role_switch.capacity import InstanceReport, Role
from sglang_prorsa.srt.role_switch.controller import ControllerConfig, RoleSwitchController
from sglang_prorsa.srt.role_switch.planner import PlannerConfig
from sglang_prorsa.srt.role_switch.throughput import ThroughputConfig, ThroughputEstimator
from sglang_prorsa.srt.utils.clock import ManualClock


def cluster():
    return [InstanceReport(f"p{i}", Role.PREFILL, queued_prompt_tokens=100 * i) for i in range(6)] + [
        InstanceReport(f"d{i}", Role.DECODE, decode_kv_used=10_000, decode_kv_capacity=100_000) for i in range(2)
    ]


def test_step_logs_every_input_of_eq1():
    clock = ManualClock(50.0)
    estimator = ThroughputEstimator(ThroughputConfig(profiled_theta=1000.0), clock)
    controller = RoleSwitchController(ControllerConfig(horizon_s=10.0), estimator, clock)
    assert controller.last_decision() is None
    profile = estimator.profile_of(1000)

    # Ŵ^P = 30k tokens at 1000 tok/s over 10 s -> a = 3; K^D_t = 20k + K̂^D = 280k over 100k -> b = 3; G = 8.
    decision = controller.step(30_000, 280_000, cluster(), profile)
    assert (decision.allocation.n_prefill, decision.allocation.n_decode) == (4, 4)

    logged = json.loads(json.dumps(controller.last_decision(), allow_nan=False))
    inputs = logged["inputs"]
    assert (inputs["W_P"], inputs["theta_P"], inputs["K_D_now"], inputs["K_D_forecast"], inputs["C_D_KV"]) == (
        30_000, 1000.0, 20_000, 280_000, 100_000
    )
    assert inputs["theta_P_measured"] is False and inputs["G"] == 8 and logged["time_s"] == 50.0
    assert logged["delta"] == pytest.approx(1 / 3)
    assert logged["target"] == {"prefill": 4, "decode": 4}
    # Two least-loaded prefill instances (p0, p1) go to decode.
    assert [(s["instance_id"], s["from"], s["to"]) for s in logged["plan"]["switches"]] == [
        ("p0", "prefill", "decode"), ("p1", "prefill", "decode")
    ]


def test_measured_theta_replaces_profile():
    clock = ManualClock()
    estimator = ThroughputEstimator(ThroughputConfig(profiled_theta=1000.0), clock)
    controller = RoleSwitchController(ControllerConfig(), estimator, clock)
    estimator.start("p0", "r", 1000)
    clock.advance(0.5)
    estimator.finish("p0", "r")
    decision = controller.step(30_000, 0, cluster(), estimator.profile_of(1000))
    assert decision.inputs.theta_p == pytest.approx(2000.0)
    assert decision.theta_p_measured


def test_minimums_must_agree():
    with pytest.raises(ValueError):
        ControllerConfig(planner=PlannerConfig(min_prefill=0))
