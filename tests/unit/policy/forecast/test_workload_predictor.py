"""WorkloadPredictor.forecast(now) end to end through the control plane, every source hand-computed."""

import math

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import ConfigError, PredictorConfig, apply_config_update
from sglang_prorsa.policy.forecast.profile import PrefillTimeProfile
from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.policy.lifecycle.observers import Phase


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
    # no history: exponential priors (a class with no completion lengthens its prior only by time spent past twice
    # it, stores.unfinished_tail_mean: none here); the ready sandbox r sends its first request after the ready ->
    # request prior (0.5 s): almost surely within S
    expected = 1000 * (1 - math.exp(-10 / 3)) + 2000 * (1 - math.exp(-10 / 30)) + 500 * (1 - math.exp(-10 / 0.5))
    assert fc.sources.sandbox == pytest.approx(expected)


def tool_history(cp, durations, tool="bash"):
    """Finished turns: decode 1 s, then tool_start -> next request after each duration; prompts grow by 500."""
    for k, d in enumerate(durations):
        tid = f"h{k}"
        post(cp, e(tid, "request_arrived", 0, prompt_tokens=1000), e(tid, "prefill_end", 0), e(tid, "decode_end", 1),
             e(tid, "tool_start", 1, tool=tool), e(tid, "request_arrived", 1 + d, prompt_tokens=1500),
             e(tid, "aborted", 1 + d))


def test_tool_that_outlived_its_mean_counts_with_its_censored_probability():
    cp, clock = plane(min_survival_samples=5)
    tool_history(cp, [2, 4, 6, 15, 25])  # tool -> request delays, mean 10.4 s
    post(cp, e("a", "request_arrived", 20, prompt_tokens=2000), e("a", "prefill_end", 20), e("a", "decode_end", 28),
         e("a", "tool_start", 29, tool="bash"),
         e("b", "request_arrived", 30, prompt_tokens=3000), e("b", "prefill_end", 30), e("b", "decode_end", 36),
         e("b", "tool_start", 37, tool="bash"))
    fc = cp.forecast(at=40.0)
    # Kaplan-Meier over {2, 4, 6, 15, 25} with a (11 s, past the mean) and b (3 s) censored:
    #   u=2: 6/7; u=4: 24/35; u=6: 18/35; u=15: 9/35; u=25: 0
    #   a: q = 1 - S(21^-)/S(11) = 1 - (9/35)/(18/35) = 0.5   (Eq. 10-11 with the EMA would count it in full)
    #   b: q = 1 - S(13^-)/S(3) = 1 - (18/35)/(6/7) = 0.4
    # x_hat = prompt + the mean growth through bash (500): 0.5 * 2500 + 0.4 * 3500
    assert fc.arrivals["tool"]["raw"] == pytest.approx(2650.0)
    assert fc.sources.tool == pytest.approx(2650.0) and fc.sources.sandbox == 0.0
    assert fc.prefill_arrival_tokens == pytest.approx(2650.0)  # no corrections yet


def test_tool_with_no_history_uses_the_prior_exponential():
    cp, clock = plane(tool_prior_s=15.0)
    post(cp, e("a", "request_arrived", 0, prompt_tokens=1000), e("a", "prefill_end", 1), e("a", "decode_end", 2),
         e("a", "tool_start", 2, tool="bash"), e("c", "tool_start", 3, tool="bash", prompt_tokens=900),
         e("c", "tool_end", 4))
    fc = cp.forecast(at=8.0)
    # a: memoryless prior, q = 1 - exp(-10/15), x = 1000 (no growth learned; a at 6 s and c at 5 s are not past
    # twice the prior, stores.unfinished_tail_mean); c: tool done 4 s ago, the post-tool prior 0.5 s lengthened by
    # its 3 s past twice that prior
    q_a, q_c = 1 - math.exp(-10 / 15), 1 - math.exp(-10 / 3.5)
    assert fc.sources.tool == pytest.approx(1000 * q_a + 900 * q_c)


