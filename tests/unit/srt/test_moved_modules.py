"""Old import paths of modules that moved still work: the same module object, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys

import pytest

from sglang_prorsa import srt


@pytest.mark.parametrize("old,new", [
    ("sglang_prorsa.srt.lifecycle.events", "sglang_prorsa.policy.lifecycle.events"),
    ("sglang_prorsa.srt.lifecycle.control_plane", "sglang_prorsa.policy.control_plane"),
    ("sglang_prorsa.srt.forecast.predictor", "sglang_prorsa.policy.forecast.predictor"),
    ("sglang_prorsa.srt.role_switch.allocator", "sglang_prorsa.policy.role_switch.allocator"),
    ("sglang_prorsa.srt.utils.clock", "sglang_prorsa.policy.clock"),
    ("sglang_prorsa.srt.controller.registry", "sglang_prorsa.srt.common.registry"),
    ("sglang_prorsa.srt.messages", "sglang_prorsa.srt.common.messages"),
])
def test_an_old_path_imports_the_module_at_its_new_place(old, new):
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        del sys.modules[name]  # another test may have imported it already
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new  # the real module keeps its own spec


def test_from_import_of_a_class_through_an_old_path():
    with pytest.warns(DeprecationWarning):
        from sglang_prorsa.srt.forecast.config import PredictorConfig as old  # noqa: F401
    from sglang_prorsa.policy.forecast.config import PredictorConfig

    assert old is PredictorConfig


def test_every_moved_target_exists_and_unmoved_names_are_left_alone():
    for target in srt.MOVED.values():
        assert importlib.util.find_spec(target) is not None, target
    assert srt.new_name("sglang_prorsa.srt.engine.hooks") is None
    assert srt.new_name("sglang_prorsa.srt.lifecycle_routes") is None  # a prefix of the name, not of the path
    assert srt.new_name("sglang_prorsa.srt.forecast.stores") == "sglang_prorsa.policy.forecast.stores"
