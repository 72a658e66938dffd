"""Every SGLang internal we touch is declared in srt/common/sglang_internals.py and checked at start-up (issue item 6):
the check passes against the installed, pinned SGLang, and fails loudly -- naming each missing item and the SGLang
version -- when a declared name is gone."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from sglang_prorsa.srt.common import sglang_internals as si
from sglang_prorsa.srt.common.pins import SGLANG_VERSION

HERE = __name__  # fake "SGLang" classes below are declared as f"{HERE}:Class"


def test_the_pinned_sglang_has_every_declared_internal():
    assert si.class_level_problems() == []
    si.check_class_level()  # what apply_overrides() runs at start-up


def test_instance_attributes_are_read_from_the_class_source():
    """Attributes set only in a method's body (no class attribute, no field) are found by reading the source, so a
    scheduler or a tokenizer manager need not be built to check them."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    assert "rid_to_state" not in dir(TokenizerManager) and "rid_to_state" in si.instance_names(TokenizerManager)
    assert "weight_version_events" not in dir(Req) and "weight_version_events" in si.instance_names(Req)
    assert "no_such_attribute" not in si.instance_names(Req)


def test_our_field_lists_are_declared():
    """The names our code reads by a computed name (getattr(obj, name)) are all declared."""
    from sglang_prorsa.policy.lifecycle.engine_api import SGLANG_ID_FIELDS
    from sglang_prorsa.srt.engine import continuation, request_guard
    from sglang_prorsa.srt.scheduler import extension

    assert set(request_guard.PER_PROMPT + request_guard.PD_FIELDS) <= set(si.GENERATE_REQ_FIELDS)
    assert set(continuation.CARRIED_FIELDS) <= set(si.GENERATE_REQ_FIELDS)
    assert set(SGLANG_ID_FIELDS) <= set(si.GENERATE_REQ_FIELDS)  # hooks.trajectory_of reads them on the request
    assert set(extension._SAMPLING_FIELDS) <= set(si.SAMPLING_PARAMS_FIELDS)
    declared = {t: set(a) for t, a, _ in si.INSTANCE_LEVEL}
    assert set(si.GENERATE_REQ_FIELDS) <= declared["sglang.srt.managers.io_struct:GenerateReqInput"]
    assert set(si.REQ_ATTRIBUTES) <= declared["sglang.srt.managers.schedule_batch:Req"]


# -- stand-ins for an SGLang that changed ------------------------------------------------------------------------------
class FakeReq:
    kind = "class attribute"

    def __init__(self) -> None:
        self.rid = "r1"
        self.origin_input_ids, self.output_ids = [1], []
        if self.rid is None:  # set on one code path only: still an attribute the class has
            self.rare = 0

    def finished(self) -> bool:
        return False


@dataclasses.dataclass
class FakeInput:
    text: str | None = None


def fake_flush(self, timeout_s=None):  # noqa: ARG001
    return None


def _failure(monkeypatch, **tables) -> str:
    for name, value in tables.items():
        monkeypatch.setattr(si, name, value)
    assert si.class_level_problems()
    with pytest.raises(si.SGLangInternalsMismatch) as e:
        si.check_class_level()
    return str(e.value)


def test_the_stand_ins_pass_when_nothing_is_missing(monkeypatch):
    monkeypatch.setattr(si, "CLASS_LEVEL", ((f"{HERE}:FakeReq.finished", "x"),))
    monkeypatch.setattr(si, "INSTANCE_LEVEL", (
        (f"{HERE}:FakeReq", ("rid", "origin_input_ids", "output_ids", "rare", "kind", "finished"), "x"),
        (f"{HERE}:FakeInput", ("text",), "x")))
    monkeypatch.setattr(si, "SIGNATURES", ((f"{HERE}:fake_flush", ("self", "timeout_s")),))
    monkeypatch.setattr(si, "CONSTANTS", ((f"{HERE}:HERE", HERE, "x"),))
    assert si.class_level_problems() == []


def test_a_missing_instance_attribute_fails_loudly_naming_each_item_and_the_version(monkeypatch):
    message = _failure(monkeypatch, CLASS_LEVEL=(), SIGNATURES=(), CONSTANTS=(), INSTANCE_LEVEL=(
        (f"{HERE}:FakeReq", ("rid", "bootstrap_room", "weight_version_events"), "taking requests off"),
        (f"{HERE}:FakeInput", ("text", "input_ids"), "the request guard")))
    assert f"{HERE}:FakeReq: an instance has no 'bootstrap_room' (used for: taking requests off)" in message
    assert f"{HERE}:FakeReq: an instance has no 'weight_version_events'" in message
    assert f"{HERE}:FakeInput: an instance has no 'input_ids' (used for: the request guard)" in message
    assert "'rid'" not in message and "'text'" not in message
    assert message.startswith("3 SGLang internal(s)")
    assert f"written against sglang {SGLANG_VERSION}" in message and "installed sglang " in message


