"""The served forecast (combiner.py, local_level.py): hand-computed weights, selection, the Kalman member, a regime
change, bad inputs, and the wiring through the predictor (unscored windows, the served fields, the allocation's W_P)."""

from __future__ import annotations

import math

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.combiner import MEMBERS, ForecastCombiner
from sglang_prorsa.policy.forecast.config import ConfigError, PredictorConfig, apply_config_update
from sglang_prorsa.policy.forecast.local_level import LocalLevelKalman
from sglang_prorsa.policy.forecast.predictor import jumped, surging
from sglang_prorsa.policy.forecast.profile import PrefillTimeProfile
from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy


def window(c: ForecastCombiner, realised: float, lifecycle: float, persistence: float | None):
    """What the predictor does per window: serve at the start, score the members' forecasts at the close."""
    served = c.serve(lifecycle, persistence)
    c.observe(realised, {m: r.forecast for m, r in served.members.items()})
    return served


# ----- the Kalman member -----
def test_kalman_first_predictions_by_hand():
    k = LocalLevelKalman(noise_half_life_windows=1.0)  # moments discounted by 1/2 per window
    assert k.forecast is None
    k.observe(1000.0)
    assert k.forecast == 1000.0  # the first observation is the level (diffuse start)
    k.observe(1100.0)
    # d = 100, m0 = 100^2, no lag-one moment yet: s_eps = s_eta = m0 / 3; P_pred = s_eps + s_eta = 2 m0 / 3,
    # F = m0, K = 2/3: a = 1000 + 2/3 * 100, P = 1/3 * 2 m0 / 3 = 20000 / 9
    assert k.gain == pytest.approx(2 / 3) and k.forecast == pytest.approx(3200 / 3)
    assert k.variance == pytest.approx(20000 / 9)
    k.observe(1000.0)
    # d = -100: m0 = (0.5 * 1e4 + 1e4) / 1.5 = 1e4, m1 = 100 * -100 = -1e4: s_eps = min(1e4, m0 / 2) = 5000,
    # s_eta = m0 - 2 s_eps = 0; P_pred = 20000/9, F = 20000/9 + 5000 = 65000/9, K = 4/13
    assert k.noise() == pytest.approx((5000.0, 0.0))
    assert k.gain == pytest.approx(4 / 13)
    assert k.forecast == pytest.approx(3200 / 3 + 4 / 13 * (1000 - 3200 / 3))  # = 40800 / 39 = 1046.15
    assert k.variance == pytest.approx(20000 / 13)


def test_kalman_follows_a_jump_at_once_on_a_flat_series():
    k = LocalLevelKalman()
    for y in [1000.0] * 5 + [3000.0]:
        k.observe(y)
    # flat: every increment 0, so m1 = 0 -> s_eps = 0, and the jump's increment makes s_eta > 0: K = 1
    assert k.gain == 1.0 and k.forecast == 3000.0


def test_kalman_does_not_freeze_at_a_spike_on_a_flat_series():
    """A flat series, one spike, then a gap (a sync step's launch after steady windows): the spike is taken whole
    (no noise known yet, K = 1), and once its increments make the noise known the level is as uncertain as that one
    observation, so the gap pulls it down (it was frozen at the spike when P stayed 0)."""
    k = LocalLevelKalman(noise_half_life_windows=1.0)
    for y in [1000.0] * 4 + [10000.0]:
        k.observe(y)
    assert k.gain == 1.0 and k.forecast == 10000.0 and k.variance is None
    k.observe(0.0)
    # increments 0, 0, 0, 9000, -10000 with weights halving: m0 = (0.5 * 9000^2 + 10000^2) / 1.9375 (the zeros add
    # weight only), m1 = (0.5 * 0 + 9000 * -10000) / 1.875: s_eps = min(90e6 / 1.875, m0 / 2) = m0 / 2, s_eta = 0;
    # P = s_eps (diffuse), F = 2 s_eps: K = 1/2 and the level halves
    m0 = (0.5 * 9000.0 ** 2 + 10000.0 ** 2) / 1.9375
    assert k.noise() == pytest.approx((m0 / 2, 0.0))
    assert k.gain == pytest.approx(0.5) and k.forecast == pytest.approx(5000.0)


