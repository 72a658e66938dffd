"""The instance's regime stepping against hand-computed times (instance.py)."""

import pytest

from sglang_prorsa.sim.config import DecodeParams, ModelConfig, PrefillParams
from sglang_prorsa.sim.instance import INF, Instance, Request
from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.srt.role_switch.capacity import Role


def perf(ranks=1, kv=100_000) -> PerfModel:
    return PerfModel(ModelConfig(
        name="toy", gpus_per_instance=ranks, dp_ranks=ranks, chunk_tokens=1000,
        prefill=PrefillParams(0.1, 0.0, 0.0), decode=DecodeParams(0.01, 0.0, 0.0),
        kv_tokens_per_rank=kv, kv_bytes_per_token=1, transfer_gbytes_per_s=1.0))


class Log:
    def __init__(self):
        self.prefilled, self.decoded = [], []

    def instance(self, p, role=None) -> Instance:
        return Instance("i0", p, role, lambda inst, r, t: self.prefilled.append((r.rid, t)),
                        lambda inst, r, t: self.decoded.append((r.rid, t)))


def run(inst: Instance, until: float = 1e6) -> None:
    """Drive one instance alone: advance to each regime end."""
    while True:
        end = inst.plan()
        if end == INF or end > until:
            return
        inst.advance(end)


def test_colocated_prefill_then_decode_on_one_rank():
    log = Log()
    inst = log.instance(perf())
    inst.add_prefill(Request(1, None, prompt=2500, done=0, output=5))
    run(inst)
    # 3 prefill chunks of 0.1 s, then 5 decode steps of 0.01 s
    assert log.prefilled == [(1, pytest.approx(0.3))]
    assert log.decoded == [(1, pytest.approx(0.35))]
    assert inst.kv_used() == 0 and inst.ranks[0].kv_reserved == 0


def test_cached_prefix_is_not_recomputed():
    log = Log()
    inst = log.instance(perf())
    inst.add_prefill(Request(1, None, prompt=2500, done=2000, output=1))
    run(inst)
    assert log.prefilled == [(1, pytest.approx(0.1))]


def test_prefill_on_one_rank_stalls_decode_on_the_other():
    """§3.2: with DP attention the decoding rank waits for the prefilling rank at every MoE layer."""
    log = Log()
    inst = log.instance(perf(ranks=2))
    inst.add_prefill(Request(1, None, prompt=10, done=0, output=100), rank=1)
    run(inst, until=0.1)  # request 1 now decodes on rank 1
    inst.advance(0.1)
    assert inst.idle_gpu_s == pytest.approx(0.1)  # rank 0 had nothing to do while rank 1 prefilled
    inst.add_prefill(Request(2, None, prompt=3000, done=0, output=1), rank=0)
    run(inst, until=0.4)
    # rank 0 prefills 3 chunks (0.3 s); rank 1 makes one decode step per 0.1 s iteration instead of ten
    assert inst.ranks[1].steps == 3
    assert inst.idle_gpu_s - 0.1 == pytest.approx(3 * 0.09)


def test_kv_admission_waits_for_room():
    log = Log()
    inst = log.instance(perf(kv=1000))
    inst.add_prefill(Request(1, None, prompt=500, done=0, output=400))
    inst.add_prefill(Request(2, None, prompt=500, done=0, output=10))
    assert len(inst.ranks[0].admit) == 1  # 900 + 510 > 1000
    run(inst)
    first_done = dict(log.decoded)[1]
    assert dict(log.prefilled)[2] > first_done  # admitted only after request 1 freed its KV


def test_decode_instance_reserves_before_transfer_and_runs_after():
    log = Log()
    inst = log.instance(perf(kv=1000), role=Role.DECODE)
    req = Request(1, None, prompt=500, done=500, output=4)
    assert inst.add_decode(req)
    assert not inst.add_decode(Request(2, None, prompt=500, done=500, output=4))  # 504 + 504 > 1000
    inst.start_decode(req)
    run(inst)
    assert log.decoded == [(1, pytest.approx(0.04))]


def test_evict_keeps_progress():
    log = Log()
    inst = log.instance(perf())
    inst.add_prefill(Request(1, None, prompt=10, done=0, output=100))
    run(inst, until=0.2)
    inst.advance(0.2)  # 0.1 s prefill + 10 decode steps
    waiting, decoding = inst.evict_all()
    assert waiting == [] and [r.generated for r in decoding] == [10]
    assert inst.kv_used() == 0 and not inst.has_work()
