"""Baselines a user would pick without an oracle (sim/baselines.py): the paper's optima, 1:1, and the flow balance."""

from dataclasses import replace

import pytest

from sglang_prorsa.sim.baselines import (
    baselines,
    flow_balance,
    one_to_one,
    paper_optimum,
    workload_means,
)
from sglang_prorsa.sim.config import ClusterConfig, DecodeParams, ModelConfig, PrefillParams, RolloutConfig, load_model
from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.workload.presets import LogNormal, TaskProfile, ToolSpec


def fixed(v: float) -> LogNormal:
    return LogNormal(v, 0.0)


# Two turns: a 1000-token first prompt, 1000 output tokens per turn, an empty tool result. Turn 0 prefills 1000 new
# tokens with nothing cached; turn 1's prompt is 1000 + 1000 = 2000, of which turn 0's prompt (1000) is cached.
TWO_TURNS = TaskProfile("two_turns", fixed(2), fixed(1000), fixed(1000), (ToolSpec("t", 1.0, fixed(1.0), fixed(0)),),
                        fixed(0.1), False, 1.0, fixed(0.0), fixed(0.0), fixed(0.1), fixed(0.0), fixed(1.0), 1.0)

# Made-up round numbers: 4-GPU instances of 2 ranks (2 GPUs each), 1000-token chunks.
MODEL = ModelConfig(
    name="round", gpus_per_instance=4, dp_ranks=2, chunk_tokens=1000,
    prefill=PrefillParams(iter_base_s=0.5, per_token_s=1e-3, per_token_ctx_s=5e-7),
    decode=DecodeParams(iter_base_s=0.012, per_seq_s=0.001, per_ctx_token_s=5e-7),
    kv_tokens_per_rank=10_000, kv_bytes_per_token=1000, transfer_gbytes_per_s=1.5, max_running_per_rank=10,
    reserved_decode_tokens=500)
CLUSTER = ClusterConfig(gpus=40)  # 10 instances


def test_workload_means_of_a_fixed_task():
    means = workload_means([TWO_TURNS], trajectories=3)
    # per request: new (1000 + 1000) / 2, cached (0 + 1000) / 2, output 1000, prompt 1500; 2 requests a trajectory
    assert (means.new_tokens, means.cached_tokens, means.output_tokens) == (1000, 500, 1000)
    assert means.prompt_tokens == 1500 and means.requests_per_trajectory == 2
    # a mix gives each task as many trajectories: with a 1-turn task of a 100-token prompt and 10 output tokens,
    # 3 requests per pair of trajectories: new (1000 + 1000 + 100) / 3, cached 1000 / 3, output 2010 / 3
    one = replace(TWO_TURNS, name="one", turns=fixed(1), first_prompt_tokens=fixed(100), output_tokens=fixed(10),
                  tools=())
    mixed = workload_means([TWO_TURNS, one], trajectories=2)
    assert mixed.new_tokens == pytest.approx(700) and mixed.cached_tokens == pytest.approx(1000 / 3)
    assert mixed.output_tokens == pytest.approx(670) and mixed.requests_per_trajectory == 1.5


def test_flow_balance_by_hand():
    means = workload_means([TWO_TURNS], trajectories=1)  # n 1000, c 500, p 1500, o 1000
    flow = flow_balance(MODEL, "unused: means given", CLUSTER, means=means)
    # mu_P: T_P = b_P n / chunk + a_P n + a_ctx n (c + n/2) = 0.5 * 1000/1000 + 1e-3 * 1000 + 5e-7 * 1000 * (500 + 500)
    #           = 0.5 + 1 + 0.5 = 2 s per request per rank; 2 ranks -> 1 request/s
    assert flow.mu_p == pytest.approx(1.0)
    # decode context per request p + o/2 = 2000: step(B) = 0.012 + 0.001 B + 5e-7 * 2000 B = 0.012 + 0.002 B
    # mu_D at B_max = 10: step 0.032 s, 1000 steps per request: 2 ranks * 10 / 32 s = 0.625 requests/s
    assert flow.mu_d == pytest.approx(0.625)
    # KV: S = p + o/2 + reserved = 1500 + 500 + 500 = 2500; 10,000 / 2500 = 4 requests per rank (< 10);
    # step(4) = 0.02 s, a request decodes for 1000 * 0.02 = 20 s: Little's law 2 ranks * 4 / 20 s = 0.4 requests/s
    assert (flow.kv_footprint_tokens, flow.decode_batch) == (2500, 4)
    assert flow.kv_d == pytest.approx(0.4)
    # NICs: a rank's 2 GPUs move 2 * 1.5 GB/s = 3e9 B/s, a request's prompt KV is 1500 * 1000 B: 2 * 2000 = 4000/s
    assert flow.xi_p == pytest.approx(4000) and flow.xi_d == pytest.approx(4000)
    # lambda(n_P) = min(n_P * 1, (10 - n_P) * 0.4): 1, 2, 2.8, 2.4, ... -> 3:7, prefill and decode nearly balanced
    assert (flow.baseline.prefill_instances, flow.baseline.decode_instances) == (3, 7)
    assert flow.bound == pytest.approx(2.8) and "decode KV-bound" in flow.baseline.note