def test_kalman_ignores_non_finite_values():
    k = LocalLevelKalman()
    k.observe(1000.0)
    assert not k.observe(math.nan) and not k.observe(math.inf)
    assert k.forecast == 1000.0 and k.sq_weight == 0.0


# ----- serving before and after scores -----
def test_before_any_score_persistence_if_it_exists_else_lifecycle():
    c = ForecastCombiner(start_guarded=False)
    first = c.serve(500.0, None)
    assert (first.member, first.value) == ("lifecycle", 500.0)
    assert first.members["lifecycle"].weight == 1.0 and first.members["timeseries"].forecast is None
    second = c.serve(500.0, 800.0)
    assert (second.member, second.value) == ("persistence", 800.0)
    assert all(r.wape is None and r.recent_wape is None for r in second.members.values())
    assert ForecastCombiner(members=("lifecycle", "timeseries")).serve(500.0, 800.0).member == "lifecycle"


def test_the_member_clearly_ahead_on_the_same_windows_is_selected():
    c = ForecastCombiner(half_life_windows=1.0, selection_margin=0.2, noise_half_life_windows=1.0,
                         start_guarded=False)  # delta = 1/2; the weights alone (the guard: further down)
    assert window(c, 1000.0, lifecycle=1200.0, persistence=None).member == "lifecycle"
    # window 0 is in no recent WAPE (persistence and the Kalman filter had no forecast): nothing ranked yet
    served = window(c, 1100.0, lifecycle=1200.0, persistence=1000.0)
    assert (served.member, served.value) == ("persistence", 1000.0)
    assert served.members["timeseries"].forecast == 1000.0  # the Kalman filter's first level: the first value
    # window 1: every member erred by 100 on 1100: equal recent WAPEs, equal weights
    served = window(c, 1000.0, lifecycle=1200.0, persistence=1100.0)
    kalman = 1000 + 2 / 3 * 100  # K = 2/3 on the second observation (test above)
    assert served.member == "blend" and served.value == pytest.approx((1200 + 1100 + kalman) / 3)
    assert [r.weight for r in served.members.values()] == pytest.approx([1 / 3] * 3)
    assert served.members["lifecycle"].recent_wape == pytest.approx(100 / 1100)
    # window 2 (realised 1000): errors lifecycle 200, persistence 100, timeseries 200/3; discounted sums
    # E = 0.5 * 100 + e, R = 0.5 * 1100 + 1000 = 1550: 250/1550, 150/1550, (350/3)/1550. The Kalman filter leads,
    # and persistence is clearly behind it: 0.8 * 150 = 120 > 116.7
    served = c.serve(1200.0, 1000.0)
    rep = served.members
    assert rep["lifecycle"].recent_wape == pytest.approx(250 / 1550)
    assert rep["persistence"].recent_wape == pytest.approx(150 / 1550)
    assert rep["timeseries"].recent_wape == pytest.approx(350 / 3 / 1550)
    assert served.member == "timeseries" and rep["timeseries"].weight == 1.0
    assert served.value == pytest.approx(40800 / 39)  # the Kalman filter's third level (test above)
    # running WAPE since start, each over its own windows: lifecycle 0-2, the others 1-2
    assert rep["lifecycle"].wape == pytest.approx(500 / 3100) and rep["persistence"].wape == pytest.approx(200 / 2100)
    assert rep["timeseries"].wape == pytest.approx((100 + 200 / 3) / 2100)


def test_close_members_are_blended_with_inverse_square_weights():
    c = ForecastCombiner(half_life_windows=1.0, selection_margin=0.2, members=("lifecycle", "persistence"),
                         start_guarded=False)
    c.observe(1000.0, {"lifecycle": 1100.0, "persistence": 1050.0})
    # recent WAPE 0.1 and 0.05: 0.8 * 0.1 > 0.05, lifecycle is clearly behind -> persistence alone
    assert c.serve(1000.0, 1000.0).member == "persistence"
    c.observe(1000.0, {"lifecycle": 1000.0, "persistence": 1030.0})
    # E: lifecycle 0.5 * 100 + 0 = 50, persistence 0.5 * 50 + 30 = 55, same R: lifecycle leads, persistence is
    # within the margin (0.8 * 55 <= 50): weights 1/50^2 : 1/55^2 = 3025 : 2500
    served = c.serve(1200.0, 1000.0)
    assert served.member == "blend"
    assert served.members["lifecycle"].weight == pytest.approx(3025 / 5525)
    assert served.members["persistence"].weight == pytest.approx(2500 / 5525)
    assert served.value == pytest.approx((3025 * 1200 + 2500 * 1000) / 5525)  # 1109.5
    assert served.members["timeseries"].weight == 0.0 and served.members["timeseries"].forecast == 1000.0


