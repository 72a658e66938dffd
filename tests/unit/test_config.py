"""Our flags, parsed once into a frozen configuration (sglang_prorsa/config.py)."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_prorsa.config import ConfigError, InstanceSpec, Mode, split_prorsa_flags


def test_flags_are_split_from_sglangs_and_frozen():
    config, rest = split_prorsa_flags(["--pd-adaptive", "--prorsa-horizon", "5", "--port", "1", "--tp", "2"])
    assert rest == ["--port", "1", "--tp", "2"]
    assert config.mode is Mode.ADAPTIVE and config.prorsa_horizon_s == 5.0 and config.control_interval_s == 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.prorsa_horizon_s = 1.0


@pytest.mark.parametrize("argv,mode,count,prefill", [
    (["--pd-static", "2:3"], Mode.STATIC, 5, 2), (["--pd-colocated", "4"], Mode.COLOCATED, 4, 0),
    (["--prorsa-controller", "http://h:1"], Mode.INSTANCE, 3, 1), ([], Mode.SINGLE, 3, 1),
])
def test_modes(argv, mode, count, prefill):
    config, _ = split_prorsa_flags(argv)
    assert config.mode is mode and config.instance_count == count
    if mode is not Mode.COLOCATED:
        assert config.initial_prefill == prefill
    assert config.switching is False


@pytest.mark.parametrize("argv,flag", [
    (["--pd-static", "2"], "--pd-static"), (["--pd-static", "0:1"], "--pd-static"),
    (["--pd-adaptive", "--pd-colocated", "2"], "--pd-colocated"), (["--pd-adaptive", "--prorsa-instances", "1"],
                                                                  "--prorsa-instances"),
    (["--pd-adaptive", "--prorsa-initial-prefill", "3"], "--prorsa-initial-prefill"),
    (["--prorsa-horizon", "0"], "--prorsa-horizon"), (["--prorsa-router", "ftp://x"], "--prorsa-router"),
    (["--pd-adaptive", "--prorsa-controller", "http://h:1"], "--prorsa-controller"),
    (["--prorsa-controller", "http://h:1", "--prorsa-kv-store", "mooncake"], "--prorsa-mooncake-master"),
    (["--prorsa-dwell-switch-costs", "-1"], "--prorsa-dwell-switch-costs"),
    (["--prorsa-dwell-switch-costs", "inf"], "--prorsa-dwell-switch-costs"),
    (["--pd-colocated", "3", "--prorsa-cpu-threads", "-1"], "--prorsa-cpu-threads"),
])
def test_bad_combinations_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as e:
        split_prorsa_flags(argv)
    assert e.value.flag == flag and flag in str(e.value)


def test_the_dwell_guard_is_configured_whole():
    """Dwell = max(--prorsa-min-dwell, --prorsa-dwell-switch-costs x last switch time): both 0 turn it off."""
    from sglang_prorsa.policy.role_switch.planner import PlannerConfig

    config, _ = split_prorsa_flags(["--pd-adaptive"])
    assert (config.prorsa_min_dwell_s, config.prorsa_dwell_switch_costs) == (30.0, 6.0)
    config, _ = split_prorsa_flags(["--pd-adaptive", "--prorsa-min-dwell", "0", "--prorsa-dwell-switch-costs", "0"])
    planner = PlannerConfig(min_dwell_s=config.prorsa_min_dwell_s, dwell_switch_costs=config.prorsa_dwell_switch_costs)
    assert planner.dwell_s(switch_s=25.0) == 0.0
    assert PlannerConfig(min_dwell_s=0.0).dwell_s(switch_s=25.0) == 150.0  # min-dwell 0 alone leaves 6 x 25 s


def test_an_instance_spec_round_trips_through_its_file(tmp_path):
    config, _ = split_prorsa_flags(["--pd-adaptive"])
    spec = InstanceSpec("0", "127.0.0.1", 1234, "prefill", 5678, ("--tp", "1"), config, switchable=True,
                        cpu_threads=2)
    assert InstanceSpec.load(spec.dump(tmp_path / "s.json")) == spec
    assert spec.url == "http://127.0.0.1:1234"


@pytest.mark.parametrize("argv,expected", [
    (["--pd-colocated", "3"], lambda cores: max(1, cores // 3)),
    (["--pd-static", "1:1"], lambda cores: max(1, cores // 2)),
    (["--pd-adaptive", "--prorsa-instances", "4", "--prorsa-cpu-threads", "3"], lambda cores: 3),
])
def test_a_front_shares_the_hosts_cores_among_its_instances(argv, expected, tmp_path):
    """Instances that each run an OpenMP team over all cores slow each other many times over (cpu_recipe.py)."""
    import os

    from sglang_prorsa.srt.controller.launcher import instance_specs

    config, rest = split_prorsa_flags(argv)
    specs = instance_specs(config, rest, tmp_path, "http://127.0.0.1:1")
    assert len(specs) == config.instance_count
    assert {s.cpu_threads for s in specs} == {expected(len(os.sched_getaffinity(0)))}


def test_the_wait_rule_is_opt_in():
    config, rest = split_prorsa_flags(["--pd-adaptive", "--prorsa-wait-rule"])
    assert config.prorsa_wait_rule is True and rest == []
    assert split_prorsa_flags(["--pd-adaptive"])[0].prorsa_wait_rule is False
