"""WorkloadPredictor.forecast(now) end to end through the control plane, every source hand-computed."""

import math

import pytest

from sglang_prorsa.srt.forecast.config import ConfigError, PredictorConfig, apply_config_update
from sglang_prorsa.srt.forecast.profile import PrefillTimeProfile
from sglang_prorsa.srt.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane
from sglang_prorsa.srt.utils.clock import ManualClock


def plane(**cfg):
    base = dict(horizon_s=10.0, default_prompt_tokens=3000, prefill_instances=("p0", "p1"),
                prefill_profile=PrefillTimeProfile(base_s=0.0, per_token_s=0.001))
    base.update(cfg)
    clock = ManualClock(0.0)
    return LifecycleControlPlane(clock, PredictorConfig(**base)), clock


def post(cp, *events):
    result = cp.ingest_payload({"events": list(events)})
    assert result.rejected == 0, result.rejections
    return result


def e(tid, event, ts, **kw):
    return {"trajectory_id": tid, "event": event, "ts": ts, **kw}


def test_ready_inflight_and_decode_admissions_over_two_instances():
    cp, clock = plane(kv_page_size=64)
    post(cp,
         e("a", "request_arrived", 0, prompt_tokens=1000, instance="p0"), e("a", "prefill_start", 0, instance="p0"),
         e("b", "request_arrived", 0, prompt_tokens=2000, instance="p0"),
         e("c", "request_arrived", 0, prompt_tokens=500, instance="p1"),
         e("d", "request_arrived", 0, prompt_tokens=4000, instance="p1"),
         e("x", "request_arrived", 0, prompt_tokens=8000, instance="p0"))
    fc = cp.forecast(at=0.5)
    assert fc.sources.inflight == 1000 and fc.sources.ready == 14500
    assert fc.sources.sampler == fc.sources.sandbox == fc.sources.tool == 0
    assert fc.prefill_tokens == 15500
    # a finishes at 0 + g(1000) = 1.0; b: 1 + 2 = 3; c: 0.5 + 0.5 = 1; d: 1 + 4 = 5; x: 3 + 8 = 11 >= 10.5
    assert fc.decode_admission_tokens == 7500
    assert fc.decode_kv_tokens == 1024 + 2048 + 512 + 4032
    assert fc.live_trajectories == 5


def test_sandbox_startup_conditional_on_mode():
    cp, clock = plane(prewarm_startup_prior_s=3.0, cold_startup_prior_s=30.0)
    post(cp, e("w", "sandbox_start", 0, mode="prewarm", prompt_tokens=1000),
         e("c", "sandbox_start", 0, mode="cold", prompt_tokens=2000),
         e("r", "sandbox_start", 0, mode="prewarm", prompt_tokens=500), e("r", "sandbox_ready", 1))
    fc = cp.forecast(at=2.0)
    # no history: exponential priors; ready sandboxes count fully (their first request is being dispatched)
    expected = 1000 * (1 - math.exp(-10 / 3)) + 2000 * (1 - math.exp(-10 / 30)) + 500
    assert fc.sources.sandbox == pytest.approx(expected)


def test_tool_residual_against_horizon():
    cp, clock = plane(tool_prior_s=15.0)
    post(cp, e("a", "request_arrived", 0, prompt_tokens=1000), e("a", "prefill_end", 1), e("a", "decode_end", 2),
         e("a", "tool_start", 2, tool="bash"),
         e("b", "request_arrived", 0, prompt_tokens=700), e("b", "prefill_end", 1), e("b", "decode_end", 2),
         e("b", "tool_start", 6, tool="bash"))
    # prior tau = 15: a: r = 15 - 6 = 9 < 10 -> counts its last prompt (no growth learned yet); b: r = 15 - 2 = 13 -> no
    assert cp.forecast(at=8.0).sources.tool == 1000
    post(cp, e("c", "request_arrived", 0, prompt_tokens=400), e("c", "prefill_end", 1), e("c", "decode_end", 2),
         e("c", "tool_start", 3, tool="bash", prompt_tokens=900), e("c", "tool_end", 4))
    # c's tool took 1 s: the EMA (first sample initialises it) now says tau = 1, so a and b are both due (r = 0),
    # and c (tool ended, next request imminent) counts the trainer's estimate 900
    assert cp.forecast(at=8.0).sources.tool == 1000 + 700 + 900


