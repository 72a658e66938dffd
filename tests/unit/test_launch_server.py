"""``launch_server(server_args, ...)``, the entry point with SGLang's signature: a caller's ``ServerArgs`` becomes the
instance spec ``python -m sglang_prorsa.launch_server`` builds from the same flags, the keywords become one frozen
``ProrsaConfig``, a bad keyword is refused naming it before anything starts, and the caller's record is not changed."""

from __future__ import annotations

import pytest

from sglang_prorsa import launch_server as entry
from sglang_prorsa.config import ConfigError, InstanceSpec, ProrsaConfig, split_prorsa_flags
from sglang_prorsa.srt.instance import install
from sglang_prorsa.srt.instance import server as instance_server
from sglang_prorsa.testing.tiny_model import ensure_default_model


def sglang_flags(*extra: str) -> list[str]:
    return ["--model-path", str(ensure_default_model()), "--device", "cpu", "--host", "127.0.0.1",
            "--port", "31000", *extra]


DECODE = ("--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", "9001")


@pytest.fixture
def served(monkeypatch):
    """What ``launch_server`` hands to ``run_instance`` (nothing is started)."""
    calls: list[tuple[InstanceSpec, object]] = []
    monkeypatch.setattr(instance_server, "run_instance", lambda spec, server_args=None: calls.append((spec,
                                                                                                       server_args)))
    monkeypatch.setattr(entry, "check_kernels_importable", lambda: None)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")  # the CPU environment is the caller's, already set
    return calls


def test_a_server_args_decode_instance_is_the_cli_spec_made_switchable(served):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(sglang_flags(*DECODE))
    entry.launch_server(args, kv_store="mooncake", mooncake_master="127.0.0.1:50051")
    ((spec, handed),) = served
    assert handed is args
    config = ProrsaConfig(prorsa_kv_store="mooncake", prorsa_mooncake_master="127.0.0.1:50051")
    assert spec == InstanceSpec(instance_id="127.0.0.1:31000", host="127.0.0.1", port=31000, role="decode",
                                bootstrap_port=9001, sglang_argv=(), prorsa=config, controller_url="",
                                advertise_url="", switchable=True, cpu_threads=0)
    # The CLI's spec for the same flags differs only where documented: its argv, and a single server's PD role is
    # not switchable (the CLI's instances switch under --prorsa-controller).
    cli_config, argv = split_prorsa_flags(["--prorsa-kv-store", "mooncake", "--prorsa-mooncake-master",
                                           "127.0.0.1:50051", *sglang_flags(*DECODE)])
    cli = entry.instance_spec(cli_config, argv)
    assert cli == InstanceSpec(**{**spec.__dict__, "sglang_argv": tuple(argv), "switchable": False})


def test_keywords_are_our_flags_and_a_controller_url_makes_it_the_cli_instance(served):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(sglang_flags(*DECODE))
    entry.launch_server(args, controller_url="http://127.0.0.1:30000/", instance_id="e-0",
                        advertise_url="http://10.0.0.5:31000", kv_store_path="/tmp/kv", cpu_threads=2)
    ((spec, _),) = served
    cli_config, argv = split_prorsa_flags(["--prorsa-controller", "http://127.0.0.1:30000/", "--prorsa-instance-id",
                                           "e-0", "--prorsa-advertise-url", "http://10.0.0.5:31000",
                                           "--prorsa-kv-store-path", "/tmp/kv", "--prorsa-cpu-threads", "2",
                                           *sglang_flags(*DECODE)])
    assert spec.prorsa == cli_config
    assert spec == InstanceSpec(**{**entry.instance_spec(cli_config, argv).__dict__, "sglang_argv": ()})
    assert (spec.instance_id, spec.url, spec.controller_url, spec.switchable, spec.cpu_threads) == (
        "e-0", "http://10.0.0.5:31000", "http://127.0.0.1:30000/", True, 2)


def test_a_colocated_instance_never_switches_and_switchable_false_is_kept(served):
    from sglang.srt.server_args import prepare_server_args

    entry.launch_server(prepare_server_args(sglang_flags()))
    entry.launch_server(prepare_server_args(sglang_flags(*DECODE)), switchable=False)
    (colocated, _), (decode, _) = served
    assert (colocated.role, colocated.bootstrap_port, colocated.switchable) == ("null", None, False)
    assert (decode.role, decode.bootstrap_port, decode.switchable) == ("decode", 9001, False)


@pytest.mark.parametrize("kwargs,keyword,message", [
    ({"kv_store": "disk"}, "kv_store", "must be 'file' or 'mooncake', got 'disk'"),
    ({"kv_store": "mooncake"}, "mooncake_master", "is required with kv_store='mooncake'"),
    ({"controller_url": "127.0.0.1:30000"}, "controller_url", "expected http://HOST:PORT, got '127.0.0.1:30000'"),
    ({"advertise_url": "http://h:1/path"}, "advertise_url", "expected http://HOST:PORT"),
    ({"cpu_threads": -1}, "cpu_threads", "must be >= 0"),
])
def test_a_bad_keyword_is_refused_naming_it_before_anything_starts(served, kwargs, keyword, message):
    with pytest.raises(ConfigError) as err:
        entry.launch_server(object(), **kwargs)
    assert err.value.flag == keyword
    assert str(err.value).startswith(f"argument {keyword}: {message}")
    assert served == []


def test_the_callers_server_args_are_copied_then_given_the_specs_fields():
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(sglang_flags(*DECODE))
    spec = entry.spec_of(ProrsaConfig(), args, (), switchable=True)
    served = install.server_args_for(spec.with_role("prefill"), args)
    assert served is not args
    assert (served.disaggregation_mode, served.disaggregation_bootstrap_port, served.enable_pd_role_switch,
            served.disaggregation_decode_enable_radix_cache, served.disaggregation_transfer_backend) == (
        "prefill", 9001, True, True, "mooncake")
    assert (args.disaggregation_mode, args.enable_pd_role_switch, args.disaggregation_decode_enable_radix_cache) == (
        "decode", False, False)
