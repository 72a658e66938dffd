"""The control guard around SGLang's tokenizer-manager control methods, on a stand-in tokenizer manager: what the
wrapper adds (the version of an unflushed update, the deferred flush, holds) is ours; SGLang's answers are given."""

from __future__ import annotations

import asyncio
import collections
import functools
import types

import pytest

from sglang_prorsa.srt.engine import control_guard, hooks
from sglang_prorsa.srt.engine.control_guard import NOT_FLUSHED, wrap_control

NOT_FLUSHED_ANSWER = (False, NOT_FLUSHED + " because requests are still running or queued.", 0)


class StandInTokenizerManager:
    """SGLang's answers, scripted: ``idle_after`` flush attempts before the deferred flush finds the instance idle."""

    def __init__(self, update_answer, idle_after: int, paused: bool = False) -> None:
        self.update_answer, self.idle_after, self.is_pause = update_answer, idle_after, paused
        self.flush_timeouts: list[float | None] = []
        self.versions: list[str] = []

    async def update_weights_from_disk(self, obj, request=None):
        return self.update_answer

    async def flush_cache(self, timeout_s=None):
        self.flush_timeouts.append(timeout_s)
        return types.SimpleNamespace(success=len(self.flush_timeouts) > self.idle_after)

    async def update_weight_version(self, obj):
        self.versions.append(obj.new_version)

    async def pause_generation(self, obj):
        return None


for _name in ("update_weights_from_disk", "flush_cache", "pause_generation"):
    _orig = getattr(StandInTokenizerManager, _name)
    setattr(StandInTokenizerManager, _name, functools.wraps(_orig)(wrap_control(_name)(_orig)))


@pytest.fixture(autouse=True)
def engine(monkeypatch):
    side = types.SimpleNamespace(ops_lock=asyncio.Lock(), held=set(), counters=collections.Counter(), user_aborts=0)
    monkeypatch.setattr(hooks, "ENGINE", side)
    return side


def update(tm, version="v7"):
    return asyncio.run(tm.update_weights_from_disk(types.SimpleNamespace(weight_version=version)))


def test_an_update_that_could_not_flush_is_flushed_once_idle_and_answers_success(engine):
    tm = StandInTokenizerManager(NOT_FLUSHED_ANSWER, idle_after=0)
    success, message, paused = update(tm)
    assert success is True and "Weight version updated to v7" in message and paused == 0
    assert tm.versions == ["v7"]  # recorded even though SGLang's own path skipped it
    assert tm.flush_timeouts == [control_guard.FLUSH_WAIT_S]  # SGLang's deferred flush, past our own lock
    assert engine.counters["control_update_weights_from_disk"] == 1


def test_an_instance_still_busy_after_the_wait_keeps_sglangs_answer():
    tm = StandInTokenizerManager(NOT_FLUSHED_ANSWER, idle_after=1)
    assert update(tm) == NOT_FLUSHED_ANSWER
    assert tm.versions == ["v7"] and len(tm.flush_timeouts) == 1


def test_paused_in_place_the_held_requests_will_not_finish_so_no_wait():
    tm = StandInTokenizerManager(NOT_FLUSHED_ANSWER, idle_after=0, paused=True)
    assert update(tm) == NOT_FLUSHED_ANSWER
    assert tm.flush_timeouts == [] and tm.versions == ["v7"]


def test_a_plain_success_or_another_failure_is_passed_through():
    ok = (True, "Succeeded to update model weights.", 0)
    tm = StandInTokenizerManager(ok, idle_after=0)
    assert update(tm) == ok and tm.flush_timeouts == [] and tm.versions == []
    bad = (False, "Failed to load weights: no such file", 0)
    tm = StandInTokenizerManager(bad, idle_after=0)
    assert update(tm) == bad and tm.flush_timeouts == [] and tm.versions == []


def test_a_pause_holds_switches_and_an_abort_pause_is_counted(engine):
    tm = StandInTokenizerManager(NOT_FLUSHED_ANSWER, idle_after=0)
    asyncio.run(tm.pause_generation(types.SimpleNamespace(mode="abort")))
    assert engine.held == {"generation paused"} and engine.user_aborts == 1
