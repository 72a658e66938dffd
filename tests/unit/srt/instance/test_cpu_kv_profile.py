"""The CPU KV-pool override (srt/instance/overrides.py, ``cpu_kv_pool_sized_by_tokens``) on SGLang's real
KVCacheConfigurator method: a free-RAM dip while the weights load no longer stops a CPU instance that has a token
budget; a GPU instance, or one without a token budget, still gets SGLang's error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang.srt.mem_cache import kv_cache_configurator as kvc  # noqa: E402

from sglang_prorsa.srt.instance import overrides  # noqa: E402


class Refusing(kvc.KVCacheConfigurator):
    """The real class with SGLang's check stubbed to refuse, as it does when free RAM fell during the load."""

    def __init__(self, device: str) -> None:  # no model needed: only the wrapped method runs
        self.device = device


@pytest.fixture()
def wrapped(monkeypatch):
    def refuse(self, pre_model_load_memory):
        raise ValueError("Loaded weights leave no GPU memory for the KV cache")

    monkeypatch.setattr(kvc.KVCacheConfigurator, "_profile_available_bytes", refuse)
    assert overrides._wrap_cpu_kv_profile()
    return lambda tokens: monkeypatch.setattr(kvc, "get_schedule", lambda: SimpleNamespace(max_total_tokens=tokens))


def test_a_cpu_instance_with_a_token_budget_starts_sized_by_it(wrapped):
    wrapped(65536)
    assert Refusing("cpu")._profile_available_bytes(10 << 30) == overrides._UNBOUNDED_KV_BYTES


@pytest.mark.parametrize("device,tokens", [("cuda", 65536), ("cpu", None)])
def test_otherwise_sglangs_refusal_stands(wrapped, device, tokens):
    wrapped(tokens)
    with pytest.raises(ValueError, match="leave no GPU memory"):
        Refusing(device)._profile_available_bytes(10 << 30)
