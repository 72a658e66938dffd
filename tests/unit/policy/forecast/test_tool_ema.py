"""Tool-duration EMA (B.5 Eq. 9) and its class fallback."""

import pytest

from sglang_prorsa.policy.forecast.tool_ema import ToolDurationEMA, tool_class_chain


def test_ema_update_alpha_point_one():
    ema = ToolDurationEMA(alpha=0.1, min_samples=1, prior_s=5.0)
    chain = tool_class_chain("swe", "bash", 2, 1)
    assert ema.estimate(chain) == 5.0  # prior before any sample
    ema.update(chain, 10.0)
    assert ema.estimate(chain) == 10.0  # first observation initialises
    ema.update(chain, 20.0)
    assert ema.estimate(chain) == pytest.approx(11.0)  # 0.9 * 10 + 0.1 * 20
    ema.update(chain, 0.0)
    assert ema.estimate(chain) == pytest.approx(9.9)


def test_fallback_to_coarser_classes():
    ema = ToolDurationEMA(alpha=0.1, min_samples=3, prior_s=5.0)
    for turn in (1, 2, 3):
        ema.update(tool_class_chain("swe", "bash", turn, 0), 4.0)  # (swe, bash) gets 3 samples; each turn gets 1
    ema.update(tool_class_chain("swe", "bash", 7, 0), 100.0)
    # turn 7 has 1 sample (< 3): the finest class with enough samples is (swe, bash): 4, 4, 4, 100 -> 0.9*4+0.1*100
    assert ema.estimate(tool_class_chain("swe", "bash", 7, 0)) == pytest.approx(13.6)
    # an unseen tool of a seen task falls back to (swe,), an unseen task to the global class
    assert ema.estimate(tool_class_chain("swe", "grep", 1, 0)) == pytest.approx(13.6)
    assert ema.estimate(tool_class_chain("other", "x", 1, 0)) == pytest.approx(13.6)
    # no class has min_samples: the finest class with any sample
    sparse = ToolDurationEMA(alpha=0.1, min_samples=5, prior_s=5.0)
    sparse.update(tool_class_chain("a", "t", 0, 0), 2.0)
    assert sparse.estimate(tool_class_chain("a", "t", 0, 0)) == 2.0
    assert tool_class_chain("a", "t", 40, 2)[0] == ("a", "t", 16, 2)  # late turns share a class
