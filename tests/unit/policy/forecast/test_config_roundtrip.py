"""``GET /lifecycle/config`` returns every setting ``POST /lifecycle/config`` takes, and posting it back changes
nothing (config.py's ``to_dict`` and ``apply_config_update``)."""

from __future__ import annotations

from sglang_prorsa.policy.forecast.config import PredictorConfig, apply_config_update


def test_every_settable_field_is_reported_and_round_trips():
    changed = apply_config_update(PredictorConfig(), {
        "horizon_s": 6, "default_prompt_tokens": 700, "kv_page_size": 16, "tool_ema_alpha": 0.3,
        "bias_enabled": False, "combiner_members": ["persistence", "timeseries"], "combiner_half_life_windows": 2,
        "combiner_selection_margin": 0.1, "combiner_noise_half_life_windows": 6,
        "injection": {"policy": "sync", "group_size": 4}})
    body = changed.to_dict()
    assert body["bias_enabled"] is False and body["tool_ema_alpha"] == 0.3
    assert body["combiner_members"] == ["persistence", "timeseries"]
    assert (body["combiner_half_life_windows"], body["combiner_selection_margin"],
            body["combiner_noise_half_life_windows"]) == (2.0, 0.1, 6.0)
    assert apply_config_update(PredictorConfig(), body) == changed  # posted back to defaults: the same config
    assert apply_config_update(changed, PredictorConfig().to_dict()) == PredictorConfig()
