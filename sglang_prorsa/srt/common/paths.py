"""The one definition of sglang-prorsa's cache root, outside any clone: the virtual environment, the embedded tiny
model, the libcuda stub, the torch-extension builds and the file KV store all live under it.

``$SGLANG_PRORSA_CACHE`` when set, else ``~/.cache/sglang-prorsa``; read at each call, so a process started with the
variable set (the Makefile exports it, equal to its ``CACHE``) and a test that sets it both see it everywhere.

Standard library only, and runnable as a script -- ``python3 -I sglang_prorsa/srt/common/paths.py`` prints the root
-- so the Makefile asks this file for its default ``CACHE`` before any virtual environment exists.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SGLANG_PRORSA_CACHE"


def cache_root() -> Path:
    """``$SGLANG_PRORSA_CACHE``, or ``~/.cache/sglang-prorsa`` when it is unset or empty."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sglang-prorsa")


if __name__ == "__main__":
    print(cache_root())