def decode_history(cp):
    """Two finished turns: decodes of 2 s and 6 s, each followed by a tool and the next request after 1 s / 3 s."""
    post(cp, e("h1", "request_arrived", 0, prompt_tokens=1000), e("h1", "prefill_end", 0), e("h1", "decode_end", 2),
         e("h1", "tool_start", 2, tool="bash"), e("h1", "request_arrived", 3, prompt_tokens=1500), e("h1", "aborted", 3),
         e("h2", "request_arrived", 0, prompt_tokens=1000), e("h2", "prefill_end", 0), e("h2", "decode_end", 6),
         e("h2", "tool_start", 6, tool="bash"), e("h2", "request_arrived", 9, prompt_tokens=1500), e("h2", "aborted", 9))


def test_decode_return_within_the_horizon():
    cp, clock = plane(horizon_s=5.0, min_survival_samples=2,
                      prefill_profile=PrefillTimeProfile(base_s=0.0, per_token_s=1e-5))
    decode_history(cp)
    post(cp, e("L", "request_arrived", 10, prompt_tokens=2000, instance="p0"), e("L", "prefill_end", 10))
    fc = cp.forecast(at=11.0)
    # L has decoded for 1 s. Decode A in {2, 6} (L censored at 1 is not at risk at 2), then decode_end -> request
    # B in {1, 3}: A - 1 + B in {2, 4, 6, 8}, two of four < S = 5 -> q = 0.5; every response so far called a tool
    # (P(tool) = 1); x_hat = 2000 + 500
    assert fc.arrivals["decode_return"]["raw"] == pytest.approx(1250.0)
    # its prefill also ends before t + S: admission horizon h* = floor((5 - g(3000)) / dt) * dt = 4.9375; still 0.5
    assert fc.admission_horizon_s == pytest.approx(4.9375)
    assert fc.arrivals["decode_return"]["admitted_raw"] == pytest.approx(1250.0)


def test_decode_return_waits_for_a_timed_decode():
    cp, clock = plane(horizon_s=5.0)
    post(cp, e("L", "request_arrived", 10, prompt_tokens=2000), e("L", "prefill_end", 10))
    assert cp.forecast(at=11.0).arrivals["decode_return"]["raw"] == 0.0  # no decode timed yet: one-step rule
    decode_history(cp)
    assert cp.forecast(at=11.0).arrivals["decode_return"]["raw"] > 0.0


def sync_steps(cp, weights_at=None):
    """Two synchronous steps of two samples; step 1 ends at 20, step 2 launches at 50 and ends at 80."""
    for step, t0 in ((1, 0.0), (2, 50.0)):
        if step == 2 and weights_at is not None:
            post(cp, {"event": "weights_updated", "ts": weights_at, "weight_version": "1"})
        tids = [f"s{step}-{k}" for k in (1, 2)]
        post(cp, *[e(t, "sampled", t0, prompt_tokens=1000) for t in tids])
        for tid in tids:
            post(cp, e(tid, "request_arrived", t0 + 1, prompt_tokens=1000), e(tid, "prefill_end", t0 + 1),
                 e(tid, "decode_end", t0 + 2), e(tid, "reward_start", t0 + 2))
        post(cp, *[e(t, "reward_end", t0 + 30 if step == 2 else 20, accepted=True) for t in tids])


def test_sync_step_launch_after_the_learned_gap():
    cp, clock = plane(injection=InjectionConfig(InjectionPolicy.SYNC), min_class_samples=1,
                      default_prompt_tokens=None)
    sync_steps(cp)
    # learned: gap 30 s (step end 20 -> launch 50), launch delay 1 s, 2 samples per step, first prompts 1000
    assert cp.forecast(at=95.0).sources.sampler == 0.0  # 15 s into the gap: 15 + 1 s more, beyond t + 10
    fc = cp.forecast(at=105.0)  # 25 s in: the launch in 5 s, first requests 1 s later, inside the window
    assert fc.sources.sampler == pytest.approx(2 * 1000.0)
    assert fc.sampler.n_samp == pytest.approx(2.0)


