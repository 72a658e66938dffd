"""Makes ``sglang_prorsa.kernels`` importable from a plain checkout (the project installs ``kernels/`` under that
name; without the install, load it from the folder). Used by this folder's conftest and child-process scripts."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def ensure_kernels_importable() -> None:
    try:
        importlib.import_module("sglang_prorsa.kernels")
        return
    except ImportError:
        pass
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    importlib.import_module("sglang_prorsa")
    spec = importlib.util.spec_from_file_location(
        "sglang_prorsa.kernels", REPO / "kernels" / "__init__.py", submodule_search_locations=[str(REPO / "kernels")]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
