"""The Triton kernels, run on CPU through the Triton interpreter in a child pytest.

The interpreter is chosen when ``@triton.jit`` runs, i.e. when ``kernels/triton_kv.py`` is imported, so it needs
``TRITON_INTERPRET=1`` in the environment before that import: a child process keeps the parent's Triton untouched.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CASES = Path(__file__).with_name("triton_interpret_cases.py")


def test_triton_kernels_in_interpreter(tmp_path: Path) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("SGLANG_PRORSA_KV_BACKEND", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(CASES)],
        cwd=tmp_path,  # not the repo root, whose sglang_prorsa/ lacks the kernels subpackage
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    # Guard against a child that silently skipped everything (e.g. the interpreter flag not reaching it).
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 12, proc.stdout[-2000:]
