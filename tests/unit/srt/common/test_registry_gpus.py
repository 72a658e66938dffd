"""Eq. 1's G counts each instance's GPUs as the instance reports them (tp × pp × dp of its own SGLang arguments; 1
on CPU), and GET /prorsa/instances shows them."""

from __future__ import annotations

from sglang_prorsa.policy.role_switch.capacity import gpu_budget
from sglang_prorsa.srt.common.registry import Instance, Registry


def test_a_two_gpu_instance_counts_two_in_the_allocation_input():
    registry = Registry()
    two, _ = registry.register("p", "http://10.0.0.5:30000", "prefill", "10.0.0.5", 9001, gpus=2)
    one, _ = registry.register("d", "http://10.0.0.6:30000", "decode", "10.0.0.6", 9002)  # no report: 1, as on CPU
    assert (two.gpus, one.gpus) == (2, 1)
    assert {r.instance_id: r.gpus for r in registry.reports()} == {"p": 2, "d": 1}
    assert gpu_budget(registry.reports()) == 3
    assert two.describe()["gpus"] == 2


def test_a_later_report_updates_the_count_and_nonsense_is_ignored():
    registry = Registry()
    inst, _ = registry.register("d", "http://h:1", "decode", "h", 2)
    registry.register("d", "http://h:1", "decode", "h", 2, gpus=4)  # its heartbeat, after a restart with --tp 4
    assert inst.gpus == 4
    for bad in (0, -1, True, "2", None, 2.0):
        assert not inst.take_gpus(bad)
    assert inst.gpus == 4
    assert Instance("x", "http://h:2", "prefill").gpus == 1


def test_a_registration_carries_the_gpu_count_into_the_registry():
    """An instance registered from another host (``/prorsa/register``, its heartbeat) counts the GPUs it reports,
    not one: what ``install.registration`` sends reaches ``Registry.register`` through ``workers.join``."""
    import asyncio
    from types import SimpleNamespace

    from sglang_prorsa.srt.controller import workers

    registry = Registry()

    async def nothing(*args, **kwargs):
        return None

    front = SimpleNamespace(registry=registry, orchestrator=SimpleNamespace(push_peers=nothing, router=None))
    inst, new = asyncio.run(workers.join(front, "r0", "http://10.0.0.5:30001", "decode", "10.0.0.5", 9001, gpus=4))
    assert new and inst.gpus == 4
    inst, new = asyncio.run(workers.join(front, "r0", "http://10.0.0.5:30001", "decode", "10.0.0.5", 9001, gpus=8))
    assert not new and registry.get("r0").gpus == 8
