import json

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.role_switch.capacity import InstanceReport, Role
from sglang_prorsa.policy.role_switch.controller import ControllerConfig, RoleSwitchController
from sglang_prorsa.policy.role_switch.planner import PlannerConfig
from sglang_prorsa.policy.role_switch.throughput import ThroughputConfig, ThroughputEstimator


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


# ----- the controller with a θ model (issue 11) -----
import random  # noqa: E402

from sglang_prorsa.policy.role_switch.controller import ControlInputs  # noqa: E402
from sglang_prorsa.policy.role_switch.planner import NO_ROLE_SHORT, PAUSED  # noqa: E402
from sglang_prorsa.policy.role_switch.theta import ThetaConfig, ThetaModel, ThetaSample  # noqa: E402

P, D = Role.PREFILL, Role.DECODE


def flat_theta(tokens_per_s=1000.0) -> ThetaModel:
    """θ model whose new tokens cost 1/tokens_per_s and cached tokens nothing."""
    return ThetaModel(ThetaConfig(per_new_token_s=1.0 / tokens_per_s, reference_prompt_tokens=2000))


def small_cluster(n_prefill, n_decode, kv_used=0, **decode_kw):
    return [InstanceReport(f"p{i}", P) for i in range(n_prefill)] + [
        InstanceReport(f"d{i}", D, decode_kv_used=kv_used, decode_kv_capacity=100_000, **decode_kw)
        for i in range(n_decode)]


def test_cold_part_of_the_forecast_runs_at_cold_theta():
    theta = flat_theta()
    theta.observe(ThetaSample("p0", 1000, 1000, 1, 1.0))  # half the prompt cached: θ_mix = 2000, θ_cold = 1000
    controller = RoleSwitchController(ControllerConfig(), theta, ManualClock(0.0))
    # 20k warm tokens at 2000 tok/s + 10k cold at 1000 tok/s = 20 busy s for 30k tokens: θ^P = 1500, a = 2
    decision = controller.tick(ControlInputs(30_000, 0, cold_prefill_tokens=10_000), small_cluster(2, 2))
    assert decision.inputs.theta_p == pytest.approx(1500.0)
    assert decision.theta_p_cold == pytest.approx(1000.0)
    assert decision.allocation.prefill_demand == pytest.approx(2.0)
    assert decision.theta_p_measured


def test_decode_kv_away_for_a_re_prefill_still_counts_as_decodes():
    """Right after a weight update decode is empty and 100k tokens wait for a cold re-prefill; 350k tokens of KV left
    decode only to be prefilled again. a = 100k / (1000 tok/s x 10 s) = 10; b = 350k / 100k = 3.5 with the returning
    KV, 0 without: Eq. 1 over 8 instances gives 6:2 instead of 7:1, and decode holds 3.5 instances' worth."""
    def tick(returning):
        controller = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(100.0))
        return controller.tick(ControlInputs(100_000, 0, cold_prefill_tokens=100_000, prefill_backlog_tokens=100_000,
                                             decode_kv_returning=returning), small_cluster(2, 6))

    away, gone = tick(350_000), tick(0)
    assert away.inputs.decode_kv_now == 350_000 and gone.inputs.decode_kv_now == 0
    assert away.allocation.prefill_demand == pytest.approx(10.0) == gone.allocation.prefill_demand
    assert away.allocation.decode_demand == pytest.approx(3.5) and gone.allocation.decode_demand == 0.0
    assert (away.allocation.n_prefill, away.allocation.n_decode) == (6, 2)
    assert (gone.allocation.n_prefill, gone.allocation.n_decode) == (7, 1)
    assert away.demand["decode_held"] == pytest.approx(3.5) and gone.demand["decode_held"] == 0.0
    assert away.to_dict()["inputs"]["decode_kv_returning"] == 350_000


def test_one_horizon_everywhere():
    controller = RoleSwitchController(ControllerConfig(horizon_s=20.0), flat_theta(), ManualClock(0.0))
    # Ŵ^P = 60k over S = 20 s at 1000 tok/s: a = 3 with 1 prefill instance -> short.
    decision = controller.tick(ControlInputs(60_000, 0), small_cluster(1, 3))
    logged = decision.to_dict()
    assert logged["inputs"]["S"] == 20.0
    assert logged["demand"]["prefill"] == pytest.approx(3.0)
    # gain of the first move: 3 windows x 20 s x (min(2, 3.3) - 1) = 60 GPU-s, against 5 GPU-s of downtime
    first = logged["plan"]["considered"][0]
    assert first["gain_gpu_s"] == pytest.approx(60.0) and first["cost_gpu_s"] == pytest.approx(5.0)
    assert [(s["instance"], s["from"], s["to"]) for s in logged["plan"]["switches"]] == [
        ("d0", "decode", "prefill"), ("d1", "decode", "prefill")]