def test_a_regime_change_is_followed_within_two_windows():
    c = ForecastCombiner(start_guarded=False)  # the defaults: half-life 4 windows, margin 0.2
    served = [window(c, y, lifecycle=1000.0, persistence=p)  # a lifecycle forecast that misses the change
              for y, p in zip([1000.0] * 8 + [3000.0] * 4, [None] + [1000.0] * 8 + [3000.0] * 3)]
    assert [s.value for s in served[:9]] == pytest.approx([1000.0] * 9)  # nobody saw the jump coming
    # window 9: every member erred by 2000 on window 8 and by 0 before: nothing separates them yet, so they are
    # blended; persistence and the Kalman filter (K = 1 on a flat series, above) already say 3000
    # (the same windows, the same errors: equal weights)
    assert served[9].member == "blend" and served[9].value == pytest.approx((1000 + 3000 + 3000) / 3)
    # window 10 on: lifecycle's second miss puts it clearly behind; persistence and timeseries are exact
    for s in served[10:]:
        assert s.value == pytest.approx(3000.0) and s.members["lifecycle"].weight == 0.0


def test_non_finite_inputs_do_not_poison_the_state():
    c = ForecastCombiner(half_life_windows=1.0)
    assert not c.observe(math.nan, {"lifecycle": 10.0}) and not c.observe(-5.0, {"lifecycle": 10.0})
    assert c.windows == 0 and c.kalman.forecast is None
    assert c.observe(1000.0, {"lifecycle": math.nan, "persistence": 900.0, "timeseries": math.inf})
    assert c.scores["lifecycle"].total_realised == 0.0 and c.scores["timeseries"].total_realised == 0.0  # unscored
    assert c.scores["persistence"].total_error == 100.0
    assert all(s.count == 0.0 for s in c.scores.values())  # not every member had a forecast: no recent WAPE moves
    served = c.serve(math.nan, math.inf)  # neither usable: the Kalman member has no score yet -> lifecycle, 0
    assert served.value == 0.0 and served.member == "lifecycle"
    assert c.serve(-50.0, None).value == 0.0  # never negative


def test_the_prior_is_served_before_any_score():
    launch = ForecastCombiner(prior="lifecycle", robust=False)  # the launch regime's: only the lifecycle forecast models a launch
    served = launch.serve(4000.0, 1000.0)
    assert (served.member, served.value) == ("lifecycle", 4000.0) and served.members["persistence"].weight == 0.0
    with pytest.raises(ValueError, match="prior"):
        ForecastCombiner(prior="timeseries")


# ----- through the predictor and the control plane -----
def plane(**cfg):
    base = dict(horizon_s=10.0, default_prompt_tokens=1000, prefill_instances=("p0",),
                injection=InjectionConfig(InjectionPolicy.NONE),
                prefill_profile=PrefillTimeProfile(base_s=0.0, per_token_s=0.001))
    clock = ManualClock(0.0)
    return LifecycleControlPlane(clock, PredictorConfig(**(base | cfg))), clock


def post(cp, *events):
    result = cp.ingest_payload({"events": list(events)})
    assert result.rejected == 0, result.rejections


def one_turn(cp, tid: str, t: float, prompt: int = 1000) -> None:
    """A trajectory that arrives, is prefilled (a decode admission), decodes and finishes within a second."""
    post(cp, {"trajectory_id": tid, "event": "request_arrived", "ts": t, "prompt_tokens": prompt, "instance": "p0"},
         {"trajectory_id": tid, "event": "prefill_start", "ts": t, "instance": "p0"},
         {"trajectory_id": tid, "event": "prefill_end", "ts": t + 0.2},
         {"trajectory_id": tid, "event": "decode_end", "ts": t + 0.5},
         {"trajectory_id": tid, "event": "reward_start", "ts": t + 0.5},
         {"trajectory_id": tid, "event": "reward_end", "ts": t + 0.8, "accepted": True})


