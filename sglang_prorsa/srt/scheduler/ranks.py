"""Where this scheduler process sits in its instance's parallel layout, and how our control messages reach every
tensor-parallel rank.

With tensor parallelism SGLang runs one scheduler process per TP rank, each holding its shard of the KV heads, all
running the same loop in lockstep: rank 0 receives the requests and broadcasts them to the others over the TP group's
CPU (gloo) group (``broadcast_pyobj``), so every rank changes its queues, batches and prefix cache the same way. Our
control messages must follow the same rule, or a request taken off rank 0 only would leave the ranks diverged. So only
rank 0 binds the private channel (``srt/common/channel.py``) and pushes records; at the poll point, which every rank
reaches at the same step, rank 0 drains the waiting messages and broadcasts them, every rank handles them in the same
order (each persisting or loading its own shard), and rank 0 sends the replies. With one TP rank no collective runs.

With data parallelism (``--dp-size``) each DP rank is its own scheduler group with its own TP group; each group's TP
rank 0 binds a channel of its own (``ChannelAddresses.for_dp_rank``), and the engine side fans out to all of them
(``srt/engine/dp.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Broadcast = Callable[[list[Any] | None], list[Any]]


@dataclass(frozen=True)
class Ranks:
    tp_rank: int = 0
    tp_size: int = 1
    dp_rank: int | None = None  # None: no data parallelism (SGLang spawned no DP controller)
    dp_size: int = 1

    @property
    def leader(self) -> bool:
        """TP rank 0 of its DP group: binds the channel, pushes records, answers."""
        return self.tp_rank == 0


def ranks_of(scheduler: Any, dp_rank: int | None, dp_size: int) -> Ranks:
    """This scheduler's ranks: the TP rank within its DP group's TP group (SGLang's ``tp_group``), the DP rank and size
    our scheduler entry read from SGLang's spawn arguments (``instance/scheduler_process.py``)."""
    tp_size = int(scheduler.tp_size)
    tp_rank = int(scheduler.tp_group.rank_in_group) if tp_size > 1 else 0
    return Ranks(tp_rank=tp_rank, tp_size=tp_size, dp_rank=dp_rank, dp_size=max(1, int(dp_size)))


def tp_broadcast(scheduler: Any) -> Broadcast:
    """Rank 0's list handed to every rank of the scheduler's TP group, as SGLang broadcasts its own ``recv_reqs``
    (``broadcast_pyobj`` over the group's CPU group, from the group's first global rank). The others pass None."""
    from sglang.srt.utils import broadcast_pyobj

    group = scheduler.tp_group

    def broadcast(items: list[Any] | None) -> list[Any]:
        return broadcast_pyobj(items if items is not None else [], group.rank, group.cpu_group, src=group.ranks[0])

    return broadcast


def tp_min(scheduler: Any, value: int) -> int:
    """The smallest ``value`` over the scheduler's TP group (all-reduce MIN over its CPU group); every rank calls it
    at the same step (inside a control message every rank handles)."""
    return min_over(value, scheduler.tp_group.cpu_group)


def min_over(value: int, group: Any) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())
