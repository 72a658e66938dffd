"""The one registry of every change sglang-prorsa makes to SGLang's behaviour.

Each override names its target, says why it exists, and records the SGLang version it was written against. Nothing
else in the package patches SGLang: code that needs a changed behaviour adds an entry here. ``apply_overrides()``
runs in every process that executes SGLang code (the launcher imports it at module load, and SGLang's spawned
scheduler processes re-import the launcher's main module), and refuses to run on any other SGLang version.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"


class SGLangVersionMismatch(RuntimeError):
    pass


@dataclass(frozen=True)
class Override:
    """One change to SGLang: ``target`` is ``module:attribute.path``; ``apply`` performs it and may check a condition."""

    name: str
    target: str
    reason: str
    apply: Callable[[], bool]
    sglang_version: str = SGLANG_VERSION
    kind: str = "patched attribute"


@dataclass
class OverrideRegistry:
    overrides: dict[str, Override] = field(default_factory=dict)
    applied: dict[str, bool] = field(default_factory=dict)

    def register(self, override: Override) -> Override:
        if override.name in self.overrides:
            raise ValueError(f"override {override.name!r} registered twice")
        self.overrides[override.name] = override
        return override

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": o.name, "target": o.target, "kind": o.kind, "reason": o.reason,
             "sglang_version": o.sglang_version, "applied": self.applied.get(o.name, False)}
            for o in self.overrides.values()
        ]


REGISTRY = OverrideRegistry()


def installed_sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def check_sglang_version() -> None:
    found = installed_sglang_version()
    if found != SGLANG_VERSION:
        raise SGLangVersionMismatch(
            f"sglang-prorsa's overrides were written against sglang=={SGLANG_VERSION}, but sglang=={found} is "
            f"installed; re-check every entry in sglang_prorsa/srt/overrides.py before changing the pin"
        )


def resolve(target: str) -> tuple[Any, str]:
    """``'pkg.mod:Cls.attr'`` → (the object owning ``attr``, ``'attr'``)."""
    module, _, path = target.partition(":")
    owner: Any = importlib.import_module(module)
    *parents, attr = path.split(".")
    for p in parents:
        owner = getattr(owner, p)
    if not hasattr(owner, attr):
        raise AttributeError(f"override target {target} does not exist in this SGLang")
    return owner, attr


def set_attribute(target: str, value: Any) -> Callable[[], bool]:
    def _apply() -> bool:
        owner, attr = resolve(target)
        setattr(owner, attr, value)
        return True

    return _apply


def apply_overrides(*, only: set[str] | None = None) -> dict[str, bool]:
    """Apply every registered override once per process (idempotent)."""
    check_sglang_version()
    _register_builtin()
    for name, o in REGISTRY.overrides.items():
        if only is not None and name not in only:
            continue
        if not REGISTRY.applied.get(name):
            REGISTRY.applied[name] = bool(o.apply())
            logger.debug("override %s applied=%s", name, REGISTRY.applied[name])
    return dict(REGISTRY.applied)


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def _mooncake_host_tensor_indices() -> bool:
    # Only on machines without CUDA: on a GPU the fast path is right.
    if not _no_cuda():
        return False
    return set_attribute(
        "sglang.srt.disaggregation.mooncake.conn:MooncakeKVSender.supports_host_tensor_indices", False
    )()


_BUILTIN_DONE = False


def _register_builtin() -> None:
    global _BUILTIN_DONE
    if _BUILTIN_DONE:
        return
    _BUILTIN_DONE = True
    REGISTRY.register(Override(
        name="mooncake_sender_no_host_tensor_indices",
        target="sglang.srt.disaggregation.mooncake.conn:MooncakeKVSender.supports_host_tensor_indices",
        reason=(
            "With True the prefill side pins host memory and records torch.cuda.Event()s for the KV indices, "
            "which crashes on a machine without CUDA; False keeps the plain path, and KV still moves over TCP."
        ),
        apply=_mooncake_host_tensor_indices,
    ))