def test_served_fields_reach_the_json_and_the_allocation_input():
    cp, clock = plane()
    assert cp.tick()  # [0, 10) opens: nothing live, lifecycle 0, no persistence -> lifecycle served
    for k in range(3):  # 1000 prompt tokens arrive and are admitted to decode in every window
        clock.set(10.0 * k + 2)
        one_turn(cp, f"t{k}", 10.0 * k + 2)
        clock.set(10.0 * (k + 1))
        assert cp.tick()
    # served at the windows' starts: 0 (lifecycle: no persistence yet), 1000 (persistence: [0, 10) is in no recent
    # WAPE, persistence and timeseries had no forecast for it), 1000 (persistence and timeseries exact on [10, 20),
    # lifecycle missed by 1000)
    fc = cp.forecast()
    assert fc.wape.prefill == pytest.approx(1000 / 3000) and fc.wape.lifecycle_prefill == pytest.approx(1.0)
    assert fc.baseline.forecast_prefill == 0.0 and fc.baseline.lifecycle_prefill == 1.0
    clock.set(31.0)
    post(cp, {"trajectory_id": "r", "event": "request_arrived", "ts": 31.0, "prompt_tokens": 700, "instance": "p0"})
    fc = cp.forecast()
    assert fc.sources.backlog == 700.0
    assert fc.prefill_arrival_tokens == pytest.approx(1000.0)  # served: persistence and timeseries, 1000 each
    assert fc.prefill_tokens == fc.sources.backlog + fc.prefill_arrival_tokens  # what the allocation reads
    assert fc.lifecycle.prefill_tokens == fc.sources.backlog + fc.lifecycle.prefill_arrival_tokens
    assert fc.decode_admission_tokens == pytest.approx(1000.0) and fc.lifecycle.decode_admission_tokens >= 700.0
    assert fc.decode_kv_tokens == pytest.approx(1000.0)  # page size 1: one KV slot per admitted token
    d = fc.to_dict()
    # the weights blend persistence and timeseries (both exact); the combination has not beaten persistence by the
    # guard's margin (a tie), so persistence itself is served, guarded
    assert d["served"] == {"prefill": {"member": "persistence", "arrival_tokens": pytest.approx(1000.0),
                                       "guarded": True, "regime": "steady"},
                           "decode": {"member": "persistence", "admission_tokens": pytest.approx(1000.0),
                                      "guarded": True, "regime": "steady"}}
    assert fc.served_prefill.combination == pytest.approx(1000.0)
    assert set(d["members"]) == {"prefill", "decode"}
    for quantity in ("prefill", "decode"):
        assert set(d["members"][quantity]) == set(MEMBERS)
        for report in d["members"][quantity].values():
            assert set(report) == {"forecast", "wape", "recent_wape", "weight"}
        m = d["members"][quantity]
        assert m["lifecycle"]["wape"] == pytest.approx(1.0) and m["lifecycle"]["weight"] == 0.0
        assert m["persistence"] == {"forecast": 1000.0, "wape": 0.0, "recent_wape": 0.0, "weight": 1.0}
        assert m["timeseries"]["forecast"] == pytest.approx(1000.0) and m["timeseries"]["weight"] == 0.0
    assert d["members"]["prefill"]["lifecycle"]["forecast"] == fc.lifecycle.prefill_arrival_tokens
    assert d["prefill_tokens"] == fc.prefill_tokens and "baseline" in d and "wape" in d  # existing fields kept


