"""A broken kernels install stops the launch and the scheduler at start-up (launch_server.check_kernels_importable,
srt/scheduler/kv.py), where before the scheduler logged it and served on: every busy switch of that instance then
failed an hour into a soak ("No module named 'sglang_prorsa.kernels'"), and its requests were failed after 16 moves.
An unsupported pool layout still only disables switching for that pool."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from sglang_prorsa import launch_server  # noqa: E402
from sglang_prorsa.srt.scheduler.counters import InstanceCounters  # noqa: E402
from sglang_prorsa.srt.scheduler.kv import KVSide  # noqa: E402


def _scheduler() -> SimpleNamespace:
    return SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: object()))


def test_launch_stops_when_the_kernels_cannot_be_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang_prorsa.kernels", None)  # importing it now raises ImportError
    with pytest.raises(SystemExit) as exc:
        launch_server.check_kernels_importable()
    assert "sglang_prorsa.kernels" in str(exc.value.code) and "reinstall" in str(exc.value.code)


def test_launch_check_passes_on_a_sound_install():
    launch_server.check_kernels_importable()
    assert "sglang_prorsa.kernels" in sys.modules


def test_scheduler_refuses_to_start_without_the_kernels(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang_prorsa.kernels", None)
    with pytest.raises(RuntimeError, match="kernels cannot be imported"):
        KVSide(_scheduler(), store_config=None, counters=InstanceCounters())


def test_an_unsupported_pool_only_disables_switching(caplog):
    # A plain object is no SGLang KV pool: the codec refuses it with TypeError; the scheduler still starts.
    kv = KVSide(_scheduler(), store_config=None, counters=InstanceCounters())
    assert kv._codec is None
    assert "KV export kernels unavailable" in caplog.text
    with pytest.raises(TypeError, match="unsupported KV pool type"):
        kv.codec()
