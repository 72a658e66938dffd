"""The SGLang pin has one source, requirements/base.txt (issue item 5: it was also written in setup.py and
overrides.py): the overrides, /prorsa/info and setup.py's install_requires all read it through srt/common/pins.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sglang_prorsa.srt.common import pins

REPO = Path(__file__).resolve().parents[4]


def _base_txt_pin(name: str) -> str:
    (version,) = re.findall(rf"(?m)^{re.escape(name)}==(\S+)", (REPO / "requirements" / "base.txt").read_text())
    return version


def test_the_pin_is_read_from_requirements_base_txt():
    from sglang_prorsa.srt.instance import overrides

    assert pins.from_checkout() and pins.REQUIREMENTS == REPO / "requirements" / "base.txt"
    assert pins.SGLANG_VERSION == overrides.SGLANG_VERSION == _base_txt_pin("sglang")
    assert pins.pinned("sglang-router") == _base_txt_pin("sglang-router")
    assert pins.pinned("Torch") == _base_txt_pin("torch")  # names compare as PEP 503 normalises them


def test_an_installed_wheel_reads_the_same_pin_from_its_metadata(monkeypatch):
    monkeypatch.setattr(pins, "from_checkout", lambda: False)  # a wheel ships no requirements/
    assert pins.pinned("sglang") == _base_txt_pin("sglang")


def test_parsing_keeps_exact_pins_and_skips_the_rest():
    lines = ["# comment", "", "sglang==0.5.23", "transformers", "torch>=2", "-e .", "Sglang_Router==0.3.2  # why",
             'mooncake-transfer-engine==0.3.13.post1; extra == "gpu"']
    assert pins.parse_pins(lines) == {"sglang": "0.5.23", "sglang-router": "0.3.2",
                                      "mooncake-transfer-engine": "0.3.13.post1"}


def test_no_other_file_writes_the_sglang_version_down():
    version = re.escape(_base_txt_pin("sglang"))
    written = re.compile(rf"""(SGLANG_VERSION\s*=\s*["']|sglang==\d|["']{version}["'])""")
    files = [REPO / "setup.py", *(REPO / "sglang_prorsa").rglob("*.py"), *(REPO / "kernels").rglob("*.py")]
    assert [str(p.relative_to(REPO)) for p in files if written.search(p.read_text())] == []


def test_setup_py_takes_install_requires_from_the_same_file(tmp_path):
    out = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (requires,) = tmp_path.glob("*.egg-info/requires.txt")
    lines = requires.read_text().splitlines()
    for name in ("sglang", "torch"):
        assert f"{name}=={_base_txt_pin(name)}" in lines
    assert f"mooncake-transfer-engine-non-cuda=={_base_txt_pin('mooncake-transfer-engine-non-cuda')}" in lines