def test_paused_and_boundary_windows_do_not_update_the_combiner():
    cp, clock = plane()
    combiner = cp.predictor.combine_prefill
    cp.tick()
    clock.set(3.0)
    post(cp, {"event": "generation_paused", "mode": "retract", "ts": 3.0})
    one_turn(cp, "a", 4.0)
    clock.set(10.0)
    cp.tick()  # [0, 10) overlapped the pause
    clock.set(12.0)
    post(cp, {"event": "generation_continued", "ts": 12.0})
    clock.set(20.0)
    cp.tick()  # [10, 20) opened paused
    clock.set(25.0)
    post(cp, {"event": "weights_updated", "ts": 25.0, "weight_version": "2"})
    one_turn(cp, "b", 26.0)
    clock.set(30.0)
    cp.tick()  # [20, 30) holds a step boundary: scored by the accuracy tracker, not by the combiner
    assert cp.predictor.accuracy.windows == 1 and cp.predictor.accuracy.excluded == 2
    assert combiner.windows == 0 and combiner.kalman.forecast is None
    one_turn(cp, "c", 32.0)
    clock.set(40.0)
    cp.tick()
    assert combiner.windows == 1 and combiner.kalman.forecast == 1000.0


def test_combiner_settings_are_validated_and_reset_it_only_when_they_change():
    cfg = apply_config_update(PredictorConfig(), {"combiner_members": ["persistence", "lifecycle"],
                                                  "combiner_half_life_windows": 2, "combiner_selection_margin": 0,
                                                  "combiner_noise_half_life_windows": 6})
    assert cfg.combiner_members == ("persistence", "lifecycle") and cfg.combiner_half_life_windows == 2.0
    for bad, field in [({"combiner_members": []}, "combiner_members"),
                       ({"combiner_members": ["oracle"]}, "combiner_members"),
                       ({"combiner_members": ["lifecycle", "lifecycle"]}, "combiner_members"),
                       ({"combiner_members": "lifecycle"}, "combiner_members"),
                       ({"combiner_half_life_windows": 0}, "combiner_half_life_windows"),
                       ({"combiner_noise_half_life_windows": "long"}, "combiner_noise_half_life_windows"),
                       ({"combiner_selection_margin": 1.0}, "combiner_selection_margin")]:
        with pytest.raises(ConfigError) as err:
            apply_config_update(PredictorConfig(), bad)
        assert err.value.field == field and err.value.status == 422
    cp, _ = plane()
    before = cp.predictor.combine_prefill
    cp.configure({"default_prompt_tokens": 2000})
    assert cp.predictor.combine_prefill is before  # unrelated: the members' records stand
    cp.configure({"combiner_selection_margin": 0.5})
    assert cp.predictor.combine_prefill is not before and cp.predictor.combine_prefill.margin == 0.5


def test_sync_step_launches_are_scored_among_launches():
    cp, clock = plane(injection=InjectionConfig(InjectionPolicy.SYNC))
    cp.tick()
    # the first launch: no launch has been scored, and only the lifecycle forecast models one
    assert cp.forecast().served_prefill.member == "lifecycle"
    for k in range(3):  # each window's trajectory is a whole step: it launches and finishes inside the window
        clock.set(10.0 * k + 2)
        one_turn(cp, f"t{k}", 10.0 * k + 2)
        clock.set(10.0 * (k + 1))
        cp.tick()
    # [10, 20) and [20, 30) were forecast as launches (a step had ended, none running): scored among launches;
    # [0, 10), opened before any step, held the first launch, a boundary: scored in neither regime
    assert cp.predictor.combine_prefill.windows == 0 and cp.predictor.launch_prefill.windows == 2
    fc = cp.forecast()
    members = fc.served_prefill.members
    # each launch brought 1000 tokens: persistence and the Kalman filter of the launch windows were exact on the
    # compared window, the lifecycle forecast was not (clearly behind: trimmed) -> the weights blend the two exact
    # ones; the lifecycle forecast served at the first launch lost to persistence there, so the guard serves
    # persistence until the combination beats it by its margin (here they tie)
    assert members["persistence"].recent_wape == members["timeseries"].recent_wape == 0.0
    assert members["lifecycle"].recent_wape > 0.0 and members["lifecycle"].weight == 0.0
    assert fc.served_prefill.combination == 1000.0 and fc.served_prefill.guarded
    assert fc.served_prefill.member == "persistence" and fc.prefill_arrival_tokens == 1000.0


