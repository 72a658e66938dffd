"""Role switch execution in the cluster (Appendix C): out of the pool for switch_s, work moves with its progress."""

from sglang_prorsa.sim.cluster import Cluster
from sglang_prorsa.sim.config import ClusterConfig, RolloutConfig, load_model
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.sim.lifecycle_sink import NullLifecycle
from sglang_prorsa.sim.trainer import Trainer
from sglang_prorsa.srt.role_switch.capacity import InstanceStatus, Role
from sglang_prorsa.workload.presets import TASKS


def build(mode="static", staleness=0):
    model = load_model("mimo_v25_pro")
    rollout = RolloutConfig(preset="coding_agent", staleness=staleness, group_size=8, groups_per_step=2, steps=2)
    events = EventQueue()
    trainer = Trainer(rollout, TASKS["coding_agent"], events, NullLifecycle().hint)
    cluster = Cluster(ClusterConfig(gpus=64, mode=mode, prefill_instances=2), model, rollout, events, trainer,
                      NullLifecycle())
    trainer.start(0.0)
    return events, trainer, cluster


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
    events.run(until=1e6)
    assert trainer.finished and sum(r.finished_at is not None for r in trainer.runs) == 32
    assert cluster.switches == [(60.0, "i2", "prefill")]


def test_weight_update_reprefills_carried_over_contexts():
    events, trainer, cluster = build(mode="colocated", staleness=2)
    events.run(until=120.0)
    decoding = [r for inst in cluster.instances for rank in inst.ranks for r in rank.running.values()]
    assert decoding
    cluster.weight_update(120.0)
    assert cluster.untracked_prefill_tokens() > 0  # their prompt + generated tokens are prefilled again
    assert all(r.untracked and r.generated == 0 for r in decoding)
    events.run(until=1e6)
    assert trainer.finished
