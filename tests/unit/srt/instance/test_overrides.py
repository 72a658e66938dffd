"""The override registry: pinned SGLang version, every target exists, a mismatch fails loudly."""

from __future__ import annotations

import pytest

from sglang_prorsa.srt.instance import overrides


def test_installed_sglang_is_the_pinned_version():
    # If this fails, re-check every override against the new SGLang before moving the pin.
    assert overrides.installed_sglang_version() == overrides.SGLANG_VERSION == "0.5.23"


def test_version_mismatch_refuses_to_apply(monkeypatch):
    monkeypatch.setattr(overrides, "installed_sglang_version", lambda: "0.5.99")
    with pytest.raises(overrides.SGLangVersionMismatch, match="0.5.99"):
        overrides.apply_overrides()


def test_every_override_target_exists_and_has_a_reason():
    overrides._register_builtin()
    assert overrides.REGISTRY.overrides, "the registry is empty"
    for o in overrides.REGISTRY.overrides.values():
        owner, attr = overrides.resolve(o.target)
        assert hasattr(owner, attr)
        assert len(o.reason) > 40 and o.sglang_version == overrides.SGLANG_VERSION


def test_missing_target_is_an_error():
    with pytest.raises(AttributeError, match="does not exist"):
        overrides.resolve("sglang.srt.server_args:ServerArgs.no_such_attribute_here")


def test_registering_a_name_twice_is_refused():
    reg = overrides.OverrideRegistry()
    o = overrides.Override(name="x", target="m:a", reason="r", apply=lambda: True)
    reg.register(o)
    with pytest.raises(ValueError, match="twice"):
        reg.register(o)


def test_pypi_kernels_is_not_shadowed_by_our_kernels_folder():
    # Our kernels/ folder is installed as sglang_prorsa.kernels; the top-level name belongs to PyPI's `kernels`
    # (used by sglang and transformers). `make test` runs with PYTHONSAFEPATH=1 so the checkout is not on sys.path.
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("kernels")
    repo = Path(__file__).resolve().parents[4]
    assert spec is not None and spec.origin is not None
    assert not Path(spec.origin).is_relative_to(repo), spec.origin
    ours = importlib.util.find_spec("sglang_prorsa.kernels")
    assert Path(ours.origin).parent == repo / "kernels"


def test_wrap_method_wraps_once_and_keeps_the_original_running():
    calls = []

    class Target:
        def step(self, x):
            calls.append(("orig", x))
            return x + 1

    def make(original):
        def step(self, x):
            calls.append(("ours", x))
            return original(self, x)

        return step

    assert overrides.wrap_method(Target, "step", make)
    assert overrides.wrap_method(Target, "step", make)  # a second apply is a no-op, not a double wrap
    assert Target().step(1) == 2
    assert calls == [("ours", 1), ("orig", 1)]
    assert Target.step.__name__ == "step" and Target.step._prorsa_wrapped
