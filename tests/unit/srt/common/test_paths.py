"""The cache root has one definition (srt/common/paths.py) and every user of it follows ``SGLANG_PRORSA_CACHE``: the
embedded tiny model, the libcuda stub, the torch-extension builds, the file KV store, and the Makefile's venv."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_prorsa.srt.common import paths

REPO = Path(__file__).resolve().parents[4]


def test_the_root_follows_the_variable_at_each_call(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.CACHE_ENV, raising=False)
    assert paths.cache_root() == Path.home() / ".cache" / "sglang-prorsa"
    monkeypatch.setenv(paths.CACHE_ENV, "")  # empty: as if unset
    assert paths.cache_root() == Path.home() / ".cache" / "sglang-prorsa"
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path))
    assert paths.cache_root() == tmp_path


def test_every_user_of_the_cache_follows_the_variable(monkeypatch, tmp_path):
    from sglang_prorsa.kernels import ext_build

    from sglang_prorsa.srt import cpu_recipe
    from sglang_prorsa.srt.disaggregation.kv_persist import KVStoreConfig, default_file_store
    from sglang_prorsa.testing.tiny_model import TinyModelSpec, ensure_default_model

    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(ext_build.CACHE_ENV, raising=False)
    assert default_file_store() == str(tmp_path / "kv-store")
    assert KVStoreConfig().open().root == tmp_path / "kv-store"  # the scheduler's store without --prorsa-kv-store-path
    assert ext_build.cache_dir() == tmp_path / "torch_extensions"
    monkeypatch.setenv(ext_build.CACHE_ENV, str(tmp_path / "ext"))  # its own override still wins
    assert ext_build.cache_dir() == tmp_path / "ext"
    spec = TinyModelSpec()
    model = tmp_path / "models" / f"tiny-llama-{spec.key()}"
    model.mkdir(parents=True)
    (model / "prorsa_tiny_model.json").write_text(json.dumps({}))  # already generated: found, not rebuilt
    assert ensure_default_model(spec) == model
    if shutil.which("gcc") or shutil.which("cc"):
        assert cpu_recipe.build_libcuda_stub().parent == tmp_path / "libcuda-stub"


def test_no_other_module_spells_the_cache_root():
    # A path written in code: ".cache" as a path part, "~/.cache/...", or "sglang-prorsa" joined onto one.
    spelled = re.compile(r"""["']\.cache["']|["']~/\.cache|/\s*["']sglang-prorsa["']|\.cache/sglang-prorsa["'/]""")
    offenders = [str(p.relative_to(REPO)) for folder in ("sglang_prorsa", "kernels") for p in (REPO / folder).rglob("*.py")
                 if p != Path(paths.__file__).resolve() and spelled.search(p.read_text())]
    assert offenders == []


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("python3") is None, reason="needs make and python3")
def test_the_makefile_takes_its_cache_from_paths_and_exports_it(tmp_path):
    probe = tmp_path / "probe.mk"
    probe.write_text("probe:\n\t@echo \"$(CACHE) $(VENV) $$SGLANG_PRORSA_CACHE\"\n")

    def make(*args: str, env: dict | None = None) -> list[str]:
        import os

        base = {k: v for k, v in os.environ.items() if k not in (paths.CACHE_ENV, "CACHE")}
        out = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", str(probe), "probe", *args],
                             cwd=REPO, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    cache, venv, exported = make(env={"HOME": str(tmp_path / "home")})
    assert cache == exported == str(tmp_path / "home" / ".cache" / "sglang-prorsa") and venv.startswith(cache + "/venv-")
    cache, venv, exported = make(env={paths.CACHE_ENV: str(tmp_path / "c")})
    assert cache == exported == str(tmp_path / "c") and venv.startswith(cache + "/venv-")
    cache, _, exported = make(f"CACHE={tmp_path / 'd'}")  # make's variable wins and reaches what make runs
    assert cache == exported == str(tmp_path / "d")
