"""The CUDA kernels compile with nvcc (device code for Hopper), even on a machine without a GPU.

The check runs nvcc the way torch's cpp_extension would (same defines and include paths) and caches a marker keyed
by the source, flags and nvcc version, so an unchanged kernel is not recompiled on every run (~30 s on 2 cores).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from sglang_prorsa.kernels.ext_build import CSRC, cache_dir

SOURCE = CSRC / "kv_pages_cuda.cu"
ARCH = "sm_90"  # H100/H200, where the GPU session will run it


def _nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    found = shutil.which("nvcc")
    if found is None and CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        found = str(Path(CUDA_HOME) / "bin" / "nvcc")
    return found


def test_cuda_source_compiles_with_nvcc(tmp_path: Path) -> None:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (no CUDA toolkit on PATH or CUDA_HOME): cannot compile-check csrc/kv_pages_cuda.cu")
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths

    obj = tmp_path / "kv_pages_cuda.o"
    flags = ["-c", "-std=c++20", "-O3", f"-arch={ARCH}", *COMMON_NVCC_FLAGS]
    flags += [f"-I{p}" for p in include_paths()]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\n".join([SOURCE.read_text(), *flags, version]).encode()).hexdigest()[:20]
    marker = cache_dir() / "nvcc_check" / f"{key}.ok"
    if marker.exists():
        return  # this exact source compiled with these exact flags before
    proc = subprocess.run([nvcc, *flags, "-o", str(obj), str(SOURCE)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    symbols = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True).stdout if shutil.which("nm") else ""
    if symbols:
        # Four kernel instantiations: export/import x with/without checksum.
        assert symbols.count("move_chunks<") >= 4, symbols[:2000]
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(proc.stderr)
