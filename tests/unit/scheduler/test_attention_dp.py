"""Attention DP (``--tp-size 4 --attn-dp-size 2``) over a real four-process gloo world, each process a scheduler as
SGLang builds it: one TP group of all four ranks, attention-TP groups {0, 1} and {2, 3}. Each attention-DP group
leads itself: its rank 0 leads, our control messages are broadcast inside it with SGLang's ``broadcast_pyobj``, the
prefix agreement is its own, and the KV keys carry the attention-TP rank and size, never the DP group (a prefix
persisted by one group loads on the other's ranks of the same shard)."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest
import torch.multiprocessing as mp

from sglang_prorsa.srt.scheduler.ranks import Ranks, ranks_of

WORLD, ATTN_TP = 4, 2


def _group(dist, ranks: list[int], me: int):
    """A stand-in for SGLang's GroupCoordinator with the fields ranks.py reads, over a real gloo subgroup."""
    cpu = dist.new_group(ranks, backend="gloo")  # every process creates every group, in the same order
    return SimpleNamespace(rank=me, ranks=ranks, world_size=len(ranks),
                           rank_in_group=ranks.index(me) if me in ranks else -1, cpu_group=cpu)


def _rank(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from sglang_prorsa.srt.disaggregation.kv_persist import keys_for
    from sglang_prorsa.srt.disaggregation.kv_store import rank_layout
    from sglang_prorsa.srt.scheduler.ranks import ranks_of, tp_broadcast, tp_min

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        tp = _group(dist, list(range(WORLD)), rank)
        attn = [_group(dist, [0, 1], rank), _group(dist, [2, 3], rank)][rank // ATTN_TP]
        scheduler = SimpleNamespace(server_args=SimpleNamespace(attn_dp_size=2, dp_size=1, enable_dp_attention=False),
                                    tp_size=WORLD, tp_group=tp, attn_tp_group=attn,
                                    attn_cp_group=SimpleNamespace(world_size=1))
        ranks = ranks_of(scheduler, dp_rank=rank // ATTN_TP, dp_size=2)
        # each group's leader has its own waiting messages; the others pass None, as in SchedulerSide._serve_control
        got = tp_broadcast(scheduler)([f"migrate_out@dp{ranks.dp_rank}", "status"] if ranks.leader else None)
        agreed = tp_min(scheduler, [48, 32, 16, 64][rank])
        tokens = list(range(40))
        keys = keys_for(tokens, 16, "tiny|float32|L2|H1|D16|mha|P1|TP2", ranks.tp_rank)
        out.put((rank, ranks, got, agreed, keys, rank_layout("tiny|TP2", ranks.tp_rank)))
    finally:
        dist.destroy_process_group()


def test_each_attention_dp_group_leads_broadcasts_and_agrees_on_its_own():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = {r: rest for r, *rest in (out.get(timeout=90) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * WORLD

    ranks = {r: got[r][0] for r in got}
    assert ranks == {0: Ranks(0, 2, 0, 2, True), 1: Ranks(1, 2, 0, 2, True),
                     2: Ranks(0, 2, 1, 2, True), 3: Ranks(1, 2, 1, 2, True)}
    assert sorted(r for r in ranks if ranks[r].leader) == [0, 2]  # one leader per attention-DP group, not one per TP group
    # every rank handles its own group's leader's messages, in order, and never the other group's
    assert {r: got[r][1] for r in got} == {0: ["migrate_out@dp0", "status"], 1: ["migrate_out@dp0", "status"],
                                           2: ["migrate_out@dp1", "status"], 3: ["migrate_out@dp1", "status"]}
    # the fewest intact tokens of its own group: min(48, 32) and min(16, 64)
    assert {r: got[r][2] for r in got} == {0: 32, 1: 32, 2: 16, 3: 16}
    # keys per attention-TP rank: the two shards differ, the same shard in either DP group has the same keys
    keys = {r: got[r][3] for r in got}
    assert len(keys[0]) == 3 and not set(keys[0]) & set(keys[1])
    assert keys[0] == keys[2] and keys[1] == keys[3]
    assert {r: got[r][4] for r in got} == {0: "tiny|TP2|R0", 1: "tiny|TP2|R1", 2: "tiny|TP2|R0", 3: "tiny|TP2|R1"}


def _scheduler(**args) -> SimpleNamespace:
    group = SimpleNamespace(rank=3, ranks=[2, 3], world_size=2, rank_in_group=1, cpu_group=None)
    return SimpleNamespace(server_args=SimpleNamespace(**args), tp_size=4, tp_group=SimpleNamespace(rank_in_group=3),
                           attn_tp_group=group, attn_cp_group=SimpleNamespace(world_size=1))


def test_both_spellings_of_attention_dp_give_the_attention_tp_ranks():
    # --attn-dp-size 2 as SGLang resolves it, and the deprecated --dp-size 2 --enable-dp-attention before resolution
    for args in ({"attn_dp_size": 2, "dp_size": 1, "enable_dp_attention": False},
                 {"attn_dp_size": 1, "dp_size": 2, "enable_dp_attention": True}):
        assert ranks_of(_scheduler(**args), 1, 2) == Ranks(tp_rank=1, tp_size=2, dp_rank=1, dp_size=2,
                                                           attention_dp=True)
    # without attention DP the TP group is the KV group: rank 3 of 4
    plain = ranks_of(_scheduler(attn_dp_size=1, dp_size=1, enable_dp_attention=False), None, 1)
    assert plain == Ranks(tp_rank=3, tp_size=4) and not plain.leader


def test_attention_context_parallelism_is_refused_naming_the_flag():
    scheduler = _scheduler(attn_dp_size=2, dp_size=1, enable_dp_attention=False)
    scheduler.attn_cp_group = SimpleNamespace(world_size=2)
    with pytest.raises(RuntimeError, match="--attn-cp-size 2"):
        ranks_of(scheduler, 0, 2)