def test_a_missing_class_level_name_module_signature_or_constant_fails_loudly(monkeypatch):
    message = _failure(
        monkeypatch, INSTANCE_LEVEL=(),
        CLASS_LEVEL=((f"{HERE}:FakeReq.abort_request", "aborts"), ("sglang.srt.no_such_module:Thing", "nothing")),
        SIGNATURES=((f"{HERE}:fake_flush", ("self", "timeout")),),
        CONSTANTS=((f"{HERE}:HERE", "another value", "health checks"),))
    assert f"{HERE}:FakeReq.abort_request: SGLang has no 'abort_request' here (used for: aborts)" in message
    assert "sglang.srt.no_such_module:Thing: SGLang has no module sglang.srt.no_such_module" in message
    assert f"{HERE}:fake_flush: parameters ('self', 'timeout_s'), expected ('self', 'timeout') first" in message
    assert f"{HERE}:HERE is {HERE!r}, not 'another value' (used for: health checks)" in message
    assert message.startswith("4 SGLang internal(s)")


def test_a_real_sglang_class_missing_a_declared_attribute_is_named(monkeypatch):
    """As if SGLang renamed GenerateReqInput.bootstrap_room: declared under the old name, the check names it."""
    target = "sglang.srt.managers.io_struct:GenerateReqInput"
    message = _failure(monkeypatch, CLASS_LEVEL=(), SIGNATURES=(), CONSTANTS=(),
                       INSTANCE_LEVEL=((target, ("bootstrap_room", "bootstrap_room_id"), "resume"),))
    assert f"{target}: an instance has no 'bootstrap_room_id'" in message and "'bootstrap_room'" not in message


def test_live_objects_are_checked_too():
    tm_target = "sglang.srt.managers.tokenizer_manager:TokenizerManager"
    declared = next(a for t, a, _ in si.INSTANCE_LEVEL if t == tm_target)
    si.check_instance(SimpleNamespace(**dict.fromkeys(declared)), tm_target)
    with pytest.raises(si.SGLangInternalsMismatch, match="the live SimpleNamespace has no 'rid_to_state'"):
        si.check_instance(SimpleNamespace(**dict.fromkeys(set(declared) - {"rid_to_state"})), tm_target)

    tree = SimpleNamespace(**dict.fromkeys(si.TREE_CACHE_METHODS))
    scheduler = SimpleNamespace(**{**dict.fromkeys(si.SCHEDULER_ATTRIBUTES["any"]), "tree_cache": tree})
    si.check_scheduler(scheduler, "null")
    del tree.disable
    with pytest.raises(si.SGLangInternalsMismatch) as e:
        si.check_scheduler(scheduler, "prefill")
    assert "the live prefill scheduler has no 'disagg_prefill_bootstrap_queue'" in str(e.value)
    assert "the live prefill scheduler has no 'tree_cache.disable'" in str(e.value)
    assert f"written against sglang {SGLANG_VERSION}" in str(e.value)


def test_start_up_refuses_to_apply_the_overrides_on_a_mismatch(monkeypatch):
    from sglang_prorsa.srt.instance import overrides

    monkeypatch.setattr(si, "INSTANCE_LEVEL", ((f"{HERE}:FakeReq", ("gone",), "x"),))
    with pytest.raises(si.SGLangInternalsMismatch, match=f"{HERE}:FakeReq: an instance has no 'gone'"):
        overrides.apply_overrides()


def test_a_passed_check_is_recorded_and_a_changed_declaration_checks_again(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_PRORSA_CACHE", str(tmp_path))
    si.check_class_level()
    stamps = list((tmp_path / "sglang-internals-checked").iterdir())
    assert len(stamps) == 1 and stamps[0] == si._passed_stamp()
    calls = []
    monkeypatch.setattr(si, "class_level_problems", lambda: calls.append(1) or [])
    si.check_class_level()
    assert calls == []  # recorded: not parsed again
    monkeypatch.setattr(si, "CONSTANTS", si.CONSTANTS + ((f"{HERE}:SGLANG_VERSION", "9.9", "x"),))
    assert si._passed_stamp() != stamps[0]
    si.check_class_level()
    assert calls == [1]  # another declaration: checked again
