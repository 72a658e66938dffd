"""JIT-builds the C++/CUDA sources in ``csrc/`` as torch extensions, once per machine, into a cache outside the repo.

The ops register themselves with torch's dispatcher (``TORCH_LIBRARY``), so a build is loaded as a plain shared
library and used through ``torch.ops.<namespace>``. A failed build is reported once and remembered, and callers fall
back to another backend.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path
from typing import Any, Sequence

import torch

from sglang_prorsa.srt.common.paths import cache_root

logger = logging.getLogger(__name__)

# The package directory is ``kernels/`` at the repository root (installed editable as ``sglang_prorsa.kernels``).
REPO_ROOT = Path(__file__).resolve().parent.parent
CSRC = REPO_ROOT / "csrc"

CACHE_ENV = "SGLANG_PRORSA_EXT_DIR"


def cache_dir() -> Path:
    """Where builds go: ``$SGLANG_PRORSA_EXT_DIR``, or ``torch_extensions`` in the cache root (``paths.cache_root()``:
    ``$SGLANG_PRORSA_CACHE`` or ``~/.cache/sglang-prorsa``)."""
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else cache_root() / "torch_extensions"


class ExtensionUnavailable(RuntimeError):
    """The extension could not be built or loaded here; the message says why."""


@cache
def _build(namespace: str, sources: tuple[str, ...], cflags: tuple[str, ...], cuda_cflags: tuple[str, ...]) -> tuple[Any, str]:
    """Builds (or reuses) the extension; returns ``(torch.ops.<namespace>, "")`` or ``(None, why)``.

    Memoised either way, so a broken toolchain costs one attempt per process.
    """
    from torch.utils import cpp_extension  # imported lazily: it pulls in setuptools

    paths = [CSRC / s for s in sources]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        return None, f"sources not found: {missing}"
    build_dir = cache_dir() / namespace
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        cpp_extension.load(
            name=namespace,
            sources=[str(p) for p in paths],
            extra_cflags=list(cflags),
            extra_cuda_cflags=list(cuda_cflags),
            extra_ldflags=["-fopenmp"] if "-fopenmp" in cflags else [],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:  # compiler missing, compile error, ABI mismatch: all mean "use another backend"
        logger.warning("building %s failed; falling back to another backend: %s", namespace, exc)
        return None, f"building {namespace} failed: {exc}"
    return getattr(torch.ops, namespace), ""


def load_ops(namespace: str, sources: Sequence[str], cflags: Sequence[str] = (), cuda_cflags: Sequence[str] = ()) -> Any:
    """``torch.ops.<namespace>`` built from ``csrc/<sources>``; raises ExtensionUnavailable saying why not."""
    ops, why = _build(namespace, tuple(sources), tuple(cflags), tuple(cuda_cflags))
    if ops is None:
        raise ExtensionUnavailable(why)
    return ops
