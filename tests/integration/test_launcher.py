"""The launcher's command line: SGLang's flags and ours in --help; bad input fails fast and leaves nothing running."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def _launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "sglang_prorsa.launch_server", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    # Nothing of the launcher's process group may outlive it.
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_help_lists_sglang_and_prorsa_flags():
    r = _launch("--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--model-path", "--tp-size", "--disaggregation-mode", "--enable-pd-role-switch",
                 "--chunked-prefill-size", "--pd-adaptive", "--prorsa-horizon", "--prorsa-instances"):
        assert flag in r.stdout, flag
    assert "sglang-prorsa:" in r.stdout  # our own argument group


def test_unknown_flag_is_rejected_with_its_name():
    r = _launch("--no-such-flag", "3")
    assert r.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in r.stderr


def test_missing_model_path_is_rejected_before_anything_starts(tmp_path):
    missing = tmp_path / "no-model-here"
    r = _launch("--model-path", str(missing))
    assert r.returncode == 2
    assert "--model-path" in r.stderr and "does not exist" in r.stderr


def test_bad_value_for_an_sglang_flag():
    r = _launch("--tp-size", "two")
    assert r.returncode == 2
    assert "--tp-size" in r.stderr and "invalid int value" in r.stderr