def test_weights_updated_marks_the_step_boundary():
    cp, clock = plane(injection=InjectionConfig(InjectionPolicy.SYNC), min_class_samples=1,
                      default_prompt_tokens=None)
    sync_steps(cp, weights_at=45.0)  # step 2 launched 5 s after its weight update
    assert cp.forecast(at=101.0).sources.sampler == 0.0  # by the gap: 30 - 21 = 9 s, + 1 s: not before 111
    post(cp, {"event": "weights_updated", "ts": 100.0, "weight_version": "2"})
    fc = cp.forecast(at=101.0)  # weights updated at 100: launch 5 s after it, first requests at 106 < 111
    assert fc.sources.sampler == pytest.approx(2000.0) and fc.weight_version == "2"


def one_sync_step(cp):
    """One synchronous step of two samples: launched at 0, first requests 1 s later, the last reward ends at 20."""
    tids = ("s1", "s2")
    post(cp, *[e(t, "sampled", 0.0, prompt_tokens=1000) for t in tids])
    for tid in tids:
        post(cp, e(tid, "request_arrived", 1, prompt_tokens=1000), e(tid, "prefill_end", 1),
             e(tid, "decode_end", 2), e(tid, "reward_start", 2), e(tid, "reward_end", 20, accepted=True))


@pytest.mark.parametrize("prior_s, expected", [
    # Gap prior mean 60 s (exponential, memoryless): the rest of the gap has median 60 ln 2 = 41.6 s > S = 10, so the
    # batch's median share of the window is 0 (its mean would be 2 * 1000 * (1 - exp(-9 / 60)) = 279 tokens).
    (60.0, 0.0),
    # Prior mean 10 s: median 6.9 s, + the 1 s launch delay lands inside the window: the whole batch (the mean
    # would be 2 * 1000 * (1 - exp(-0.9)) = 1187 tokens).
    (10.0, 2000.0),
])
def test_sync_batch_before_any_gap_is_learned_is_forecast_at_its_median(prior_s, expected):
    cp, clock = plane(injection=InjectionConfig(InjectionPolicy.SYNC), min_class_samples=1,
                      default_prompt_tokens=None, train_gap_prior_s=prior_s)
    one_sync_step(cp)
    for at in (21.0, 45.0, 90.0):  # memoryless prior: the same at any point of the gap
        assert cp.forecast(at=at).sources.sampler == pytest.approx(expected, abs=1e-6)
    # A weights update inside the gap: the rest is the update -> launch delay (prior 1 s, median 0.7 s): the batch.
    post(cp, {"event": "weights_updated", "ts": 90.0, "weight_version": "1"})
    assert cp.forecast(at=90.5).sources.sampler == pytest.approx(2000.0)


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


