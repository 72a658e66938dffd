"""The instance's regime stepping against hand-computed times (instance.py): chunking, DP sync and its idle split,
prefix cache, admission by slots and KV, retraction, busy intervals."""

import pytest

from sglang_prorsa.policy.role_switch.capacity import Role
from sglang_prorsa.sim.config import DecodeParams, ModelConfig, PrefillParams
from sglang_prorsa.sim.instance import INF, Instance, Request
from sglang_prorsa.sim.perf_model import PerfModel


def perf(ranks=1, kv=100_000, slots=64, reserve=0) -> PerfModel:
    return PerfModel(ModelConfig(
        name="toy", gpus_per_instance=ranks, dp_ranks=ranks, chunk_tokens=1000,
        prefill=PrefillParams(0.1, 0.0, 0.0), decode=DecodeParams(0.01, 0.0, 0.0),
        kv_tokens_per_rank=kv, kv_bytes_per_token=1, transfer_gbytes_per_s=1.0, max_running_per_rank=slots,
        reserved_decode_tokens=reserve))


class Log:
    def __init__(self):
        self.prefilled, self.decoded, self.admitted, self.intervals = [], [], [], []

    def instance(self, p, role=None) -> Instance:
        return Instance("i0", p, role, lambda inst, r, t: self.prefilled.append((r.rid, t)),
                        lambda inst, r, t: self.decoded.append((r.rid, t)),
                        lambda inst, rs, r, t: self.admitted.append((r.rid, t)),
                        lambda inst, *sample: self.intervals.append(sample))


def run(inst: Instance, until: float = 1e6) -> None:
    """Drive one instance alone: advance to each regime end."""
    while True:
        end = inst.plan()
        if end == INF or end > until:
            return
        inst.advance(end)


def req(rid, prompt, output, done=0, owner=None):
    return Request(rid, owner if owner is not None else f"traj{rid}", prompt, done, output, cached=done)


def test_colocated_prefill_then_decode_on_one_rank():
    log = Log()
    inst = log.instance(perf())
    inst.add_prefill(req(1, 2500, 5), 0, 0.0)
    run(inst)
    # 3 prefill chunks of 0.1 s, then 5 decode steps of 0.01 s
    assert log.prefilled == [(1, pytest.approx(0.3))]
    assert log.decoded == [(1, pytest.approx(0.35))]
    assert inst.kv_used() == 0 and inst.n_requests == 0
    # the finished sequence (prompt + output) stays in the rank's prefix cache
    assert inst.cached_tokens(0, "traj1") == 2505


def test_cached_prefix_is_not_recomputed():
    log = Log()
    inst = log.instance(perf())
    inst.add_prefill(req(1, 2500, 1, done=2000), 0, 0.0)
    run(inst)
    assert log.prefilled == [(1, pytest.approx(0.1))]


def test_a_fully_cached_prompt_still_computes_its_last_token():
    """A prompt the cache holds whole would otherwise leave a 0-token chunk at the queue head: no iteration could
    remove it and the rank would re-plan forever (SGLang caps the prefix match at all but the last token)."""
    log = Log()
    inst = log.instance(perf())
    inst.add_prefill(req(1, 2500, 1, done=2500), 0, 0.0)
    inst.add_prefill(req(2, 500, 1), 0, 0.0)
    run(inst)
    assert log.prefilled == [(1, pytest.approx(0.1)), (2, pytest.approx(0.1))]  # one 501-token chunk


def test_prefill_on_one_rank_stalls_decode_on_the_other_and_counts_as_interference():
    """§3.2: with DP attention the decoding rank waits for the prefilling rank at every MoE layer."""
    log = Log()
    inst = log.instance(perf(ranks=2))
    inst.add_prefill(req(1, 10, 100), 1, 0.0)
    run(inst, until=0.1)  # request 1 now decodes on rank 1
    inst.advance(0.1)
    assert inst.imbalance_gpu_s == pytest.approx(0.1)  # rank 0 had nothing to do while rank 1 prefilled
    assert inst.interference_gpu_s == 0.0
    inst.add_prefill(req(2, 3000, 1), 0, 0.1)
    run(inst, until=0.4)
    # rank 0 prefills 3 chunks (0.3 s); rank 1 makes one decode step per 0.1 s iteration instead of ten
    assert inst.ranks[1].steps == 3
    assert inst.interference_gpu_s == pytest.approx(3 * 0.09)  # decode rank held by the prefill rank
    assert inst.imbalance_gpu_s == pytest.approx(0.1)


def test_admission_waits_for_a_slot():
    log = Log()
    inst = log.instance(perf(slots=1))
    inst.add_prefill(req(1, 500, 400), 0, 0.0)
    inst.add_prefill(req(2, 500, 10), 0, 0.0)
    assert len(inst.ranks[0].admit) == 1 and inst.queued_requests() == 1 and inst.running_requests() == 1
    run(inst)
    assert dict(log.prefilled)[2] > dict(log.decoded)[1]  # admitted only after request 1 left its slot


