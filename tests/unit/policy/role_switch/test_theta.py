"""θ model (theta.py): fitted from busy intervals, hand-computed values, no bucket edges."""

import math

import pytest

from sglang_prorsa.policy.role_switch.theta import ThetaConfig, ThetaModel, ThetaSample, features

TRUE = (0.01, 2e-5, 1e-6, 1e-10)  # per request, per new token, per cached token, attention


def seconds(coef, new, cached, requests):
    return sum(c * x for c, x in zip(coef, features(new, cached, requests)))


def mixes():
    """Intervals that excite every term: varied request counts, new and cached tokens."""
    for requests in (1, 3, 8):
        for new in (500, 4000, 30000):
            for cached in (0, 6000, 50000):
                yield new * requests, cached * requests, requests


def test_prior_alone_is_the_profile():
    model = ThetaModel(ThetaConfig.from_theta(10_000.0, prompt_tokens=4096))
    assert model.seconds(4096) == pytest.approx(0.4096)
    assert model.theta_mix() == pytest.approx(10_000.0)
    assert model.theta_cold() == pytest.approx(10_000.0)
    assert not model.measured and model.hit_ratio() == 0.0 and model.mean_prompt_tokens() == 4096


def test_recovers_the_model_that_produced_the_intervals():
    model = ThetaModel(ThetaConfig.from_theta(5_000.0, prior_weight=0.0, half_life_samples=1e6))
    for new, cached, requests in mixes():
        assert model.observe(ThetaSample("p0", new, cached, requests, seconds(TRUE, new, cached, requests)))
    for got, want in zip(model.coefficients.values(), TRUE):
        assert got == pytest.approx(want, rel=1e-6)
    # θ(8000 new, 2000 cached, 1 request) = 10000 / (0.01 + 0.16 + 0.002 + 1e-10 * (8000*2000 + 8000²/2)) = 56561.1
    assert model.theta(8000, 2000, 1) == pytest.approx(10_000 / 0.1768)
    assert model.theta_cold(8000) == pytest.approx(8000 / (0.01 + 0.16 + 1e-10 * 32e6))


def test_cold_theta_prices_a_lost_cache():
    # per new token 1 ms, cached tokens free: a half-cached mix runs twice as fast as cold prompts.
    model = ThetaModel(ThetaConfig(per_new_token_s=1e-3, reference_prompt_tokens=2000))
    model.observe(ThetaSample("p0", 1000, 1000, 1, 1.0))  # consistent with the prior: the fit does not move
    assert model.hit_ratio() == pytest.approx(0.5)
    assert model.theta_mix() == pytest.approx(2000.0)
    assert model.theta_cold() == pytest.approx(1000.0)
    assert model.refill_seconds(50_000) == pytest.approx(50.0)


def test_no_jump_at_a_hit_ratio_edge():
    """The bucketed estimator jumped ~9x when the hit ratio crossed 0.5; the model moves smoothly."""
    def theta_at(hit):
        model = ThetaModel(ThetaConfig.from_theta(5_000.0, prior_weight=0.0, half_life_samples=1e6))
        for new, cached, requests in mixes():
            model.observe(ThetaSample("p0", new, cached, requests, seconds(TRUE, new, cached, requests)))
        return model.theta(20_000 * (1 - hit), 20_000 * hit, 1)

    assert theta_at(0.51) / theta_at(0.49) == pytest.approx(1.0, abs=0.05)


def test_coefficients_stay_nonnegative():
    # Busy time falls with more cached tokens here (noise-like data): the cached term would fit negative.
    model = ThetaModel(ThetaConfig.from_theta(1_000.0, prior_weight=0.0))
    for new, cached, s in ((1000, 0, 1.2), (1000, 5000, 1.0), (2000, 0, 2.3), (2000, 9000, 2.0), (500, 100, 0.6)):
        model.observe(ThetaSample("p0", new, cached, 1, s))
    assert all(v >= 0 for v in model.coefficients.values())
    assert model.coefficients["per_cached_token_s"] == 0.0


def test_forgetting_follows_a_changed_speed():
    model = ThetaModel(ThetaConfig.from_theta(1_000.0, prior_weight=0.01, half_life_samples=4))
    for _ in range(40):
        model.observe(ThetaSample("p0", 1000, 0, 1, 1.0))  # 1000 tok/s
    assert model.theta_cold(1000) == pytest.approx(1000.0, rel=0.01)
    for _ in range(40):
        model.observe(ThetaSample("p0", 1000, 0, 1, 0.5))  # the instance got twice as fast
    assert model.theta_cold(1000) == pytest.approx(2000.0, rel=0.01)


def test_mean_mix_and_snapshot():
    model = ThetaModel(ThetaConfig.from_theta(1_000.0, half_life_samples=1e9))
    model.observe(ThetaSample("p0", 3000, 1000, 2, 3.0))
    model.observe(ThetaSample("p1", 1000, 3000, 2, 1.0))
    assert model.mean_prompt_tokens() == pytest.approx(2000.0)  # 8000 tokens over 4 requests
    assert model.hit_ratio() == pytest.approx(0.5)
    snap = model.snapshot()
    assert snap["samples"] == 2 and snap["samples_per_instance"] == {"p0": 1, "p1": 1}
    assert set(snap["coefficients"]) == {"per_request_s", "per_new_token_s", "per_cached_token_s", "attention_s"}
    assert math.isfinite(snap["theta_mix"]) and math.isfinite(snap["theta_cold"])


def test_short_intervals_are_dropped():
    model = ThetaModel(ThetaConfig.from_theta(1_000.0, min_busy_s=0.05))
    assert not model.observe(ThetaSample("p0", 10, 0, 1, 0.01))
    assert model.rejected == 1 and model.samples == 0


def test_prior_from_a_cold_profile():
    # g(x) = 0.01 + 2e-5 x + 1e-10 x²/2 exactly: per request, per token and attention come back.
    points = [(x, 0.01 + 2e-5 * x + 1e-10 * x * x / 2) for x in (512, 4096, 32768, 131072)]
    config = ThetaConfig.from_profile(points)
    assert (config.per_request_s, config.per_new_token_s, config.attention_s) == pytest.approx((0.01, 2e-5, 1e-10))
    assert config.per_cached_token_s == 0.0


@pytest.mark.parametrize("field,value", [("new_tokens", -1), ("requests", 0), ("busy_seconds", 0.0),
                                         ("busy_seconds", float("nan")), ("cached_tokens", "x")])
def test_bad_samples_name_the_field(field, value):
    kwargs = dict(instance_id="p0", new_tokens=10, cached_tokens=0, requests=1, busy_seconds=1.0) | {field: value}
    with pytest.raises(ValueError, match=field):
        ThetaSample(**kwargs)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="per_new_token_s"):
        ThetaConfig(per_new_token_s=-1.0)
    with pytest.raises(ValueError, match="theta"):
        ThetaConfig.from_theta(0.0)
