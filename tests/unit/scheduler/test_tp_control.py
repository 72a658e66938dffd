"""Control messages with tensor parallelism (srt/scheduler/extension.py, ranks.py): only TP rank 0 binds the channel;
at the poll point it drains the waiting messages and broadcasts them, every rank handles the same messages in the same
order, and rank 0 alone answers (and pushes records). With one TP rank no broadcast runs at all. The TP group's
broadcast is a stand-in here: a bus that hands rank 0's list to rank 1, as SGLang's broadcast_pyobj does."""

from __future__ import annotations

import pickle
import time
from types import SimpleNamespace

import pytest
import zmq

from sglang_prorsa.srt.common.channel import ChannelAddresses, SchedulerChannel
from sglang_prorsa.srt.common.messages import MigratedRequest, Stage, Status
from sglang_prorsa.srt.scheduler import extension
from sglang_prorsa.srt.scheduler.extension import SchedulerRuntime, SchedulerSide


class Side(SchedulerSide):
    """A scheduler side whose handler records what it handled and answers with its own rank."""

    def __init__(self, *args, **kwargs) -> None:
        self.handled: list = []
        super().__init__(*args, **kwargs)

    def handle(self, msg):
        self.handled.append(msg)
        return f"rank {self.ranks.tp_rank}: {msg.since}"

    # the rest of a poll (queues, holds, busy intervals) is not what this test is about
    def _release_late_arrivals(self) -> None: ...
    def quiet(self) -> bool: return True  # noqa: E704
    def _known_rids(self): return set(), set()  # noqa: E704


def scheduler(tp_rank: int, tp_size: int) -> SimpleNamespace:
    return SimpleNamespace(disaggregation_mode=SimpleNamespace(value="decode"), idle_sleeper=None, tp_size=tp_size,
                           tp_group=SimpleNamespace(rank_in_group=tp_rank),
                           server_args=SimpleNamespace(enable_dp_attention=False),
                           running_batch=SimpleNamespace(reqs=[]))


@pytest.fixture
def runtime(monkeypatch):
    monkeypatch.setattr(extension.sglang_internals, "check_scheduler", lambda s, role: None)
    monkeypatch.setattr(extension, "KVSide", lambda *a, **k: SimpleNamespace(expire_holds=lambda known: None))
    return SchedulerRuntime(instance_id="i", channel=ChannelAddresses.fresh(), kv_store=None)


def senders(addresses: ChannelAddresses, n: int) -> list[zmq.Socket]:
    """``n`` engine-side REQ sockets, each with one message waiting (Status(since=k))."""
    out = []
    for k in range(n):
        s = zmq.Context.instance().socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(addresses.control)
        s.send(pickle.dumps(Status(since=k)))
        out.append(s)
    return out


def test_rank_0_broadcasts_every_rank_handles_the_same_messages_in_order_and_rank_0_alone_answers(runtime):
    bus: list[list] = []
    calls: list[tuple[int, object]] = []

    def broadcast_of(rank):
        def broadcast(items):
            calls.append((rank, items))
            if rank == 0:
                bus.append(list(items))
                return items
            assert items is None  # a follower has nothing of its own to send
            return bus.pop(0)
        return broadcast

    rank0 = Side(scheduler(0, 2), runtime, broadcast=broadcast_of(0))
    rank1 = Side(scheduler(1, 2), runtime, broadcast=broadcast_of(1))
    assert isinstance(rank0.channel, SchedulerChannel) and rank1.channel is None  # only rank 0 binds
    socks = senders(runtime.channel, 3)
    deadline = time.monotonic() + 10
    while len(rank0.handled) < 3 and time.monotonic() < deadline:  # lockstep: each poll on both ranks
        rank0.poll()
        rank1.poll()
    assert sorted(m.since for m in rank0.handled) == [0, 1, 2]
    assert rank1.handled == rank0.handled  # the same messages, in the same order
    assert all(rank == 0 or items is None for rank, items in calls)
    assert len([c for c in calls if c[0] == 0]) == len([c for c in calls if c[0] == 1])  # one broadcast per poll each
    for k, s in enumerate(socks):
        assert s.poll(5000) and pickle.loads(s.recv()) == f"rank 0: {k}"  # rank 0's reply; rank 1's are dropped
        s.close()


def test_only_rank_0_pushes_records(runtime):
    pushed = []
    rank0 = Side(scheduler(0, 2), runtime, broadcast=lambda items: items)
    rank1 = Side(scheduler(1, 2), runtime, broadcast=lambda items: [])
    rank0.channel.push = pushed.append
    record = MigratedRequest(rid="r", role="decode", stage=Stage.QUEUED, input_ids=[1], output_ids=[],
                             sampling_params={})
    rank0._push(record)
    rank1._push(record)  # no channel: nothing, and no error
    assert pushed == [record]


def test_with_one_tp_rank_no_broadcast_runs(runtime):
    def never(items):
        raise AssertionError("no collective with tp_size 1")

    side = Side(scheduler(0, 1), runtime, broadcast=never)
    assert side.broadcast is None and side.ranks.tp_size == 1
    socks = senders(runtime.channel, 2)
    deadline = time.monotonic() + 10
    while len(side.handled) < 2 and time.monotonic() < deadline:
        side.poll()
    assert sorted(m.since for m in side.handled) == [0, 1]
    for k, s in enumerate(socks):
        assert s.poll(5000) and pickle.loads(s.recv()) == f"rank 0: {k}"
        s.close()


def test_dp_ranks_bind_their_own_channels(runtime):
    import dataclasses

    side = Side(scheduler(0, 1), dataclasses.replace(runtime, dp_rank=1, dp_size=2))
    assert side.ranks.dp_rank == 1
    assert runtime.channel.for_dp_rank(1, 2).control == runtime.channel.control + "-dp1"
    assert runtime.channel.for_dp_rank(None, 1) == runtime.channel == runtime.channel.for_dp_rank(0, 1)
    s = senders(runtime.channel.for_dp_rank(1, 2), 1)[0]
    deadline = time.monotonic() + 10
    while not side.handled and time.monotonic() < deadline:
        side.poll()
    assert s.poll(5000) and pickle.loads(s.recv()) == "rank 0: 0"
    s.close()


def test_the_scheduler_entry_reads_the_dp_rank_from_sglangs_spawn_arguments(runtime):
    from sglang_prorsa.srt.instance.scheduler_process import with_spawn_ranks

    server_args = SimpleNamespace(dp_size=2)
    # SGLang's DP controller: run_scheduler_process(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe)
    spawned = with_spawn_ranks(runtime, (server_args, "ports", 0, 1, 0, 1, "pipe"), {})
    assert (spawned.dp_rank, spawned.dp_size, spawned.channel) == (1, 2, runtime.channel)
    # SGLang's engine without data parallelism passes dp_rank None: the runtime as it came
    assert with_spawn_ranks(runtime, (server_args, "ports", 0, 0, 0, None, "pipe"), {}) is runtime
    assert with_spawn_ranks(runtime, (), {"server_args": server_args, "dp_rank": 0}).dp_rank == 0
    # attention DP as the schedulers see it (SGLang resolved --attn-dp-size 2): two DP ranks, two channels
    attention = SimpleNamespace(dp_size=1, attn_dp_size=2, enable_dp_attention=False)
    assert with_spawn_ranks(runtime, (attention, "ports", 0, 3, 0, 1, "pipe"), {}).dp_size == 2