def test_sampler_with_censored_reward_and_shortened_horizon():
    cp, clock = plane()
    for i, (dur, ok) in enumerate([(2, True), (4, False), (6, True), (8, False)]):
        post(cp, e(f"r{i}", "reward_start", 0, task="t"), e(f"r{i}", "reward_end", dur, accepted=ok))
    post(cp, e("L", "sampled", 0), e("L", "request_arrived", 5, prompt_tokens=10), e("L", "aborted", 5))
    post(cp, e("X", "reward_start", 10, task="t"))
    fc = cp.forecast(at=13.0)
    # p_hat = 0.5; d_hat = 5 -> S_pw = 5. KM over {2,4,6,8} with X censored at e = 3:
    # S(3) = 0.8, S(8^-) = 0.8 * 2/3 * 1/2 = 0.2667 -> q(S_pw) = 2/3; q(S) = 1 - S(13^-)/S(3) = 1
    assert fc.p_hat == 0.5 and fc.launch_delay_s == 5.0
    assert fc.sampler.n_pass == pytest.approx(0.5)
    assert fc.sampler.launch_horizon_s == 5.0
    assert fc.sampler.n_launch == pytest.approx(1 / 3)
    assert fc.sources.sampler == pytest.approx(1000.0)


def test_group_injection_waits_for_whole_group():
    cp, clock = plane(injection=InjectionConfig(InjectionPolicy.GROUP, group_size=4), reward_prior_s=10.0)
    post(cp, e("a", "reward_start", 0, group_id="g"), e("b", "tool_start", 0, group_id="g"))
    assert cp.forecast(at=0.0).sampler.n_samp == 0.0  # b is outside reward: the group cannot complete
    post(cp, e("b", "reward_start", 0))
    q = 1 - math.exp(-1.0)  # prior mean 10 s over S = 10
    assert cp.forecast(at=0.0).sampler.n_samp == pytest.approx(4 * q * q)


def test_refresh_windows_bias_and_wape():
    cp, clock = plane(tool_prior_s=5.0, default_prompt_tokens=1000)
    assert cp.tick()  # window [0, 10) opens with an empty forecast
    clock.set(5.0)
    post(cp, e("a", "tool_start", 5))
    clock.set(10.0)
    assert cp.tick()  # [0, 10) closes (0 vs 0: no bias update); [10, 20) forecasts a: r = 5 - 5 = 0 -> 1000 tokens
    assert cp.predictor.latest.prefill_arrival_tokens == 1000
    clock.set(13.0)
    post(cp, e("a", "request_arrived", 13, prompt_tokens=1500))
    clock.set(20.0)
    assert cp.tick()  # closes [10, 20): realised 1500 vs 1000 -> bias 1.5, WAPE 500/1500
    assert not cp.tick()
    post(cp, e("b", "tool_start", 20))
    fc = cp.forecast()
    assert fc.bias_prefill == pytest.approx(1.5)
    assert fc.sources.tool == pytest.approx(1000)  # raw source values stay uncorrected
    assert fc.prefill_arrival_tokens == pytest.approx(1500)
    assert fc.prefill_tokens == pytest.approx(1500 + 1500)  # a's request is backlog (ready), b's arrival corrected
    assert fc.wape.prefill == pytest.approx(1 / 3) and fc.wape.windows == 2
    assert fc.wape.decode is None  # nothing was admitted to decode yet: WAPE is undefined, reported as null
    # decode: 1000 forecast, 0 realised -> 0/1000 clipped to 0.5; raw A_D now = a (ready, 20 + 1.5) + b (25 + 1)
    assert fc.bias_decode == 0.5 and fc.decode_admission_tokens == pytest.approx(0.5 * (1500 + 1000))
    d = fc.to_dict()
    for key in ("t", "horizon_s", "prefill_tokens", "decode_admission_tokens", "decode_kv_tokens", "sources", "bias",
                "wape", "live_trajectories", "rejected_events"):
        assert key in d
    assert set(d["sources"]) == {"sampler", "sandbox", "ready", "tool", "inflight"}
    assert set(d["wape"]) >= {"prefill", "decode"}


def test_config_updates_validate_fields():
    cfg = apply_config_update(PredictorConfig(), {"horizon_s": 5, "injection": {"policy": "fixed_rate", "rate_per_s": 2},
                                                  "default_prompt_tokens": 4096, "prefill_instances": [0, "p1"],
                                                  "prefill_profile": {"points": [[1000, 0.1], [2000, 0.3]]}})
    assert cfg.horizon_s == 5.0 and cfg.injection.rate_per_s == 2.0 and cfg.prefill_instances == ("0", "p1")
    assert cfg.prefill_profile(1500) == pytest.approx(0.2)
    for bad, field in [({"horizon_s": -1}, "horizon_s"), ({"injection": "sometimes"}, "injection.policy"),
                       ({"injection": {"policy": "group"}}, "injection"), ({"colour": 1}, "colour"),
                       ({"prefill_profile": {"points": [[1, "x"]]}}, "prefill_profile.points"),
                       ({"default_prompt_tokens": 1.5}, "default_prompt_tokens")]:
        with pytest.raises(ConfigError) as err:
            apply_config_update(PredictorConfig(), bad)
        assert err.value.field == field
