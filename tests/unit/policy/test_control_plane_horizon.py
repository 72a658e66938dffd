"""Where the forecast is S's only consumer (the standalone control plane), ``POST /lifecycle/config`` moves it; where
a flag fixed it (a server: ``horizon_fixed_by``), another S is refused whole and the same S is accepted."""

from __future__ import annotations

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import ConfigError, FixedSettingError, PredictorConfig


def test_a_control_plane_without_a_fixing_flag_moves_its_horizon():
    cp = LifecycleControlPlane(ManualClock(0.0), PredictorConfig(horizon_s=4.0))
    assert cp.configure({"horizon_s": 6}).horizon_s == 6.0
    assert cp.config.horizon_s == 6.0 and cp.forecast().horizon_s == 6.0


def test_a_fixed_horizon_is_refused_whole_with_the_field_and_the_flag():
    cp = LifecycleControlPlane(ManualClock(0.0), PredictorConfig(horizon_s=4.0), horizon_fixed_by="--prorsa-horizon")
    with pytest.raises(FixedSettingError) as refused:
        cp.configure({"horizon_s": 6, "kv_page_size": 16})
    assert refused.value.field == "horizon_s" and refused.value.status == 409
    assert "--prorsa-horizon 6" in str(refused.value)
    assert cp.config.horizon_s == 4.0 and cp.config.kv_page_size == 1  # nothing applied
    assert cp.configure({"horizon_s": 4, "kv_page_size": 16}).kv_page_size == 16  # the S in force: accepted
    with pytest.raises(ConfigError) as malformed:
        cp.configure({"horizon_s": -1})
    assert malformed.value.status == 422 and not isinstance(malformed.value, FixedSettingError)
