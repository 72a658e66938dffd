"""Picks the backend for a pool's device: CUDA extension, else Triton, on GPUs; the C++ extension, else torch, on CPUs.

``SGLANG_PRORSA_KV_BACKEND`` (or the codec's ``backend=`` argument) forces one of ``cuda``, ``triton``, ``cpp``,
``torch``; a forced backend that cannot run is an error rather than a silent fallback.
"""

from __future__ import annotations

import logging
import os
from functools import cache

import torch

from .backend import KVBackend
from .ext_build import ExtensionUnavailable

logger = logging.getLogger(__name__)

BACKEND_ENV = "SGLANG_PRORSA_KV_BACKEND"
BACKENDS = ("cuda", "triton", "cpp", "torch")


def _triton_runs_on(device: torch.device) -> bool:
    # The interpreter (TRITON_INTERPRET=1) runs Triton kernels on host tensors; compiled Triton needs a GPU.
    return device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


@cache
def _build(name: str) -> KVBackend:
    """Instantiates a backend once per process; raises ExtensionUnavailable/ImportError if it cannot exist here."""
    if name == "cuda":
        from .cuda_kv import CudaBackend

        return CudaBackend()
    if name == "triton":
        from .triton_kv import TritonBackend

        return TritonBackend()
    if name == "cpp":
        from .cpu_kv import CppBackend

        return CppBackend()
    if name == "torch":
        from .torch_kv import TorchBackend

        return TorchBackend()
    raise ValueError(f"unknown KV backend {name!r}; choose one of {BACKENDS}")


def _forced(name: str, device: torch.device) -> KVBackend:
    runs_on = {"cuda": device.type == "cuda", "cpp": device.type == "cpu", "triton": _triton_runs_on(device)}
    if not runs_on.get(name, True):
        raise ValueError(f"KV backend {name!r} cannot run on device {device}")
    try:
        return _build(name)
    except (ExtensionUnavailable, ImportError) as exc:
        raise RuntimeError(f"KV backend {name!r} was requested but is unavailable: {exc}") from exc


def _first_available(names: tuple[str, ...]) -> KVBackend:
    for name in names:
        try:
            return _build(name)
        except (ExtensionUnavailable, ImportError) as exc:
            logger.info("KV backend %s unavailable (%s); trying the next", name, exc)
    raise AssertionError("the torch backend is always available")  # names always end with "torch"


def select_backend(device: torch.device, name: str | None = None) -> KVBackend:
    """The backend for pools on ``device``: ``name``, else ``$SGLANG_PRORSA_KV_BACKEND``, else the fastest present."""
    name = name or os.environ.get(BACKEND_ENV) or None
    if name is not None:
        return _forced(name, device)
    if device.type == "cuda":
        return _first_available(("cuda", "triton", "torch"))
    if device.type == "cpu":
        return _first_available(("cpp", "torch"))
    return _build("torch")  # other accelerators: the generic path still works
