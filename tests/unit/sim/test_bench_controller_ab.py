"""benchmarks/bench_controller_ab.py's arithmetic, on hand-made step times."""

from __future__ import annotations

import pytest
from unit_support import load_benchmark

ab = load_benchmark("bench_controller_ab")


def test_the_best_static_is_the_fastest_mean_among_ratios_that_finished_every_seed():
    static = {1: [100.0, 120.0], 2: [90.0, 110.0], 3: [80.0, None]}  # 3:x is fastest where it finished, but did not
    assert ab.best_static(static) == 2
    with pytest.raises(ValueError):
        ab.best_static({1: [None, 1.0]})


def test_ratios_per_seed_and_an_unfinished_adaptive_run_counts_as_infinitely_slow():
    assert ab.ratios([99.0, None, 55.0], [90.0, 100.0, 50.0]) == [1.1, float("inf"), 1.1]


def test_the_summary_gives_the_mean_and_the_t_interval_and_counts_unfinished_runs():
    s = ab.summary([1.0, 1.2])  # mean 1.1, sd 0.1414, t(1) 12.706: half-width 12.706 * 0.1414 / sqrt(2) = 1.2706
    assert s["mean"] == pytest.approx(1.1) and s["unfinished"] == 0
    assert s["interval95"] == pytest.approx([1.1 - 1.2706, 1.1 + 1.2706], abs=1e-4)
    bad = ab.summary([1.0, float("inf")])
    assert bad["unfinished"] == 1 and bad["interval95"] is None
