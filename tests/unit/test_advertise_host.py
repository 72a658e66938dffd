"""The address an instance advertises -- its URL, its PD bootstrap (``bootstrap_host``) and its Mooncake endpoints --
follows --host / --prorsa-advertise-url (one value, ``InstanceSpec.advertise_host``), never loopback by accident; the
environment variables SGLang and Mooncake read are derived from it."""

from __future__ import annotations

import pytest

from sglang_prorsa import launch_server as entry
from sglang_prorsa.config import ConfigError, InstanceSpec, advertise_host, split_prorsa_flags, url_host
from sglang_prorsa.srt.instance.install import registration

CONTROLLER = ("--prorsa-controller", "http://10.0.0.1:30000")


@pytest.mark.parametrize("argv,host", [
    (["--host", "127.0.0.1", *CONTROLLER], "127.0.0.1"),
    (["--host", "10.0.0.5", *CONTROLLER], "10.0.0.5"),
    (["--host", "0.0.0.0", "--prorsa-advertise-url", "http://10.0.0.7:30000", *CONTROLLER], "10.0.0.7"),
    ([], "127.0.0.1"),  # a single server without --host: loopback, as SGLang's default
    (["--host", "0.0.0.0"], "127.0.0.1"),  # a plain single server: nobody looks its address up
    (["--pd-adaptive", "--host", "0.0.0.0"], "127.0.0.1"),  # a front: its instances' --prorsa-instance-host
    (["--pd-adaptive", "--prorsa-instance-host", "10.0.0.9"], "10.0.0.9"),
])
def test_the_advertised_host_follows_the_flags(argv, host):
    assert entry.advertised_host(argv) == host


@pytest.mark.parametrize("argv", [["--host", "0.0.0.0", *CONTROLLER],
                                  ["--host", "0.0.0.0", "--disaggregation-mode", "prefill"]])
def test_a_wildcard_host_that_others_must_reach_needs_an_advertise_url(argv):
    with pytest.raises(ConfigError) as e:
        entry.advertised_host(argv)
    assert e.value.flag == "--prorsa-advertise-url" and "0.0.0.0" in str(e.value)


def test_sglang_and_mooncake_read_the_derived_address():
    env = entry.address_environment("10.0.0.5", {"SGLANG_HOST_IP": "127.0.0.1"})
    assert env == {"SGLANG_HOST_IP": "10.0.0.5", "MC_TCP_BIND_ADDRESS": "10.0.0.5"}


def spec(host: str, advertise_url: str = "") -> InstanceSpec:
    config, _ = split_prorsa_flags([*CONTROLLER, *(("--prorsa-advertise-url", advertise_url) if advertise_url else ())])
    return InstanceSpec(instance_id="i", host=host, port=30000, role="prefill", bootstrap_port=9001, sglang_argv=(),
                        prorsa=config, controller_url=config.prorsa_controller, advertise_url=advertise_url)


@pytest.mark.parametrize("host,url,expected", [("127.0.0.1", "", "127.0.0.1"), ("10.0.0.5", "", "10.0.0.5"),
                                               ("0.0.0.0", "http://10.0.0.7:30000", "10.0.0.7")])
def test_the_registration_carries_the_advertised_host_as_bootstrap_host(host, url, expected):
    s = spec(host, url)
    assert s.advertise_host == expected
    body = registration(s, "prefill", gpus=2)
    assert body["gpus"] == 2
    assert body["bootstrap_host"] == expected and body["url"] == (url or f"http://{expected}:30000")


def test_a_front_starts_each_instance_with_its_own_address():
    from sglang_prorsa.srt.controller.launcher import instance_environment

    assert instance_environment(spec("10.0.0.5")) == {"SGLANG_HOST_IP": "10.0.0.5", "MC_TCP_BIND_ADDRESS": "10.0.0.5"}


def test_url_host():
    assert url_host("http://10.0.0.7:30000") == "10.0.0.7"
    assert url_host("https://node-3.example") == "node-3.example"
    assert url_host("http://[fd00::7]:30000") == "fd00::7"
    assert advertise_host("::") == "127.0.0.1"


@pytest.mark.parametrize("host,url,expected", [("127.0.0.1", "", "127.0.0.1"), ("10.0.0.5", "", "10.0.0.5"),
                                               ("0.0.0.0", "http://10.0.0.7:30000", "10.0.0.7")])
def test_the_mooncake_store_client_advertises_the_instances_address(host, url, expected):
    from sglang_prorsa.srt.instance.install import advertised, kv_store_config

    s = spec(host, url)
    s = InstanceSpec(**{**vars(s), "prorsa": split_prorsa_flags([*CONTROLLER, "--prorsa-kv-store", "mooncake",
                                                                 "--prorsa-mooncake-master", "10.0.0.1:50051"])[0]})
    store = kv_store_config(s)
    assert (store.kind, store.mooncake_master, store.local_hostname) == ("mooncake", "10.0.0.1:50051", expected)
    shown = advertised(s, store)
    assert (shown["host"], shown["kv_store_client"], shown["bootstrap"]) == (expected, expected, f"{expected}:9001")


def test_an_in_process_instance_hands_its_address_to_sglang_and_mooncake(monkeypatch):
    monkeypatch.setattr(entry, "check_kernels_importable", lambda: None)
    monkeypatch.setenv("SGLANG_HOST_IP", "127.0.0.1")
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")  # the CPU recipe's environment is set already
    monkeypatch.delenv("MC_TCP_BIND_ADDRESS", raising=False)
    entry.prepare_in_process(spec("0.0.0.0", "http://10.0.0.7:30000"))
    import os

    assert (os.environ["SGLANG_HOST_IP"], os.environ["MC_TCP_BIND_ADDRESS"]) == ("10.0.0.7", "10.0.0.7")


@pytest.mark.parametrize("host,bind,advertise", [("10.0.0.1", "10.0.0.1", "10.0.0.1"),
                                                 ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
                                                 ("0.0.0.0", "0.0.0.0", "127.0.0.1")])
def test_a_fronts_mooncake_master_listens_where_its_instances_reach_it(host, bind, advertise, monkeypatch):
    """The master a front starts binds the front's --host and is given out at its advertised address (what
    ``/prorsa/info`` reports as ``mooncake_master`` for instances on other hosts to pass)."""
    from sglang_prorsa.srt.controller import launcher
    from sglang_prorsa.srt.disaggregation import mooncake_master

    seen = {}

    def start(**kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")  # what the front asked for is all this test needs

    monkeypatch.setattr(mooncake_master, "start_mooncake_master", start)
    config, _ = split_prorsa_flags(["--pd-adaptive", "--prorsa-instances", "0", "--prorsa-kv-store", "mooncake"])
    with pytest.raises(RuntimeError, match="stop here"):
        launcher.run_front(config, [], host, 30000)
    assert (seen["bind"], seen["advertise"]) == (bind, advertise)
    argv = mooncake_master.master_argv(mooncake_master.Path("/bin/mooncake_master"), 50051, 9003, bind=bind)
    assert f"--rpc_address={bind}" in argv and "--metrics_host=127.0.0.1" in argv


def test_servers_on_another_host_start_with_no_address_variables(monkeypatch):
    from sglang_prorsa.srt.utils import processes

    monkeypatch.setenv("SGLANG_HOST_IP", "127.0.0.1")
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    env = processes.user_env({"PYTHONPATH": "x"})
    assert "SGLANG_HOST_IP" not in env and "MC_TCP_BIND_ADDRESS" not in env and env["PYTHONPATH"] == "x"
    assert processes.loopback_env()["SGLANG_HOST_IP"] == "127.0.0.1"