def test_refresh_windows_persistence_and_wape():
    cp, clock = plane(tool_prior_s=5.0, default_prompt_tokens=1000)
    assert cp.tick()  # window [0, 10) opens with an empty forecast
    clock.set(5.0)
    post(cp, e("a", "tool_start", 5))
    clock.set(10.0)
    assert cp.tick()  # [0, 10) closes (0 vs 0); [10, 20) forecasts a: elapsed 5, prior mean 5 s
    q = 1 - math.exp(-2.0)
    assert cp.predictor.latest.lifecycle.prefill_arrival_tokens == pytest.approx(1000 * q)
    # served (combiner.py): no window compared the members yet ([0, 10) had no persistence), so persistence, 0
    assert cp.predictor.latest.prefill_arrival_tokens == 0.0
    clock.set(13.0)
    post(cp, e("a", "request_arrived", 13, prompt_tokens=1500))
    clock.set(20.0)
    assert cp.tick()  # closes [10, 20): realised 1500 vs 1000 q; persistence said 0 (window [0, 10))
    assert not cp.tick()
    fc = cp.forecast()
    assert fc.wape.lifecycle_prefill == pytest.approx(abs(1000 * q - 1500) / 1500) and fc.wape.windows == 2
    assert fc.wape.prefill == pytest.approx(1.0)  # the served forecast: 0 for 1500
    assert fc.wape.decode is None  # nothing was admitted to decode yet: WAPE is undefined, reported as null
    base = fc.baseline
    assert base.prefill == pytest.approx(1.0) and base.windows == 1  # persistence forecast 0 for 1500
    assert base.prefill_arrival_tokens == 1500  # its forecast for [20, 30): what [10, 20) saw
    assert base.forecast_prefill == pytest.approx(1.0)  # served, on persistence's windows
    assert base.lifecycle_prefill == pytest.approx(abs(1000 * q - 1500) / 1500)
    assert fc.bias_prefill == 1.0  # two scored windows: the gate needs bias_gate_min_windows before any correction
    d = fc.to_dict()
    for key in ("t", "horizon_s", "prefill_tokens", "prefill_arrival_tokens", "decode_admission_tokens",
                "decode_kv_tokens", "decode_kv_current_tokens", "sources", "raw", "bias", "sampler", "wape",
                "live_trajectories", "rejected_events", "states", "baseline", "paused", "arrivals"):
        assert key in d
    assert set(d["sources"]) == {"sampler", "sandbox", "ready", "tool", "inflight"}
    assert set(d["wape"]) >= {"prefill", "decode"} and d["horizon_s"] == 10.0
    assert d["baseline"]["method"] == "persistence" and d["baseline"]["wape"]["prefill"] == pytest.approx(1.0)
    assert d["baseline"]["ratio"]["prefill"] == pytest.approx(1.0)


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


def test_episodes_that_never_come_back_stop_counting_without_reward_hints():
    """A trainer that sends no reward hints: every single-turn episode ends in `decoded` and stays there. With the
    prior exponential alone each kept a 1 - exp(-S / prior) chance of a next request in every window (200 dead
    episodes: ~200,000 tokens forecast every window); their time at risk now lengthens the prior (stores.py)."""
    cp, clock = plane(tool_prior_s=5.0, default_prompt_tokens=1000)  # decode_end -> next request: the tool prior

    def episode(k: int) -> None:
        t = k * 0.5
        post(cp, e(f"d{k}", "request_arrived", t, prompt_tokens=1000), e(f"d{k}", "prefill_end", t),
             e(f"d{k}", "decode_end", t + 1))

    for k in range(3):
        episode(k)
    early = cp.forecast(at=2.0).arrivals["decode_return"]["raw"]
    for k in range(3, 200):
        episode(k)
    late = cp.forecast(at=600.0).arrivals["decode_return"]["raw"]
    # at 2 s: 3 decoded for 1, 0.5 and 0 s: the prior, 5 s, as it is (none past twice it)
    assert early == pytest.approx(3 * 1000 * (1 - math.exp(-10 / 5.0)), rel=1e-9)
    # at 600 s: 200 decoded for 499.5-599 s, 107,850 s past twice the prior in all: q = 1 - exp(-10 / 107,855) each
    assert late == pytest.approx(200 * 1000 * (1 - math.exp(-10 / 107_855)), rel=1e-6)
    assert late < 20.0


def test_live_items_far_past_every_completion_lengthen_the_tail():
    cp, clock = plane(min_survival_samples=5)
    tool_history(cp, [2, 4, 6, 15, 25])  # completed tool -> request delays; the last at 25 s
    post(cp, *(e(f"z{k}", "tool_start", 0, tool="bash", prompt_tokens=1000) for k in range(50)))
    fc = cp.forecast(at=1000.0)
    # 50 tools running 1000 s, far past the last completion (25 s): 50 * 975 s at risk past it lengthen the tail's
    # mean to 10.4 + 48,750 s (the completed mean alone: 10.4 s, q = 0.62 each)
    q = 1 - math.exp(-10 / (50 * 975 + 10.4))
    assert fc.sources.tool == pytest.approx(50 * 1000 * q, rel=1e-3)


