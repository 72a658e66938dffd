"""The CPU recipe: which flags it adds, that explicit flags win, and that the libcuda stub loads."""

from __future__ import annotations

import ctypes

from sglang_prorsa.srt import cpu_recipe


def test_recipe_adds_every_flag_when_none_given():
    out = cpu_recipe.apply_cpu_flags(["--port", "1"])
    for flag, value in [("--device", "cpu"), ("--attention-backend", "torch_native"),
                        ("--sampling-backend", "pytorch"), ("--grammar-backend", "none"),
                        ("--cuda-graph-backend-decode", "disabled"), ("--max-total-tokens", "131072"),
                        ("--mem-fraction-static", "0.97")]:
        assert cpu_recipe.flag_value(out, flag) == value
    assert "--sleep-on-idle" in out and "--disable-overlap-schedule" in out
    # Every server: an instance a front starts as prefill may become decode (and the flag is inert elsewhere).
    assert cpu_recipe.flag_value(out, "--disaggregation-decode-retraction-backup") == "cpu_tensor"


def test_explicit_flags_win():
    argv = ["--attention-backend=triton", "--disable-cuda-graph", "--mem-fraction-static", "0.3"]
    out = cpu_recipe.apply_cpu_flags(argv)
    assert cpu_recipe.flag_value(out, "--attention-backend") == "triton"
    assert out.count("--attention-backend=triton") == 1 and "--attention-backend" not in out
    assert not cpu_recipe.given(out, "--cuda-graph-backend-decode")  # settled by --disable-cuda-graph
    assert not cpu_recipe.given(out, "--max-total-tokens")  # settled by --mem-fraction-static
    assert cpu_recipe.flag_value(out, "--mem-fraction-static") == "0.3" and out.count("--mem-fraction-static") == 1


def test_a_token_budget_given_still_gets_the_high_fraction():
    # The fraction only keeps SGLang's free-RAM check passing while other servers start beside this one.
    out = cpu_recipe.apply_cpu_flags(["--max-total-tokens", "65536"])
    assert cpu_recipe.flag_value(out, "--max-total-tokens") == "65536" and out.count("--max-total-tokens") == 1
    assert cpu_recipe.flag_value(out, "--mem-fraction-static") == "0.97"


def test_decode_servers_get_a_cpu_retraction_backup():
    out = cpu_recipe.apply_cpu_flags(["--disaggregation-mode", "decode"])
    assert cpu_recipe.flag_value(out, "--disaggregation-decode-retraction-backup") == "cpu_tensor"


def test_libcuda_stub_builds_and_reports_no_device(tmp_path):
    lib_dir = cpu_recipe.build_libcuda_stub(cache=tmp_path)
    lib = ctypes.CDLL(str(lib_dir / "libcuda.so.1"))
    assert lib.cuPointerGetAttribute() == 100  # CUDA_ERROR_NO_DEVICE
    count = ctypes.c_int(7)
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 100 and count.value == 0
    assert cpu_recipe.build_libcuda_stub(cache=tmp_path) == lib_dir  # cached by source hash


def test_tensor_and_data_parallel_ranks_get_their_cpu_settings_and_one_rank_gets_none():
    from sglang_prorsa.srt.cpu_recipe import parallel_environment, threads_bind

    assert parallel_environment(1, 1, {}, cores=2) == {}
    tp2 = parallel_environment(2, 1, {}, cores=2)
    assert tp2["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
    assert tp2["SGLANG_NCCL_SO_PATH"].endswith("no-nccl-on-cpu/libnccl.so.2")
    assert parallel_environment(1, 2, {}, cores=8) == {"SGLANG_CPU_OMP_THREADS_BIND": "0-3|4-7"}  # no NCCL for DP
    # What the user set wins.
    assert parallel_environment(2, 1, {"SGLANG_CPU_OMP_THREADS_BIND": "0|0", "SGLANG_NCCL_SO_PATH": "/x"}) == {}
    assert threads_bind(4, 2) == "0|1|0|1" and threads_bind(2, 5) == "0-1|2-3" and threads_bind(3, 3) == "0|1|2"
