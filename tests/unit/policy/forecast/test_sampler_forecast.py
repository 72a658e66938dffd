"""Data-sampler forecast (B.2): p_hat, injection rules, launch delay and the shortened horizon S_pw."""

import numpy as np
import pytest

from sglang_prorsa.policy.forecast.sampler import (
    AcceptanceRate,
    FixedRate,
    GroupReplenish,
    InjectionConfig,
    InjectionPolicy,
    LaunchDelay,
    NoInjection,
    ReplaceOnReward,
    RewardCandidate,
    forecast_sampler,
)


def test_acceptance_rate_and_launch_delay():
    p = AcceptanceRate(window=3)
    assert p.value == 1.0
    for a in (True, False, True, True):
        p.observe(a)
    assert p.value == pytest.approx(2 / 3)  # window keeps F, T, T
    d = LaunchDelay(prior_s=2.0, window=2)
    assert d.value == 2.0
    for x in (1.0, 3.0, 5.0):
        d.observe(x)
    assert d.value == 4.0


def test_injection_rules():
    c = [RewardCandidate(0.5, "g1", True), RewardCandidate(0.4, "g1", True), RewardCandidate(0.9, "g2", False),
         RewardCandidate(0.3, None, True)]
    assert ReplaceOnReward().launches(c, 0.5, 10) == pytest.approx(0.5 * 2.1)
    assert FixedRate(2.0).launches(c, 0.5, 6.0) == 12.0
    # g1 completes with 0.5 * 0.4 = 0.2; g2 has a member outside reward: 0; the ungrouped one is a group of one: 0.3
    assert GroupReplenish(8).launches(c, 0.5, 10) == pytest.approx(8 * 0.5)
    assert NoInjection().launches(c, 0.5, 10) == 0.0
    with pytest.raises(ValueError):
        InjectionConfig(InjectionPolicy.FIXED_RATE)


def test_shortened_launch_horizon():
    # q over S = 10 is 1.0; over S_pw = 10 - d_hat(5) = 5 it is 2/3; p_hat = 0.5, x_hat = 3000
    fc = forecast_sampler(np.array([1.0]), np.array([2 / 3]), np.array([3.0]), [(None, True)], rule=ReplaceOnReward(),
                          p_hat=0.5, launch_delay_s=5.0, horizon_s=10.0, new_prompt_tokens=3000)
    assert fc.n_pass == pytest.approx(0.5)
    assert fc.launch_horizon_s == 5.0
    assert fc.n_launch == pytest.approx(1 / 3)
    assert fc.tokens == pytest.approx(1000.0)
    assert fc.arrival_offset_s == pytest.approx(8.0)  # d_hat + expected residual reward time
    # a launch delay longer than the horizon: nothing launched in the window arrives in it
    late = forecast_sampler(np.array([1.0]), np.array([1.0]), np.array([0.0]), [(None, True)], rule=ReplaceOnReward(),
                            p_hat=1.0, launch_delay_s=12.0, horizon_s=10.0, new_prompt_tokens=3000)
    assert (late.launch_horizon_s, late.n_launch, late.tokens) == (0.0, 0.0, 0.0)
    assert late.n_samp == 1.0
    fixed = forecast_sampler(np.array([]), np.array([]), np.array([]), [], rule=FixedRate(2.0), p_hat=1.0,
                             launch_delay_s=4.0, horizon_s=10.0, new_prompt_tokens=100)
    assert (fixed.n_launch, fixed.tokens, fixed.arrival_offset_s) == (12.0, 1200.0, 7.0)
