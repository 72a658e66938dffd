"""``sglang_prorsa.engine.Engine``, SGLang's in-process engine with the extension: our settings ride on the class
(verl and AReaL call the classmethod without them), a bad one is refused naming the keyword, and the launch composes
with the caller's two process hooks instead of replacing them (nothing is started here: SGLang's launch and the
install are stood in for)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
from sglang.srt.entrypoints.engine import Engine as SGLangEngine

from sglang_prorsa import engine as entry
from sglang_prorsa.config import ConfigError
from sglang_prorsa.srt.common import sglang_internals
from sglang_prorsa.srt.instance import install as install_module
from sglang_prorsa.srt.instance.install import Installed
from sglang_prorsa.srt.instance.scheduler_process import run_scheduler_process


def test_settings_ride_on_a_subclass_and_a_bad_one_is_refused_naming_the_keyword():
    Mooncake = entry.Engine.with_options(kv_store="mooncake", mooncake_master="10.0.0.1:50051", cpu_threads=2)
    assert issubclass(Mooncake, entry.Engine) and Mooncake.__name__ == "Engine"
    assert (Mooncake.options.kv_store, Mooncake.options.mooncake_master, Mooncake.options.cpu_threads) == (
        "mooncake", "10.0.0.1:50051", 2)
    assert entry.Engine.options == entry.EngineOptions()  # the base class is unchanged
    assert Mooncake.with_options(instance_id="e1").options.kv_store == "mooncake"  # settings accumulate
    with pytest.raises(ConfigError) as bad:
        entry.Engine.with_options(kv_store="disk")
    assert bad.value.flag == "kv_store"
    with pytest.raises(ConfigError) as missing:
        entry.Engine.with_options(kv_store="mooncake")
    assert missing.value.flag == "mooncake_master"
    with pytest.raises(TypeError):
        entry.Engine.with_options(kv_stor="file")


def inner_scheduler(*args, **kwargs):  # a framework's own scheduler entry (AReaL's, say): module-level, picklable
    return ("framework scheduler", args, kwargs)


def test_the_launch_installs_first_and_composes_with_the_callers_hooks(monkeypatch):
    calls: dict = {}
    side = SimpleNamespace(tm=None, role="decode")
    runtime = SimpleNamespace(cpu_threads=0)

    def install(spec, server_args, app):
        calls["install"] = (spec, server_args)
        return Installed(spec=spec, server_args="args-as-installed", side=side, runtime=runtime, keys=None)

    def sglang_launch(cls, **kwargs):
        calls["launch"] = kwargs
        return ("tm", "templates", "port_args", "init", "watchdog", [])

    monkeypatch.setattr(install_module, "install", install)
    monkeypatch.setattr(entry, "prepare_in_process", lambda spec: calls.setdefault("prepared", spec.advertise_host))
    monkeypatch.setattr(SGLangEngine, "_launch_subprocesses", classmethod(sglang_launch))
    monkeypatch.setattr(Installed, "register_forever", lambda self, wait_until_serving=False: calls.setdefault(
        "register", wait_until_serving))
    monkeypatch.setattr(sglang_internals, "check_instance", lambda obj, target: None)

    def framework_tm(server_args, port_args):
        return f"tm({server_args},{port_args})", "templates"

    server_args = SimpleNamespace(host="127.0.0.1", port=31000, disaggregation_mode="decode",
                                  disaggregation_bootstrap_port=9001)
    Configured = entry.Engine.with_options(controller_url="http://front:30000", instance_id="verl-0")
    got = Configured._launch_subprocesses(server_args=server_args, init_tokenizer_manager_func=framework_tm,
                                          run_scheduler_process_func=inner_scheduler,
                                          run_detokenizer_process_func="detok")
    assert got == ("tm", "templates", "port_args", "init", "watchdog", [])  # SGLang's answer, as it was
    spec, _ = calls["install"]
    assert (spec.instance_id, spec.role, spec.bootstrap_port, spec.controller_url, spec.switchable) == (
        "verl-0", "decode", 9001, "http://front:30000", True)
    launch = calls["launch"]
    assert launch["server_args"] == "args-as-installed" and launch["run_detokenizer_process_func"] == "detok"
    # the caller's tokenizer-manager factory runs, and the engine side learns the manager it made
    assert launch["init_tokenizer_manager_func"]("a", "p") == ("tm(a,p)", "templates") and side.tm == "tm(a,p)"
    scheduler = launch["run_scheduler_process_func"]
    assert isinstance(scheduler, functools.partial) and scheduler.func is run_scheduler_process
    assert scheduler.args == (runtime,) and scheduler.keywords == {"inner": inner_scheduler}
    assert calls["prepared"] == "127.0.0.1" and calls["register"] is True  # registers once its own /health answers


def test_the_scheduler_entry_applies_the_overrides_then_runs_the_callers_entry(monkeypatch):
    from sglang_prorsa.srt.instance import overrides
    from sglang_prorsa.srt.scheduler import extension

    order: list[str] = []
    monkeypatch.setattr(overrides, "apply_overrides", lambda: order.append("overrides"))
    monkeypatch.setattr(extension, "RUNTIME", None)
    runtime = SimpleNamespace(cpu_threads=0)

    def framework_entry(*args, **kwargs):
        order.append("framework")
        return args, kwargs

    assert run_scheduler_process(runtime, "server_args", 3, inner=framework_entry, pipe="w") == (
        ("server_args", 3), {"pipe": "w"})
    assert order == ["overrides", "framework"] and extension.RUNTIME is runtime


def test_constructing_it_splits_our_keywords_from_sglangs(monkeypatch):
    seen: dict = {}

    def sglang_init(self, **kwargs):
        seen.update(options=type(self).options, kwargs=kwargs)

    monkeypatch.setattr(SGLangEngine, "__init__", sglang_init)
    engine = entry.Engine(model_path="/m", tp_size=1, controller_url="http://front:30000", kv_store_path="/kv")
    assert seen["kwargs"] == {"model_path": "/m", "tp_size": 1}  # SGLang's own, untouched
    assert (seen["options"].controller_url, seen["options"].kv_store_path) == ("http://front:30000", "/kv")
    assert isinstance(engine, entry.Engine) and entry.Engine.options == entry.EngineOptions()
    entry.Engine(model_path="/m")
    assert seen["options"] == entry.EngineOptions()