def test_flow_balance_transfer_term_and_ties():
    means = workload_means([TWO_TURNS], trajectories=1)
    slow = replace(MODEL, transfer_gbytes_per_s=0.0001875)  # a rank's NICs 3.75e5 B/s: 2 * 3.75e5 / 1.5e6 = 0.5/s
    flow = flow_balance(slow, "x", CLUSTER, means=means)
    assert flow.xi_p == pytest.approx(0.5)
    # min(0.5 n_P, 0.4 (10 - n_P)): 1.5, 2.0, 2.0, 1.6 at n_P = 3..6: a tie at 4 and 5 keeps the fewer prefill
    assert flow.baseline.label == "4:6" and flow.bound == pytest.approx(2.0)
    assert "prefill NICs-bound" in flow.baseline.note


def test_a_decode_starved_workload_still_keeps_one_prefill_instance():
    fast_prefill = replace(MODEL, prefill=PrefillParams(0.005, 1e-5, 5e-9))  # T_P 0.02 s -> mu_P 100/s
    flow = flow_balance(fast_prefill, "x", CLUSTER, means=workload_means([TWO_TURNS], trajectories=1))
    assert flow.mu_p == pytest.approx(100) and flow.baseline.label == "1:9"  # min(100, 9 * 0.4) = 3.6


def test_paper_optimum_and_one_to_one_scale_and_round_half_to_decode():
    # 10 instances: math 0.5 * 10 = 5; coding 0.625 * 10 = 6.25 -> 6; general 0.375 * 10 = 3.75 -> 4
    assert [paper_optimum(MODEL, p, CLUSTER).label for p in ("math", "coding_agent", "general_agent")] == [
        "5:5", "6:4", "4:6"]
    assert one_to_one(MODEL, CLUSTER).label == "5:5"
    # 3 instances: math 1.5 -> 1 (halves go to decode), coding 1.875 -> 2, general 1.125 -> 1; 1:1 -> 1:2
    small = ClusterConfig(gpus=12)
    assert [paper_optimum(MODEL, p, small).label for p in ("math", "coding_agent", "general_agent")] == [
        "1:2", "2:1", "1:2"]
    assert one_to_one(MODEL, small).label == "1:2" and "1.5 -> 1" in one_to_one(MODEL, small).note
    # a rollout config names its preset
    assert paper_optimum(MODEL, RolloutConfig(preset="coding_agent"), CLUSTER).label == "6:4"


def test_clamped_to_one_instance_of_each_role():
    mimo = load_model("mimo_v25_pro")
    # 48 GPUs with wide (32-GPU) decode: 3 prefill-shape instances, but only 1 prefill + 1 wide decode fit
    wide = ClusterConfig(gpus=48, decode_shape="wide")
    coding = paper_optimum(mimo, "coding_agent", wide)  # 0.625 * 3 = 1.875 -> 2, clamped to 1
    assert (coding.prefill_instances, coding.decode_instances) == (1, 1) and "clamped to 1" in coding.note
    assert flow_balance(mimo, "coding_agent", wide).baseline.label == "1:1"
    # no split at all: every baseline says so
    for pick in baselines(MODEL, "math", ClusterConfig(gpus=4)).values():
        assert pick.prefill_instances is None and pick.label is None and "no static split" in pick.note


@pytest.mark.parametrize("preset, why", [("research_agent", "a task the paper did not run"),
                                         ("math+coding_agent", "a mix of tasks")])
def test_no_paper_optimum_for_workloads_the_paper_did_not_run(preset, why):
    pick = paper_optimum(MODEL, preset, CLUSTER)
    assert pick.prefill_instances is None and pick.decode_instances is None
    assert why in pick.note and "coding_agent 5:3" in pick.note


def test_real_model_at_its_default_cluster():
    mimo, cluster = load_model("mimo_v25_pro"), ClusterConfig()
    picks = {p: {k: b.label for k, b in baselines(mimo, p, cluster).items()}
             for p in ("math", "coding_agent", "general_agent")}
    assert picks["math"]["paper optimum"] == "4:4" and picks["coding_agent"]["paper optimum"] == "5:3"
    assert picks["general_agent"]["paper optimum"] == "3:5" and picks["math"]["1:1"] == "4:4"
    # decode at 16 requests per rank is the scarce side for every task on this model: flow balance gives decode 7 of 8
    assert {p["flow balance"] for p in picks.values()} == {"1:7"}
    # the rates are the perf model's: a decode instance runs 2 ranks x 16 requests, each o steps of step(16)
    flow = flow_balance(mimo, "coding_agent", cluster)
    m = flow.means
    step = PerfModel(mimo).decode_step_s(16, 16 * (m.prompt_tokens + m.output_tokens / 2))
    assert flow.mu_d == pytest.approx(2 * 16 / (m.output_tokens * step))
    assert flow.mu_p > 10 * flow.mu_d and flow.kv_d > flow.mu_d  # KV is not MiMo's limit (8.4M tokens a rank)
    assert m.cached_tokens > 10 * m.new_tokens  # a coding turn adds its output and tool result to a long context
