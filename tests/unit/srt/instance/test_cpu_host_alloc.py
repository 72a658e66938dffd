"""The CPU host-buffer override (srt/instance/overrides.py, ``cpu_host_alloc_without_cuda_register``) on SGLang's real
ALLOC_MEMORY_FUNCS table: without CUDA the 'cpu' entry allocates without cudaHostRegister, so the routed-experts
capture buffer (SGLang's BaseHostCache) can be built; on a GPU SGLang's table stands; a changed SGLang is refused."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.pool_host import common  # noqa: E402
from sglang.srt.state_capturer import base  # noqa: E402

from sglang_prorsa.srt.common.sglang_internals import SGLangInternalsMismatch  # noqa: E402
from sglang_prorsa.srt.instance import overrides  # noqa: E402


@pytest.fixture()
def table(monkeypatch):
    """SGLang's table as shipped (no 'cpu' entry), restored after the test."""
    fresh = collections.defaultdict(common.ALLOC_MEMORY_FUNCS.default_factory,
                                    {k: v for k, v in common.ALLOC_MEMORY_FUNCS.items() if k != "cpu"})
    monkeypatch.setattr(common, "ALLOC_MEMORY_FUNCS", fresh)
    monkeypatch.setattr(base, "ALLOC_MEMORY_FUNCS", fresh)
    return fresh


def test_the_pinned_sglang_is_what_the_override_replaces(table):
    assert overrides.host_alloc_problems() == []
    assert table.default_factory() is common.alloc_with_host_register  # the fallback that registers with CUDA


def test_without_cuda_the_cpu_entry_allocates_unregistered(table, monkeypatch):
    monkeypatch.setattr(overrides, "_no_cuda", lambda: True)
    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: pytest.fail("registered with CUDA"))
    assert overrides._cpu_host_alloc() is True
    assert dict.get(table, "cpu") is overrides.cpu_host_alloc
    assert overrides.host_alloc_problems() == []  # our own entry is no mismatch: applying twice is fine
    # SGLang's routed-experts capture buffer, built as SGLang builds it: [tokens, layers, top_k] int32, zeroed.
    cache = base.BaseHostCache(num_tokens=6, num_layers=2, topk_size=3, name="routed_experts", device="cpu")
    assert cache.buffer.shape == (6, 2, 3) and cache.buffer.dtype == torch.int32
    assert cache.buffer.sum().item() == 0
    cache.buffer[4, 1] = torch.tensor([7, 1, 5], dtype=torch.int32)
    assert cache.buffer[4].tolist() == [[0, 0, 0], [7, 1, 5]]


def test_the_entry_allocates_with_the_callers_allocator_or_plainly():
    class Allocator:
        calls: list = []

        def allocate(self, dims, dtype, device):
            self.calls.append((dims, dtype, device))
            return torch.full(dims, 3, dtype=dtype)

    got = overrides.cpu_host_alloc((2, 5), dtype=torch.int32, device="cpu", pin_memory=True, allocator=Allocator())
    assert Allocator.calls == [((2, 5), torch.int32, "cpu")] and got.tolist() == [[3] * 5] * 2
    plain = overrides.cpu_host_alloc((4,), dtype=torch.float16, device="cpu", pin_memory=True, allocator=None)
    assert plain.shape == (4,) and plain.dtype == torch.float16 and not plain.is_pinned()


def test_on_a_gpu_sglangs_table_stands(table, monkeypatch):
    monkeypatch.setattr(overrides, "_no_cuda", lambda: False)
    assert overrides._cpu_host_alloc() is False
    assert "cpu" not in table


@pytest.mark.parametrize("change, problem", [
    ("own_cpu_entry", "has SGLang's own 'cpu' entry"),
    ("fallback", "no longer falls back to alloc_with_host_register"),
    ("signature", "alloc_with_host_register takes"),
    ("capture_table", "BaseHostCache no longer allocates"),
    ("plain_dict", "is no defaultdict"),
])
def test_a_changed_sglang_is_refused_loudly(table, monkeypatch, change, problem):
    if change == "own_cpu_entry":
        table["cpu"] = common.alloc_with_pin_memory
    elif change == "fallback":
        table.default_factory = lambda: common.alloc_with_pin_memory
    elif change == "signature":
        monkeypatch.setattr(common, "alloc_with_host_register", lambda shape, dtype, device, pin_memory, allocator: 0)
        table.default_factory = lambda: common.alloc_with_host_register
    elif change == "capture_table":
        monkeypatch.setattr(base, "ALLOC_MEMORY_FUNCS", dict(table))
    else:
        monkeypatch.setattr(common, "ALLOC_MEMORY_FUNCS", dict(table))
    monkeypatch.setattr(overrides, "_no_cuda", lambda: True)
    with pytest.raises(SGLangInternalsMismatch, match=problem) as e:
        overrides._cpu_host_alloc()
    assert "0.5.23" in str(e.value)
    assert dict.get(common.ALLOC_MEMORY_FUNCS, "cpu") is not overrides.cpu_host_alloc  # nothing applied


def test_registered_with_its_target_and_reason():
    overrides._register_builtin()
    o = overrides.REGISTRY.overrides["cpu_host_alloc_without_cuda_register"]
    assert o.target == "sglang.srt.mem_cache.pool_host.common:ALLOC_MEMORY_FUNCS"
    assert o.sglang_version == "0.5.23" and "cudaHostRegister" in o.reason
    owner, attr = overrides.resolve(o.target)
    assert getattr(owner, attr) is common.ALLOC_MEMORY_FUNCS