def test_a_sync_step_nobody_has_seen_arrive_yet_is_the_lifecycle_forecasts():
    cp, clock = plane(injection=InjectionConfig(InjectionPolicy.SYNC))
    cp.tick()
    clock.set(2.0)
    post(cp, {"trajectory_id": "a", "event": "sampled", "ts": 2.0})  # a step launches; its first request is later
    clock.set(10.0)
    cp.tick()  # [0, 10) saw the launch but no arrival: the series still say 0
    assert cp.predictor.latest.served_prefill.member == "lifecycle"
    clock.set(12.0)
    post(cp, {"trajectory_id": "a", "event": "request_arrived", "ts": 12.0, "prompt_tokens": 1000, "instance": "p0"})
    clock.set(20.0)
    cp.tick()  # [10, 20) saw the step's first arrival: no launch unseen any more, but 1000 after 0 is a jump
    fc = cp.predictor.latest
    # a rebound, none compared yet, and nothing has trimmed the lifecycle forecast: it is served (persistence would
    # repeat the step's first arrivals)
    assert fc.regime == "rebound" and fc.served_prefill.member == "lifecycle"
    assert fc.prefill_arrival_tokens == fc.lifecycle.prefill_arrival_tokens
    assert cp.predictor.combine_prefill.windows == 0  # [0, 10) held the launch, [10, 20) was forecast as one


def steady_windows(cp, clock, start: int, count: int, prompt: int = 1000) -> None:
    """``count`` windows from ``start`` (in windows of 10 s), each with one whole turn of ``prompt`` tokens."""
    for k in range(start, start + count):
        clock.set(10.0 * k + 2)
        one_turn(cp, f"s{k}", 10.0 * k + 2, prompt)
        clock.set(10.0 * (k + 1))
        cp.tick()


def sandboxes(cp, t: float, count: int, prefix: str = "x") -> None:
    post(cp, *({"trajectory_id": f"{prefix}{i}", "event": "sandbox_start", "ts": t, "mode": "cold"} for i in range(count)))


def test_announced_first_prompts_far_above_the_series_are_a_surge_the_lifecycle_forecast_serves():
    cp, clock = plane(default_prompt_tokens=1000)
    cp.tick()
    steady_windows(cp, clock, 0, 4)  # 1000 tokens a window: persistence and the Kalman filter exact, guarded
    fc = cp.forecast()
    assert fc.regime == "steady" and fc.served_prefill.member == "persistence" and fc.served_prefill.guarded
    assert fc.prefill_arrival_tokens == pytest.approx(1000.0)
    sandboxes(cp, 40.5, 2)  # two sandboxes starting: at most 2,000 announced tokens, not 3x the level -> steady
    fc = cp.forecast()
    assert fc.regime == "steady" and fc.prefill_arrival_tokens == pytest.approx(1000.0)
    sandboxes(cp, 41.0, 40, "y")  # 40 more: up to 42,000 announced tokens, 42x the level -> a surge
    fc = cp.forecast()
    assert fc.regime == "surge" and fc.served_prefill.member == "lifecycle" and not fc.served_prefill.guarded
    assert fc.prefill_arrival_tokens == fc.lifecycle.prefill_arrival_tokens > 3 * 1000.0
    assert fc.to_dict()["served"]["prefill"]["regime"] == "surge"
    # the allocation reads the surge: W^P is the backlog plus the lifecycle's announced prompts
    assert fc.prefill_tokens == pytest.approx(fc.sources.backlog + fc.lifecycle.prefill_arrival_tokens)