def test_paused_generation_holds_and_says_so():
    controller = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(0.0))
    decision = controller.tick(ControlInputs(60_000, 0, paused=True), small_cluster(1, 3))
    assert decision.plan.switches == () and decision.hold_reason == PAUSED
    assert controller.last_decision()["inputs"]["paused"] is True
    reported = small_cluster(1, 2) + [InstanceReport("d9", D, decode_kv_capacity=100_000, generation_paused=True)]
    assert controller.tick(ControlInputs(60_000, 0), reported).hold_reason == PAUSED


def test_known_burst_is_met_ahead():
    # a = 1.5 now (2 prefill cover it); 30k cold tokens land in 12 s (window 1: +3 instances): switch one decode now.
    config = ControllerConfig()
    quiet = RoleSwitchController(config, flat_theta(), ManualClock(0.0)).tick(
        ControlInputs(15_000, 0, decode_requests_forecast=0), small_cluster(2, 2, kv_used=25_000))
    assert quiet.plan.switches == () and quiet.hold_reason == NO_ROLE_SHORT
    burst = RoleSwitchController(config, flat_theta(), ManualClock(0.0)).tick(
        ControlInputs(15_000, 0, burst_prefill_tokens=30_000, burst_in_s=12.0), small_cluster(2, 2, kv_used=25_000))
    assert burst.demand["windows"]["prefill"] == pytest.approx([1.5, 4.5, 1.5])
    assert [(s.instance_id, s.dst) for s in burst.plan.switches] == [("d0", P)]
    # with the 10 % margin prefill needs 1.65, 4.95, 1.65; two instances leave 2.95 of the burst for window 2
    # (1.65 + 2.95 = 4.6), three leave 1.95 (3.6): the third instance serves one more in windows 1 and 2 = 20 GPU-s
    assert burst.plan.considered[0].gain_gpu_s == pytest.approx(20.0)


def test_a_backlog_counts_once():
    # 1 prefill + 3 decode; Ŵ^P = 60k tokens at 1000 tok/s over 10 s: a = 6. Read as a rate (no backlog given) it
    # recurs every window; as a backlog it is served once: a second prefill instance clears 1 more per window until
    # the backlog (6.6 with the margin) is gone.
    rate = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(0.0)).tick(
        ControlInputs(60_000, 0, decode_requests_forecast=0), small_cluster(1, 3))
    once = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(0.0)).tick(
        ControlInputs(60_000, 0, prefill_backlog_tokens=60_000, decode_requests_forecast=0), small_cluster(1, 3))
    assert once.demand["prefill_backlog"] == pytest.approx(6.0)
    assert rate.plan.considered[0].gain_gpu_s == pytest.approx(30.0)  # 3 windows x 10 s x 1 instance
    assert once.plan.considered[0].gain_gpu_s == pytest.approx(30.0)  # 6.6 outlasts the 3 windows with 1 or 2
    # the third instance: as a rate it serves one more each window (30); as a backlog, 2 instances clear 6 of 6.6 and
    # 3 clear all of it: only 0.6 more (6 GPU-s)
    assert rate.plan.considered[1].gain_gpu_s == pytest.approx(30.0)
    assert once.plan.considered[1].gain_gpu_s == pytest.approx(6.0)


def test_slot_demand_counts_waiting_decode_requests():
    # KV is nearly free but 90 requests want 32-slot decode instances: decode needs 90/32 = 2.8 instances.
    reports = small_cluster(2, 2, kv_used=1_000, running_requests=32, queued_requests=13, max_running_requests=32)
    decision = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(0.0)).tick(
        ControlInputs(1_000, 0, decode_requests_forecast=0), reports)
    assert decision.inputs.decode_slot_demand == pytest.approx(90 / 32)
    assert decision.allocation.decode_demand == pytest.approx(90 / 32)
    assert [s.dst for s in decision.plan.switches] == [D]


def test_decision_dict_is_json_and_explains_itself():
    controller = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(7.0))
    controller.tick(ControlInputs(60_000, 0), small_cluster(1, 3))
    logged = json.loads(json.dumps(controller.last_decision(), allow_nan=False))
    for key in ("time_s", "inputs", "allocation", "delta", "target", "plan", "demand", "costs", "hold_reason"):
        assert key in logged
    assert set(logged["costs"]) == {"p0", "d0", "d1", "d2"}
    assert logged["costs"]["d0"]["downtime_gpu_s"] == 5.0
    switch = logged["plan"]["switches"][0]
    assert {"instance_id", "instance", "from", "to", "gain_gpu_s", "cost_gpu_s"} <= set(switch)
    assert all({"gain_gpu_s", "cost_gpu_s", "accepted", "reason"} <= set(c) for c in logged["plan"]["considered"])
    assert controller.theta_snapshot()["theta_cold"] == pytest.approx(1000.0)


def test_observe_needs_a_theta_model():
    clock = ManualClock()
    legacy = RoleSwitchController(ControllerConfig(), ThroughputEstimator(ThroughputConfig(1000.0), clock), clock)
    with pytest.raises(TypeError):
        legacy.observe(ThetaSample("p0", 10, 0, 1, 1.0))
    assert RoleSwitchController(ControllerConfig(), None, clock).observe(ThetaSample("p0", 10, 0, 1, 1.0))


