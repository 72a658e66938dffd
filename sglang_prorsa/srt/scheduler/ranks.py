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

With attention DP (``--attn-dp-size``, DeepSeek-style) one TP group holds several attention-DP groups, each with its
own scheduler loop, queues and KV pool, its heads sharded over the group's attention-TP ranks. There the "ranks" here
are the attention-TP group's: its rank 0 leads (as SGLang's own receiver does), our messages are broadcast inside it
(SGLang broadcasts its work requests the same way), the KV layout's TP size and rank are the attention-TP ones, and
each attention-DP group is one DP rank with its own channel. Attention context parallelism (``--attn-cp-size`` > 1)
splits a request's KV by position across ranks: refused at start, as no key layout here describes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sglang_prorsa.srt.common.parallel import attention_dp

Broadcast = Callable[[list[Any] | None], list[Any]]


@dataclass(frozen=True)
class Ranks:
    tp_rank: int = 0  # within the group sharing one KV pool's heads (the attention-TP group under attention DP)
    tp_size: int = 1
    dp_rank: int | None = None  # None: no data parallelism (SGLang spawned no DP controller)
    dp_size: int = 1
    attention_dp: bool = False

    @property
    def leader(self) -> bool:
        """Rank 0 of its (attention) TP group: binds the channel, pushes records, answers."""
        return self.tp_rank == 0


def kv_group(scheduler: Any) -> Any:
    """The group of ranks that share one KV pool, each holding a shard of its heads (SGLang's ``GroupCoordinator``):
    the attention-TP group under attention DP, else the TP group."""
    return scheduler.attn_tp_group if attention_dp(scheduler.server_args) else scheduler.tp_group


def ranks_of(scheduler: Any, dp_rank: int | None, dp_size: int) -> Ranks:
    """This scheduler's ranks: its rank within ``kv_group``, the DP rank and size our scheduler entry read from SGLang's
    spawn arguments (``instance/scheduler_process.py``). Raises on attention context parallelism."""
    on = attention_dp(scheduler.server_args)
    cp = getattr(scheduler, "attn_cp_group", None)
    if cp is not None and int(cp.world_size) > 1:
        raise RuntimeError("prorsa: busy role switches do not support attention context parallelism (--attn-cp-size "
                           f"{cp.world_size}): it splits a request's KV by position across ranks")
    group = kv_group(scheduler)
    size = int(group.world_size) if on else int(scheduler.tp_size)
    rank = int(group.rank_in_group) if size > 1 else 0
    return Ranks(tp_rank=rank, tp_size=size, dp_rank=dp_rank, dp_size=max(1, int(dp_size)), attention_dp=on)


def tp_broadcast(scheduler: Any) -> Broadcast:
    """The leader's list handed to every rank of ``kv_group``, as SGLang broadcasts its own received requests
    (``broadcast_pyobj`` over the group's CPU group, from the group's first global rank). The others pass None."""
    from sglang.srt.utils import broadcast_pyobj

    group = kv_group(scheduler)

    def broadcast(items: list[Any] | None) -> list[Any]:
        return broadcast_pyobj(items if items is not None else [], group.rank, group.cpu_group, src=group.ranks[0])

    return broadcast


def tp_min(scheduler: Any, value: int) -> int:
    """The smallest ``value`` over ``kv_group`` (all-reduce MIN over its CPU group); every rank calls it at the same
    step (inside a control message every rank handles)."""
    return min_over(value, kv_group(scheduler).cpu_group)


def min_over(value: int, group: Any) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())
