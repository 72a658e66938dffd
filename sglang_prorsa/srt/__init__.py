"""What runs beside SGLang: ``common`` (shared types), ``scheduler`` and ``engine`` (the two sides of an instance),
``instance`` (its entry and the overrides), ``front``, ``controller``, ``disaggregation`` (the KV store).

Modules that moved keep their old import path: importing one (say ``sglang_prorsa.srt.lifecycle.events``) returns the
module at its new place (``sglang_prorsa.policy.lifecycle.events``), with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "sglang_prorsa.srt.lifecycle.control_plane": "sglang_prorsa.policy.control_plane",
    "sglang_prorsa.srt.lifecycle": "sglang_prorsa.policy.lifecycle",
    "sglang_prorsa.srt.forecast": "sglang_prorsa.policy.forecast",
    "sglang_prorsa.srt.role_switch": "sglang_prorsa.policy.role_switch",
    "sglang_prorsa.srt.utils.clock": "sglang_prorsa.policy.clock",
    "sglang_prorsa.srt.controller.registry": "sglang_prorsa.srt.common.registry",
    "sglang_prorsa.srt.messages": "sglang_prorsa.srt.common.messages",
    "sglang_prorsa.srt.channel": "sglang_prorsa.srt.common.channel",
    "sglang_prorsa.srt.http_utils": "sglang_prorsa.srt.common.http_utils",
    "sglang_prorsa.srt.auth": "sglang_prorsa.srt.common.auth",
    "sglang_prorsa.srt.sglang_internals": "sglang_prorsa.srt.common.sglang_internals",
    "sglang_prorsa.srt.overrides": "sglang_prorsa.srt.instance.overrides",
    "sglang_prorsa.srt.engine.server": "sglang_prorsa.srt.instance.server",
    "sglang_prorsa.srt.scheduler.process": "sglang_prorsa.srt.instance.scheduler_process",
}


_LONGEST_FIRST = sorted(MOVED, key=len, reverse=True)


def new_name(old: str) -> str | None:
    """Where the module once importable as ``old`` lives now, or None if it did not move."""
    if not old.startswith("sglang_prorsa.srt."):  # the finder is asked about every import in the process
        return None
    for prefix in _LONGEST_FIRST:
        if old == prefix or old.startswith(prefix + "."):
            return MOVED[prefix] + old[len(prefix):]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an old import path with the module at its new place (the same object, not a copy)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if new_name(fullname) else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)
        module = importlib.import_module(new)
        self._spec = module.__spec__  # importlib overwrites __spec__ with the old name's; exec_module puts it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