@pytest.mark.parametrize("field,kwargs", [
    ("prefill_tokens_forecast", dict(prefill_tokens_forecast=-1.0)),
    ("decode_kv_forecast", dict(decode_kv_forecast=float("inf"))),
    ("burst_in_s", dict(burst_in_s=-2.0)),
    ("cold_prefill_tokens", dict(cold_prefill_tokens=10.0**9)),
    ("decode_kv_returning", dict(decode_kv_returning=-1.0)),
])
def test_bad_control_inputs_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        ControlInputs(**({"prefill_tokens_forecast": 100.0, "decode_kv_forecast": 0.0} | kwargs))


def noisy_small_demand_trace(planner: PlannerConfig, ticks=60, seed=0) -> int:
    """Both demands tiny (a, b in [0.02, 0.4] instances) and noisy: Eq. 1's scale-free δ swings the target ratio
    between prefill-heavy and decode-heavy extremes. Returns the switches made over ``ticks`` control ticks."""
    clock, rng = ManualClock(0.0), random.Random(seed)
    controller = RoleSwitchController(ControllerConfig(planner=planner), flat_theta(), clock)
    roles = {f"i{k}": (P if k < 4 else D) for k in range(8)}
    since: dict[str, float] = {}
    switches = 0
    for tick in range(ticks):
        now = 10.0 * tick
        clock.set(now)
        a, b = rng.uniform(0.02, 0.4), rng.uniform(0.02, 0.4)
        reports = [InstanceReport(iid, role, decode_kv_used=int(b * 50_000) if role is D else 0,
                                  decode_kv_capacity=100_000 if role is D else 0, role_since=since.get(iid))
                   for iid, role in roles.items()]
        decision = controller.tick(ControlInputs(a * 10 * 1000, b * 50_000), reports)
        for s in decision.plan.switches:
            roles[s.instance_id], since[s.instance_id] = s.dst, now
            switches += 1
    return switches


def test_noisy_small_demand_used_to_flap_and_now_holds():
    assert noisy_small_demand_trace(PlannerConfig.unguarded()) >= 20
    assert noisy_small_demand_trace(PlannerConfig()) == 0


# ----- ticks that cannot be decided, and an empty decode role -----
from sglang_prorsa.policy.role_switch.capacity import (  # noqa: E402
    NO_DECODE_CAPACITY,
    TOO_FEW_INSTANCES,
    CannotDecide,
    InstanceStatus,
)
from sglang_prorsa.srt.common.messages import Code  # noqa: E402


def test_too_few_instances_cannot_be_decided_and_says_so():
    controller = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(0.0))
    for reports in ([], small_cluster(1, 0),
                    [InstanceReport("p0", P), InstanceReport("d0", D, status=InstanceStatus.UNHEALTHY)]):
        with pytest.raises(CannotDecide) as info:
            controller.tick(ControlInputs(1000, 0), reports)
        assert info.value.code == TOO_FEW_INSTANCES == Code.TOO_FEW_INSTANCES.value
    assert controller.last_decision() is None


def test_without_any_known_kv_pool_decode_cannot_be_sized():
    controller = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(0.0))
    switching = InstanceReport("d0", D, status=InstanceStatus.SWITCHING)  # reports no pool while switching
    with pytest.raises(CannotDecide) as info:
        controller.tick(ControlInputs(1000, 0), [InstanceReport("p0", P), InstanceReport("p1", P), switching])
    assert info.value.code == NO_DECODE_CAPACITY == Code.NO_DECODE_CAPACITY.value
    # A prefill instance's pool (same engines, same pool) is enough to size decode with.
    prefill = [InstanceReport(f"p{i}", P, prefix_cache_capacity=50_000) for i in range(2)]
    decision = controller.tick(ControlInputs(1000, 0), [*prefill, switching])
    assert decision.inputs.decode_kv_capacity == pytest.approx(50_000 * controller.config.capacity.usable_fraction)


def test_the_only_decode_instance_dying_is_refilled_from_prefill():
    """Before, a tick with no active decode instance raised (no profiled capacity in the front), so the planner never
    moved an instance into the empty decode role; now it sizes decode with the pool it last saw and refills it."""
    controller = RoleSwitchController(ControllerConfig(), flat_theta(), ManualClock(0.0))
    controller.tick(ControlInputs(2000, 50_000), small_cluster(3, 1))  # sees d0's 100k pool
    dead = InstanceReport("d0", D, status=InstanceStatus.UNHEALTHY, decode_kv_capacity=0)
    decision = controller.tick(ControlInputs(2000, 50_000), [*small_cluster(3, 0), dead])
    assert decision.inputs.decode_kv_capacity == pytest.approx(100_000 * controller.config.capacity.usable_fraction)
    assert [(s.instance_id, s.dst) for s in decision.plan.switches][:1] == [("p0", D)]