def test_surge_windows_are_scored_among_surges_and_a_member_that_misses_them_loses_its_place():
    assert surging(100.0, None, None) and surging(3001.0, 1000.0, 10.0) and not surging(3000.0, 1000.0, 10.0)
    assert not surging(3001.0, 10.0, 1001.0) and not surging(0.0, None, None) and not surging(math.nan, 0.0, 0.0)
    cp, clock = plane(default_prompt_tokens=1000)
    cp.tick()
    steady_windows(cp, clock, 0, 3)
    steady = cp.predictor.combine_prefill.windows
    surge = cp.predictor.surge_prefill
    for k in range(3, 6):  # every surge window: 30 sandboxes announced, none sends a prompt in it
        clock.set(10.0 * k + 0.5)
        sandboxes(cp, 10.0 * k + 0.5, 30, f"w{k}-")
        clock.set(10.0 * (k + 1))
        cp.tick()
        assert cp.predictor.latest.regime == "surge"  # the 90 sandboxes stay announced
    # the windows opened at 40 and 50 s were forecast as surges and scored among surges, not among steady ones
    assert surge.windows == 2 and cp.predictor.combine_prefill.windows == steady + 1
    fc = cp.forecast()
    assert fc.regime == "surge"
    # the lifecycle forecast missed both surges by all it forecast; persistence (0) was exact: it is served now
    assert fc.served_prefill.members["lifecycle"].recent_wape is None  # nothing arrived: no WAPE, only errors
    assert fc.served_prefill.member != "lifecycle" and fc.prefill_arrival_tokens == pytest.approx(0.0)


def burst(cp, clock, k: int, turns: int = 10) -> None:
    """Window ``k`` (10 s each) brings ``turns`` whole turns of 1000 tokens at once, then the window closes."""
    clock.set(10.0 * k + 2)
    for i in range(turns):
        one_turn(cp, f"b{k}-{i}", 10.0 * k + 2)
    clock.set(10.0 * (k + 1))
    cp.tick()


def test_the_window_after_a_jump_is_a_rebound_scored_among_rebounds():
    """A burst after a quiet spell (a sync step's first prompts after a training gap): persistence repeats it in the
    next window by construction, so that window is scored among rebounds; the steady windows' ranking and guard never
    see that error."""
    assert jumped(3001.0, 1000.0, 10.0) and not jumped(3000.0, 1000.0, 10.0) and not jumped(3001.0, 10.0, 1001.0)
    assert jumped(1.0, 0.0, None) and not jumped(1000.0, None, None) and not jumped(math.nan, 0.0, 0.0)
    cp, clock = plane(default_prompt_tokens=1000)
    cp.tick()
    steady_windows(cp, clock, 0, 4)  # 1000 tokens a window
    predictor = cp.predictor
    steady = predictor.combine_prefill.windows
    burst(cp, clock, 4)  # [40, 50): 10,000 tokens, 10x the level
    fc = predictor.latest
    assert fc.regime == "rebound" and fc.to_dict()["served"]["prefill"]["regime"] == "rebound"
    # no rebound compared yet, and the steady windows trim the lifecycle forecast (0 where 1000 came): persistence
    assert not predictor.combine_prefill.trusts("lifecycle")
    assert fc.served_prefill.member == "persistence" and fc.prefill_arrival_tokens == 10000.0
    quiet(cp, clock, 5, 6)  # [50, 110): nothing arrives (a gap); 0 after 10,000 is no jump
    assert predictor.latest.regime == "steady"
    assert predictor.rebound_prefill.windows == 1 and predictor.combine_prefill.windows == steady + 6  # + [40, 50)
    burst(cp, clock, 11)
    quiet(cp, clock, 12, 6)  # the second rebound, [120, 130): the first the rebound Kalman filter forecast
    burst(cp, clock, 18)
    fc = predictor.latest
    # on the one rebound every member forecast, the Kalman filter of rebounds said 0 (exact: a burst is followed by
    # the gap), persistence 10,000: the rebounds' own filter is selected, 0 served, not persistence's 10,000
    members = fc.served_prefill.members
    assert members["timeseries"].recent_wape is None and members["persistence"].recent_wape is None  # 0 realised
    assert predictor.rebound_prefill.scores["timeseries"].error == 0.0
    assert predictor.rebound_prefill.scores["persistence"].error == 10000.0
    assert fc.regime == "rebound" and fc.served_prefill.member in ("timeseries", "lifecycle", "blend")
    assert fc.prefill_arrival_tokens == pytest.approx(0.0)
    assert predictor.rebound_prefill.windows == 2


def quiet(cp, clock, start: int, count: int) -> None:
    """``count`` windows from ``start`` in which nothing arrives."""
    for k in range(start, start + count):
        clock.set(10.0 * (k + 1))
        cp.tick()


