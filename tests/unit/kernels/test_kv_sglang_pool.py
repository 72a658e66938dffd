"""Export/import straight from real SGLang MHATokenToKVPool / MLATokenToKVPool objects on CPU.

Runs in a child process: importing SGLang's memory pool pulls in sgl_kernel, which on a machine without a CUDA
driver needs the project's libcuda stub on LD_LIBRARY_PATH before it loads (see sglang_prorsa.srt.cpu_recipe).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("sglang_pool_child.py")


def test_real_sglang_pools_round_trip(tmp_path: Path) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("SGLANG_PRORSA_KV_BACKEND", None)
    try:
        from sglang_prorsa.srt.cpu_recipe import cpu_environment
    except ImportError as exc:
        pytest.skip(f"the CPU recipe (libcuda stub) is unavailable: {exc}")
    env.update(cpu_environment(env))
    proc = subprocess.run(
        [sys.executable, str(CHILD)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
