"""Two TP ranks that found different numbers of intact tokens for one prefix load insert the same, the fewest
(``ranks.min_over`` over a real two-process gloo group, as the TP group's CPU group is on CPU)."""

from __future__ import annotations

import os
import socket

import torch.multiprocessing as mp


def _rank(rank: int, port: int, values: list[int], out) -> None:
    import torch.distributed as dist

    from sglang_prorsa.srt.scheduler.ranks import min_over

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out.put((rank, min_over(values[rank], dist.group.WORLD)))
    finally:
        dist.destroy_process_group()


def test_both_ranks_agree_on_the_fewest_tokens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, [48, 32], out)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert got == {0: 32, 1: 32} and [p.exitcode for p in procs] == [0, 0]
