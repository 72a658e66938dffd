"""Role switch execution in the cluster (Appendix C), regrouping for stage-specific shapes, weight updates, NICs."""

import pytest

from sglang_prorsa.policy.role_switch.capacity import InstanceStatus, Role
from sglang_prorsa.sim.cluster import Cluster
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.sim.instance import Request
from sglang_prorsa.sim.lifecycle_sink import NullLifecycle
from sglang_prorsa.sim.trainer import Trainer
from sglang_prorsa.sim.workloads import workload_tasks


def build(mode="static", staleness=0, gpus=64, prefill=2, decode_shape="same"):
    model = load_model("mimo_v25_pro")
    rollout = RolloutConfig(preset="coding_agent", staleness=staleness, group_size=8, groups_per_step=2, steps=2)
    events = EventQueue()
    trainer = Trainer(rollout, workload_tasks("coding_agent"), events, None)
    config = ClusterConfig(gpus=gpus, mode=mode, prefill_instances=prefill, decode_shape=decode_shape)
    cluster = Cluster(config, model, rollout, events, trainer, NullLifecycle())
    trainer.start(0.0)
    return events, trainer, cluster


@pytest.fixture
def ticks(monkeypatch):
    """Every control tick of the runs in a test: (time, its ControlInputs, its Decision)."""
    from sglang_prorsa.policy.role_switch.controller import RoleSwitchController

    seen = []
    tick = RoleSwitchController.tick

    def spy(self, control, reports, profile=None):
        decision = tick(self, control, reports, profile)
        seen.append((self._clock.now(), control, decision))
        return decision

    monkeypatch.setattr(RoleSwitchController, "tick", spy)
    return seen


def test_switch_takes_the_instance_out_for_switch_s_and_loses_no_trajectory():
    events, trainer, cluster = build()
    events.run(until=60.0)
    decode = cluster.by_id["i2"]
    assert decode.role is Role.DECODE and decode.has_work()
    cluster.start_switch("i2", Role.PREFILL, 60.0)
    assert decode.status is InstanceStatus.SWITCHING and not decode.has_work()
    events.run(until=64.9)
    assert decode.status is InstanceStatus.SWITCHING
    events.run(until=65.1)
    assert decode.status is InstanceStatus.ACTIVE and decode.role is Role.PREFILL and decode.role_since == 65.0
    assert decode.last_switch_s == 5.0
    events.run(until=1e6)
    assert trainer.finished and sum(r.finished_at is not None for r in trainer.runs) == 32  # 2 steps x 2 groups x 8
    assert cluster.switches == [(60.0, "i2", "prefill")]


def test_stage_specific_shapes_regroup_gpus():
    # 128 GPUs: 4 prefill instances of 16 GPUs + 2 decode instances of 32 (EP32, 4 ranks)
    events, trainer, cluster = build(gpus=128, prefill=4, decode_shape="wide")
    assert [i.gpus for i in cluster.instances] == [16, 16, 16, 16, 32, 32]
    assert [len(i.ranks) for i in cluster.instances] == [2, 2, 2, 2, 4, 4]
    events.run(until=30.0)
    cluster.start_switch("i0", Role.DECODE, 30.0)
    cluster.start_switch("i1", Role.DECODE, 30.0)
    events.run(until=36.0)
    gpus = {i.role: 0 for i in cluster.instances}
    for inst in cluster.instances:
        gpus[inst.role] += inst.gpus
    assert gpus == {Role.PREFILL: 32, Role.DECODE: 96}
    merged = cluster.instances[0]
    assert (merged.gpus, merged.role, merged.status, merged.role_since) == (32, Role.DECODE, InstanceStatus.ACTIVE,
                                                                           35.0)
    cluster.start_switch(merged.iid, Role.PREFILL, 36.0)  # one 32-GPU decode instance becomes two prefill ones
    events.run(until=42.0)
    assert sorted(i.gpus for i in cluster.instances if i.role is Role.PREFILL) == [16, 16, 16, 16]
    assert sum(i.gpus for i in cluster.instances) == 128
    events.run(until=1e6)
    assert trainer.finished and sum(r.finished_at is not None for r in trainer.runs) == 32  # 2 steps x 2 groups x 8


def test_weight_update_reprefills_carried_over_contexts():
    events, trainer, cluster = build(mode="colocated", staleness=2)
    events.run(until=120.0)
    decoding = [r for inst in cluster.instances for rank in inst.ranks for r in rank.running.values()]
    assert decoding
    cluster.weight_update(120.0)
    assert cluster.untracked_prefill_tokens() > 0  # their prompt + generated tokens are prefilled again
    assert all(r.untracked and r.generated == 0 and r.done == 0 for r in decoding)
    assert all(rank.cache.tokens == 0 for inst in cluster.instances for rank in inst.ranks)
    events.run(until=1e6)
    assert trainer.finished


def test_transfers_through_one_rank_queue_on_its_nics():
    events, trainer, cluster = build()
    model = cluster.model
    prefill, decode = cluster.instances[0], cluster.instances[2]
    a, b = (Request(900 + k, None, 1_000_000, 1_000_000, 10) for k in range(2))
    for r in (a, b):
        cluster._src[r] = (prefill, 0)
        r.rank = 0
    wire = decode.perf.transfer_s(1_000_000)  # 1M tokens x 24 KB over 8 NICs of 50 GB/s = 0.06 s
    assert wire == pytest.approx(1e6 * model.kv_bytes_per_token / (8 * 50e9))
    cluster._admitted(decode, decode.ranks[0], a, 10.0)
    cluster._admitted(decode, decode.ranks[0], b, 10.0)
    assert decode.ranks[0].nic_free == pytest.approx(10.0 + 2 * wire)  # the second waited for the first
    assert prefill.ranks[0].nic_free == pytest.approx(10.0 + 2 * wire)


