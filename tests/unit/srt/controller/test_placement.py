"""A front gives each instance it starts its own GPUs (SGLang's --base-gpu-id / --gpu-id-step, indices into the
visible devices), sized tp × pp × dp from the user's flags, and refuses too few GPUs before it starts anything,
naming the flag; without CUDA nothing is placed."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from sglang_prorsa.config import ConfigError, split_prorsa_flags
from sglang_prorsa.srt.common.gpus import instance_gpus
from sglang_prorsa.srt.controller import placement
from sglang_prorsa.srt.controller.placement import PlacementSpec, plan, plan_front


@pytest.mark.parametrize("size,bases", [(1, [0, 1, 2, 3, 4, 5, 6, 7]), (2, [0, 2, 4, 6]), (4, [0, 4])])
def test_eight_visible_gpus_hold_instances_of_one_two_and_four(size, bases):
    specs = plan(8, 8 // size, size)
    assert [s.base_gpu_id for s in specs] == bases
    assert [s.devices for s in specs] == [tuple(range(b, b + size)) for b in bases]
    assert specs[0].flags() == ["--base-gpu-id", "0", "--gpu-id-step", "1"]


def test_a_cuda_visible_devices_subset_is_indexed_from_zero_and_named_as_given():
    specs = plan([2, 3, 5, 7], 2, 2)
    assert [s.base_gpu_id for s in specs] == [0, 2]  # SGLang's base_gpu_id indexes the visible devices
    assert [s.devices for s in specs] == [(2, 3), (5, 7)]


def test_a_users_base_gpu_id_is_where_the_placement_starts():
    assert [s.base_gpu_id for s in plan(8, 2, 2, first=4)] == [4, 6]
    with pytest.raises(ConfigError) as e:
        plan(8, 3, 2, first=4)
    assert e.value.flag == "--prorsa-instances" and "from --base-gpu-id 4" in str(e.value)


def test_too_few_gpus_are_refused_naming_the_flag():
    with pytest.raises(ConfigError) as e:
        plan(4, 3, 2)
    assert e.value.flag == "--prorsa-instances" and "--prorsa-instances" in str(e.value) and "at most 2" in str(e.value)
    with pytest.raises(ConfigError) as e:
        plan(2, 2, 4, size_flag="--tp-size")  # not even one fits: the size is what to change
    assert e.value.flag == "--tp-size" and str(e.value).startswith("argument --tp-size:")


def test_the_refusal_names_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(ConfigError, match=r"2 visible GPUs \(CUDA_VISIBLE_DEVICES=2,3\)"):
        plan([2, 3], 3, 1)


def _fake_torch(monkeypatch, available: bool, count: int) -> None:
    cuda = SimpleNamespace(is_available=lambda: available, device_count=lambda: count)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))


def test_visible_gpus_honour_cuda_visible_devices(monkeypatch):
    _fake_torch(monkeypatch, True, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7")
    assert placement.visible_gpus() == [2, 3, 5, 7]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb,GPU-cccc,GPU-dddd")
    assert placement.visible_gpus() == [0, 1, 2, 3]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert placement.visible_gpus() == [0, 1, 2, 3]
    _fake_torch(monkeypatch, False, 0)
    assert placement.visible_gpus() is None


def args(**kw):
    base = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "enable_dp_attention": False, "base_gpu_id": 0,
            "gpu_id_step": 1, "nnodes": 1}
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw,gpus", [({}, 1), ({"tp_size": 2}, 2), ({"tp_size": 2, "pp_size": 2}, 4),
                                     ({"tp_size": 2, "dp_size": 2}, 4),  # replicas: GPUs of their own
                                     ({"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}, 2)])  # inside tp
def test_an_instances_size_is_tp_pp_dp(kw, gpus):
    assert instance_gpus(args(**kw)) == gpus


def test_the_front_plans_from_the_users_flags():
    from sglang.srt.server_args import prepare_server_args

    from sglang_prorsa.testing.tiny_model import ensure_default_model

    config, rest = split_prorsa_flags(["--pd-adaptive", "--prorsa-instances", "4",
                                       "--model-path", str(ensure_default_model()), "--tp-size", "2"])
    parsed = prepare_server_args(rest)
    assert [s.base_gpu_id for s in plan_front(config, parsed, 8) or []] == [0, 2, 4, 6]
    assert plan_front(config, parsed, None) is None  # no CUDA: nothing placed
    with pytest.raises(ConfigError) as e:
        plan_front(config, parsed, 6)
    assert e.value.flag == "--prorsa-instances"
    static, _ = split_prorsa_flags(["--pd-static", "2:2"])
    with pytest.raises(ConfigError) as e:
        plan_front(static, args(tp_size=4), 8)
    assert e.value.flag == "--pd-static"
    with pytest.raises(ConfigError) as e:
        plan_front(config, args(tp_size=16), 8)
    assert e.value.flag == "--tp-size"
    with pytest.raises(ConfigError) as e:
        plan_front(config, args(gpu_id_step=2), 8)
    assert e.value.flag == "--gpu-id-step"


def test_each_instance_spec_carries_its_devices(tmp_path):
    from sglang.srt.server_args import prepare_server_args

    from sglang_prorsa.srt.controller.launcher import instance_specs
    from sglang_prorsa.testing.tiny_model import ensure_default_model

    config, rest = split_prorsa_flags(["--pd-adaptive", "--prorsa-instances", "2", "--base-gpu-id", "3",
                                       "--model-path", str(ensure_default_model())])
    placements = [PlacementSpec(base_gpu_id=3, gpus=1, devices=(3,)), PlacementSpec(base_gpu_id=4, gpus=1,
                                                                                   devices=(4,))]
    specs = instance_specs(config, rest, tmp_path, "http://127.0.0.1:1", placements)
    # The front's flags come last: SGLang's parser keeps the last occurrence, so they win over the user's.
    assert [prepare_server_args(list(s.sglang_argv)).base_gpu_id for s in specs] == [3, 4]
    assert all(s.sglang_argv[-4:-2] == ("--base-gpu-id", str(p.base_gpu_id)) for s, p in zip(specs, placements))
    cpu = instance_specs(config, rest, tmp_path, "http://127.0.0.1:1", None)
    assert all(s.sglang_argv == tuple(rest) for s in cpu)  # no CUDA: no GPU flags


def test_shared_gpus_place_nothing_even_on_a_node_with_too_few(monkeypatch):
    """``--prorsa-share-gpus``: several small instances on one GPU (each sized by --mem-fraction-static): no device
    flags, no refusal."""
    from sglang_prorsa.config import split_prorsa_flags
    from sglang_prorsa.srt.controller import launcher

    monkeypatch.setattr(placement, "visible_gpus", lambda: [0])
    shared, _ = split_prorsa_flags(["--pd-adaptive", "--prorsa-instances", "3", "--prorsa-share-gpus"])
    assert launcher.place_instances(shared, []) is None
    own, _ = split_prorsa_flags(["--pd-adaptive", "--prorsa-instances", "3"])
    with pytest.raises(SystemExit):
        launcher.place_instances(own, ["--model-path", "/nonexistent-but-unread"])