def test_admission_keeps_reserved_decode_headroom():
    # pool 2000, 512 tokens of headroom per running request: 500 + 512 fits, a second 500 + 2 x 512 does not
    log = Log()
    inst = log.instance(perf(kv=2000, reserve=512))
    inst.add_prefill(req(1, 500, 10), 0, 0.0)
    inst.add_prefill(req(2, 500, 10), 0, 0.0)
    assert [r.rid for r in inst.ranks[0].admit] == [2]


def test_decode_preallocates_then_runs_after_transfer():
    log = Log()
    inst = log.instance(perf(kv=1000), role=Role.DECODE)
    first = req(1, 500, 4, done=500)
    inst.add_decode(first, 0, 0.0)
    assert log.admitted == [(1, 0.0)] and inst.ranks[0].reserved == 500
    inst.add_decode(req(2, 600, 4, done=600), 0, 0.0)  # 500 + 600 > 1000: waits in the pre-allocation queue
    assert log.admitted == [(1, 0.0)] and inst.queued_requests() == 1
    inst.start_decode(first)
    run(inst)
    assert log.decoded == [(1, pytest.approx(0.04))] and log.admitted[1][0] == 2


def test_no_retraction_while_the_pool_holds():
    # pool 1000: 450 + 450 grow by one token a step each; b stops at 20 tokens, a alone never reaches 1000
    log = Log()
    inst = log.instance(perf(kv=1000), role=Role.DECODE)
    a, b = req(1, 450, 200, done=450), req(2, 450, 20, done=450)
    for r in (a, b):
        inst.add_decode(r, 0, 0.0)
        inst.start_decode(r)
    run(inst)
    assert inst.retractions == 0
    assert dict(log.decoded) == {2: pytest.approx(0.2), 1: pytest.approx(2.0)}


def test_overflowing_pair_parks_one_until_room():
    log = Log()
    inst = log.instance(perf(kv=1000), role=Role.DECODE)
    a, b = req(1, 450, 200, done=450), req(2, 460, 200, done=460)
    for r in (a, b):
        inst.add_decode(r, 0, 0.0)
        inst.start_decode(r)
    run(inst)
    # after 45 steps: 495 + 505 = 1000 free 0 < batch 2 -> the one with fewer tokens generated (tie) and the longer
    # prompt (b) is parked with its KV on the CPU; a finishes, then b resumes and finishes.
    assert inst.retractions == 1
    order = [rid for rid, _ in log.decoded]
    assert order == [1, 2]
    assert dict(log.decoded)[1] == pytest.approx(2.0)  # 200 steps of 0.01 s
    assert dict(log.decoded)[2] == pytest.approx(2.0 + 1.55)  # the other 155 steps after a leaves


def test_prefill_instance_caches_prompts_and_reports_busy_intervals():
    log = Log()
    inst = log.instance(perf(), role=Role.PREFILL)
    inst.add_prefill(req(1, 1500, 1, done=500), 0, 0.0)  # 1000 new tokens, 500 cached
    inst.add_prefill(req(2, 1000, 1), 0, 0.0)
    run(inst)
    assert [rid for rid, _ in log.prefilled] == [1, 2]
    assert log.intervals == [(1000 + 1000, 500, 2, pytest.approx(0.2))]  # one rank of one: wall time
    assert inst.cached_tokens(0, "traj1") == 1500 and inst.n_requests == 0


def test_a_saturated_prefill_instance_reports_busy_slices():
    """Busy longer than theta.MAX_SAMPLE_S (10 s): the interval closes at the first completion past it, and the next
    slice starts there. Each request is 60 chunks of 1,000 tokens at 0.1 s: done at 6, 12 and 18 s."""
    log = Log()
    inst = log.instance(perf(), role=Role.PREFILL)
    for rid in (1, 2, 3):
        inst.add_prefill(req(rid, 60_000, 1), 0, 0.0)
    run(inst)
    assert [rid for rid, _ in log.prefilled] == [1, 2, 3]
    assert log.intervals == [(120_000, 0, 2, pytest.approx(12.0)), (60_000, 0, 1, pytest.approx(6.0))]


def test_prefix_cache_lives_in_free_kv():
    log = Log()
    inst = log.instance(perf(kv=3000))
    inst.add_prefill(req(1, 1000, 10), 0, 0.0)
    run(inst)
    inst.add_prefill(req(2, 1500, 10), 0, inst.t)
    run(inst)
    assert inst.ranks[0].cache.tokens == 1010 + 1510
    inst.add_prefill(req(3, 2000, 100), 0, inst.t)  # 2000 in use: only 1000 left for the cache -> LRU evicted
    assert inst.cached_tokens(0, "traj1") == 0 and inst.cached_tokens(0, "traj2") == 0


def test_evict_keeps_progress():
    log = Log()
    inst = log.instance(perf())
    inst.add_prefill(req(1, 10, 100), 0, 0.0)
    run(inst, until=0.2)
    inst.advance(0.2)  # 0.1 s prefill + 10 decode steps
    waiting, decoding = inst.evict_all()
    assert waiting == [] and [r.generated for r in decoding] == [10]
    assert inst.kv_used() == 0 and not inst.has_work() and inst.n_requests == 0
    assert inst.ranks[0].cache.tokens == 0
