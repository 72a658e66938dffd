"""bench_stage_times.py: realised stage times at adjacent static splits against the wait rule's model of a move."""

import json

import pytest
from unit_support import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_stage_times")


def _split(p, d, step, prefill, wait, decode, turns=1000):
    return {"prefill_instances": p, "decode_instances": d, "steady_step_s": step, "prefill_s": prefill,
            "slot_wait_s": wait, "decode_s": decode, "total_s": prefill + wait + decode, "turns": turns}


def test_split_means_weigh_each_seed_alike(bench):
    seeds = [_split(11, 21, 80.0, 12.0, 0.0, 9.0, 100), _split(11, 21, 90.0, 14.0, 0.1, 10.0, 300)]
    mean = bench.split_means(seeds)
    assert mean == {"seeds": 2, "prefill_instances": 11, "decode_instances": 21, "steady_step_s": 85.0,
                    "turns": 400, "prefill_s": 13.0, "slot_wait_s": pytest.approx(0.05), "decode_s": 9.5,
                    "total_s": pytest.approx(22.55)}


def test_a_move_against_the_rules_prediction_and_the_load_fit(bench):
    """The Qwen3-like general agent at staleness 8 (12 seeds, 12 steps measured): 11:21 prefill 13.10 s, slot wait
    0.04 s; 12:20 10.16 s and 3.19 s."""
    eleven, twelve = _split(11, 21, 83.8, 13.10, 0.04, 9.69), _split(12, 20, 85.1, 10.16, 3.19, 9.84)
    (move,) = bench.moves([eleven, twelve])
    assert (move["from"], move["to"]) == ("11:21", "12:20")
    assert move["prefill_fall_s"] == pytest.approx(2.94)
    assert move["predicted_prefill_fall_s"] == pytest.approx(13.10 / 12)  # w_P / (n_P + 1)
    assert move["decode_rise_s"] == pytest.approx(3.15)
    assert move["predicted_decode_rise_s"] == pytest.approx(0.04 / 20)  # w_D / (n_D - 1)
    assert move["decode_rise_over_predicted"] == pytest.approx(3.15 / 0.002)
    assert move["summed_change_s"] == pytest.approx(0.36)
    assert move["step_change"] == pytest.approx(85.1 / 83.8)
    # w = c / (n - n0) through both splits: prefill (13.10 x 11 - 10.16 x 12) / 2.94 = 7.54 of 11-12 instances;
    # decode (0.04 x 21 - 3.19 x 20) / (0.04 - 3.19) = 19.99 of 20-21: decode is at the edge of saturation
    assert move["prefill_load"] == pytest.approx(7.544, abs=1e-3)
    assert move["decode_load"] == pytest.approx(19.987, abs=1e-3)
    assert bench.load_fit(1.0, 3, 1.0, 4) is None
    lines = bench.table([eleven, twelve], [move])
    assert lines[1].split() == ["11:21", "83.8", "13.10", "0.04", "9.69", "22.83", "1,000"]
    assert lines[-1] == ("11:21 -> 12:20: prefill -2.94 s (rule: -1.09), decode slot wait +3.15 s (rule: +0.00), "
                         "sum +0.36 s, step x1.016; prefill load 7.5 decode load 20.0")


def test_arguments(bench):
    args = bench.parse_args(["--ratios", "13", "11", "12", "11"])
    assert args.ratios == [11, 12, 13] and args.seeds == 12 and args.async_measured == 4
    for bad in (["--ratios", "3"], ["--ratios", "0", "1"], ["--seeds", "0"], ["--jobs", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_end_to_end_on_a_small_cell(bench, tmp_path):
    result = bench.main(["--model", "mimo_v25_pro", "--preset", "coding_agent", "--staleness", "2", "--groups", "1",
                         "--ratios", "1", "2", "--seeds", "1", "--async-measured", "1", "--jobs", "1",
                         "--out", str(tmp_path)])
    stem = tmp_path / "mimo_v25_pro_coding_agent_2_1"
    assert json.loads(stem.with_suffix(".json").read_text())["moves"][0]["from"] == "1:7"
    assert stem.with_suffix(".png").stat().st_size > 0
    assert [s["prefill_instances"] for s in result["splits"]] == [1, 2]
    assert all(s["turns"] > 0 and s["decode_s"] > 0 for s in result["splits"])