def test_a_response_still_decoded_after_the_trainers_tool_start_lag_is_a_finished_episode():
    """The trainer reports tool_start (0.1 s after decode_end) but no rewards: an episode's last response stays
    DECODED for good. Conditioned on its own dwell (decode_end -> tool_start, terms.py), responses decoded 30 s ago
    are hardly expected back; conditioned on the whole decode -> request delay (tools of 2-59 s) they would be."""
    cp, clock = plane(min_survival_samples=5, default_prompt_tokens=1000)
    for k in range(20):  # turns that continued: decode_end, tool_start 0.1 s later, the next request 2-59 s after
        t, tool_s = float(k), 2.0 + 3 * k
        post(cp, e(f"h{k}", "request_arrived", t, prompt_tokens=1000), e(f"h{k}", "prefill_end", t),
             e(f"h{k}", "decode_end", t + 1), e(f"h{k}", "tool_start", t + 1.1, tool="bash"),
             e(f"h{k}", "request_arrived", t + 1.1 + tool_s, prompt_tokens=1500), e(f"h{k}", "aborted", t + 1.2 + tool_s))
    stats = cp.predictor.stats
    assert stats.tool_start_reported == [20, 20] and stats.stores[Phase.HANDOFF].classes[(1,)].count == 20
    for k in range(10):  # ten episodes whose last response came 30 s ago: no tool_start followed, no reward hint
        post(cp, e(f"old{k}", "request_arrived", 80, prompt_tokens=1000), e(f"old{k}", "prefill_end", 80),
             e(f"old{k}", "decode_end", 81))
    stale = cp.forecast(at=111.0).arrivals["decode_return"]["raw"]
    stats.tool_start_reported[0] = 0  # as if the trainer sent no tool_start: the whole decode -> request delay
    phase_only = cp.forecast(at=111.0).arrivals["decode_return"]["raw"]
    stats.tool_start_reported[0] = 20
    # the hand-off's tail: mean 0.1 s + 10 x 29.9 s at risk past the last hand-off, so q <= 1 - exp(-10 / 299)
    assert stale <= 10 * 1500 * (1 - math.exp(-10 / 299.0)) and stale < phase_only / 5
    post(cp, e("new", "request_arrived", 111, prompt_tokens=1000), e("new", "prefill_end", 111),
         e("new", "decode_end", 111.95))
    fresh = cp.forecast(at=112.0).arrivals["decode_return"]["raw"]
    # "new" (0.05 s decoded): 20 of the 30 responses seen handed off (at 0.1 s), the 10 old ones never did, so it
    # hands off with probability 2/3 (the product limit); then its tool returns within S with the tools' odds (the
    # 2, 5 and 8 s tools of 20); x = 1000 + 500 of learned growth; every response seen continued, so P(tool) = 1
    assert fresh - stale == pytest.approx(1500.0 * 2 / 3 * 3 / 20, rel=1e-3)  # (the old ones: 1 s more at risk)


def test_a_first_batch_of_sandboxes_is_counted_with_the_prior_until_it_has_run_well_past_it():
    """The demo's surge: 180 agents start their sandboxes together, the first the class has seen. Their time at risk
    says nothing against the 3 s prior until they have run past twice it (counted from zero, 2.5 s each made the
    prior 453 s and the surge vanished from the forecast)."""
    cp, clock = plane(prewarm_startup_prior_s=3.0)
    post(cp, *(e(f"s{k}", "sandbox_start", 0, mode="prewarm", prompt_tokens=800) for k in range(180)))
    assert cp.forecast(at=2.5).sources.sandbox == pytest.approx(180 * 800 * (1 - math.exp(-10 / 3)))
    # still none started after 16 s: 180 x 10 s past twice the prior lengthen it to 1,803 s
    assert cp.forecast(at=16.0).sources.sandbox == pytest.approx(180 * 800 * (1 - math.exp(-10 / 1803)), rel=1e-6)