def test_the_guard_serves_persistence_while_the_combination_loses_to_it():
    """A bursty series on which the per-window ranking chases the last winner: the combination's long-run WAPE
    exceeds persistence's, so persistence is served until the combination beats it by the guard's margin."""
    c = ForecastCombiner(members=("lifecycle", "persistence"))
    # the members' records say lifecycle (exact) is ahead of persistence (500 off), but what was served each time --
    # the combination the weights chose at each window's start -- was 1000 off: it lost to persistence
    for _ in range(3):
        assert c.observe(1000.0, {"lifecycle": 1000.0, "persistence": 1500.0, "combination": 2000.0})
    assert c.guarded
    served = c.serve(3000.0, 1000.0)
    assert (served.member, served.value, served.guarded, served.combination) == ("persistence", 1000.0, True, 3000.0)
    assert served.members["lifecycle"].weight == 0.0 and served.members["persistence"].weight == 1.0
    # the combination now wins, but only by 5 % over the long run: still guarded (hysteresis) ...
    g = ForecastCombiner(members=("lifecycle", "persistence"))
    g.guarded = True
    g.guard_scores["combination"].add_recent(g.guard_delta, 950.0, 1000.0)  # error 50
    g.guard_scores["persistence"].add_recent(g.guard_delta, 1050.0, 1000.0)  # error 50
    g.observe(1000.0, {"lifecycle": 1000.0, "persistence": 1100.0, "combination": 1000.0})
    # long run: combination 50 * d + 0 vs persistence 50 * d + 100 -> 0.05 d / (1 + d) vs ... by hand:
    d = g.guard_delta
    mine, theirs = 50 * d / (1000 * d + 1000), (50 * d + 100) / (1000 * d + 1000)
    assert g.guarded is not (mine < 0.9 * theirs)
    assert not g.guarded  # 50d against 50d + 100 (d = 0.958): 47.9 < 0.9 * 147.9 -> the combination is back


def test_trust_follows_the_trimming_rule():
    c = ForecastCombiner()
    assert c.trusts("lifecycle")  # nothing compared: no evidence against it
    for _ in range(3):  # lifecycle 3x off, persistence exact, the Kalman filter close
        c.observe(1000.0, {"lifecycle": 4000.0, "persistence": 1000.0, "timeseries": 1100.0})
    assert not c.trusts("lifecycle") and c.trusts("persistence")
    assert not c.trusts("timeseries")  # 10 % off against 0: clearly behind too


def test_a_selected_member_far_from_both_others_gives_way_to_the_median():
    c = ForecastCombiner(start_guarded=False)
    for _ in range(3):  # lifecycle exact, the others 10 % and 20 % off: lifecycle is selected
        c.observe(1000.0, {"lifecycle": 1000.0, "persistence": 1200.0, "timeseries": 1100.0})
    assert c.serve(1300.0, 1000.0).member == "lifecycle"  # near the others: kept
    served = c.serve(40_000.0, 1000.0)  # 40x persistence and the Kalman filter: the median of the three instead
    kalman = served.members["timeseries"].forecast
    assert kalman == pytest.approx(1000.0)  # three exact windows of 1000
    assert served.member in ("timeseries", "persistence") and served.value == pytest.approx(1000.0)
    assert served.combination == served.value and served.members["lifecycle"].weight == 0.0
    launch = ForecastCombiner(prior="lifecycle", robust=False)  # at a launch, disagreement is expected
    for _ in range(3):
        launch.observe(1000.0, {"lifecycle": 1000.0, "persistence": 1200.0, "timeseries": 1100.0})
    assert launch.serve(40_000.0, 1000.0).value == 40_000.0


def test_steady_windows_start_guarded_until_the_combination_beats_persistence():
    c = ForecastCombiner(members=("lifecycle", "persistence"))  # steady: starts guarded
    assert c.guarded
    c.observe(1000.0, {"lifecycle": 1000.0, "persistence": 2000.0, "combination": 1000.0})
    # the combination (lifecycle, exact) beat persistence (1000 off) by more than 10 %: served from now on
    assert not c.guarded and c.serve(1500.0, 1000.0).member == "lifecycle"
    assert ForecastCombiner(robust=False).guarded is False  # a launch regime starts open