def test_the_driver_hands_the_re_prefill_backlog_to_decode_as_kv_returning(ticks):
    """After a weight update the engines re-prefill the contexts that were in decode: the driver gives those tokens as
    Ŵ^P's cold part and as decode KV returning, the same number at every tick (ControlInputs.decode_kv_returning)."""
    from sglang_prorsa.sim.runner import simulate

    result = simulate(load_model("mimo_v25_pro"), ClusterConfig(gpus=128, mode="adaptive"),
                      RolloutConfig(preset="coding_agent", staleness=1, group_size=8, groups_per_step=4, steps=3))
    seen = [(control.cold_prefill_tokens, control.decode_kv_returning) for _, control, _ in ticks]
    assert result.steps_done == 3 and seen
    assert all(cold == returning for cold, returning in seen)
    assert any(returning > 0 for _, returning in seen)  # a weight update happened with contexts in decode


def test_observing_the_cluster_does_not_change_the_run(monkeypatch):
    """The control tick reads the instances without advancing them: an adaptive run whose planner never switches is
    the static run of the same split, step for step. (A tick that advanced every instance made decode admission see
    fresher KV than static runs do, and changed the run it observed.)"""
    import dataclasses

    from sglang_prorsa.policy.role_switch.planner import SwitchPlanner
    from sglang_prorsa.sim.runner import simulate

    plan = SwitchPlanner.plan
    planned = []

    def never_switch(self, reports, allocation, now, context=None):
        result = plan(self, reports, allocation, now, context)
        planned.append(len(result.switches))
        return dataclasses.replace(result, switches=(), new_instances=0)

    rollout = RolloutConfig(preset="general_agent", staleness=1, group_size=16, groups_per_step=8, steps=3, seed=1)
    static = simulate(load_model("qwen3_235b"), ClusterConfig(gpus=128, mode="static", prefill_instances=12), rollout)
    monkeypatch.setattr(SwitchPlanner, "plan", never_switch)
    frozen = simulate(load_model("qwen3_235b"), ClusterConfig(gpus=128, mode="adaptive", prefill_instances=12),
                      rollout)
    assert len(planned) > 50  # ticked all through (a tick that advanced the instances made these steps 346, 167
    # and 300 s against static's 348, 166 and 301)
    assert frozen.switches == 0 and frozen.steps_done == static.steps_done == 3
    assert frozen.step_times_s == static.step_times_s
    assert frozen.events == static.events


def test_the_driver_measures_decode_completions_and_the_wait_rule_decides_with_them(ticks):
    """The driver reads the tracker's decode_end count at each tick: the rate it passes is the completions of the
    last minute over the span read, and with ``planner="waits"`` a tick with a queue is decided by the wait rule.
    Requests away for a re-prefill are passed as returning to decode."""
    from sglang_prorsa.policy.role_switch.planner import PACED, WAITS_BALANCED
    from sglang_prorsa.sim.runner import simulate

    rollout = RolloutConfig(preset="coding_agent", staleness=1, group_size=8, groups_per_step=16, steps=3)
    result = simulate(load_model("mimo_v25_pro"), ClusterConfig(gpus=128, mode="adaptive", planner="waits"), rollout)
    assert result.steps_done == 3
    seen = [(t, control.decode_completions_per_s, decision.demand["waits"], decision.hold_reason,
             len(decision.plan.switches), control.decode_requests_returning, control.decode_kv_returning)
            for t, control, decision in ticks]
    assert seen[0][1] is None and seen[0][2] is None  # one reading: no rate, no waits, the forecast rules decide
    measured = [s for s in seen if s[1] is not None and s[1] > 0]
    assert measured and all(s[2] is not None for s in measured)
    by_wait = [s for s in measured if max(s[2].values()) > 2.0]  # a queue somewhere: the wait rule's ticks
    assert by_wait
    assert all(s[3] in (WAITS_BALANCED, PACED, None, "no_eligible_instance", "donor_at_minimum") for s in by_wait)
    assert all(s[4] <= 1 for s in by_wait)  # one move at a time
    # re-prefills after the asynchronous weight updates: their requests are passed with their KV, never one alone
    assert any(s[5] > 0 for s in seen)
    assert all((s[5] > 0) == (s[6] > 0) for s in seen)
    with pytest.raises(ValueError, match="planner"):
        ClusterConfig(gpus=128, mode="adaptive", planner="nope")


def test_the_move_review_is_opt_in_and_reads_the_decode_end_counter(ticks):
    """With ``move_review`` the driver hands the controller the tracker's decode_end count at every tick and the
    decision carries the review's state; without it there is no review (policy/role_switch/review.py)."""
    from sglang_prorsa.sim.runner import simulate

    rollout = RolloutConfig(preset="coding_agent", staleness=1, group_size=8, groups_per_step=16, steps=3)
    for review in (True, False):
        ticks.clear()
        cluster = ClusterConfig(gpus=128, mode="adaptive", planner="waits", move_review=review)
        assert simulate(load_model("mimo_v25_pro"), cluster, rollout).steps_done == 3
        seen = [(control.decode_completions_total, decision.review) for _, control, decision in ticks]
        totals = [s[0] for s in seen]
        assert all(isinstance(n, int) for n in totals) and totals == sorted(totals) and totals[-1] > 0
        assert all((s[1] is not None) is review for s in seen)
        if review:
            last = seen[-1][1]
            assert last["verdicts"] >= last["undone"] >= 0 and set(last) == {"pending", "last_verdict", "verdicts",
                                                                              "undone", "refused"}
