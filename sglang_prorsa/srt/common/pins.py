"""The versions sglang-prorsa is pinned to, read from their one source: ``requirements/base.txt``.

That file is what the virtual environment is installed from (and keyed by, see the Makefile), so it holds the pins;
nothing else writes a version down. ``setup.py`` loads this module by path at build time and takes
``install_requires`` from it, so an installed distribution's metadata carries the same pins. At run time the pins are
read from the checkout's file when the package runs from a checkout (an editable install: edits are seen at once),
else from the installed distribution's metadata (a wheel, which ships no ``requirements/``).

Standard library only: ``setup.py`` runs it before anything is installed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

DISTRIBUTION = "sglang-prorsa"
CHECKOUT = Path(__file__).resolve().parents[3]
REQUIREMENTS = CHECKOUT / "requirements" / "base.txt"

# ``name==version``, optionally followed by environment markers (``; extra == "gpu"``, as in installed metadata).
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)\s*(?:;.*)?$")


def canonical(name: str) -> str:
    """PEP 503's normalised project name (``Sglang_Router`` -> ``sglang-router``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(lines: Iterable[str]) -> dict[str, str]:
    """``{canonical name: version}`` of every exactly pinned requirement line; comments and unpinned lines ignored."""
    pins: dict[str, str] = {}
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        match = _PIN.match(line)
        if match:
            pins.setdefault(canonical(match.group(1)), match.group(2))
    return pins


def from_checkout() -> bool:
    """Whether this package runs from a checkout (its ``requirements/base.txt`` beside its ``setup.py``)."""
    return REQUIREMENTS.is_file() and (CHECKOUT / "setup.py").is_file()


def requirement_pins() -> dict[str, str]:
    """Every pin: from ``requirements/base.txt`` in a checkout, else from the installed distribution's metadata."""
    if from_checkout():
        return parse_pins(REQUIREMENTS.read_text().splitlines())
    from importlib.metadata import PackageNotFoundError, requires

    try:
        return parse_pins(requires(DISTRIBUTION) or ())
    except PackageNotFoundError:
        raise RuntimeError(f"no {REQUIREMENTS} and no installed {DISTRIBUTION} distribution to read the pins from") \
            from None


def pinned(name: str, pins: dict[str, str] | None = None) -> str:
    """The version ``name`` is pinned to (``RuntimeError`` if it is not pinned with ``==``)."""
    pins = requirement_pins() if pins is None else pins
    try:
        return pins[canonical(name)]
    except KeyError:
        where = REQUIREMENTS if from_checkout() else f"the {DISTRIBUTION} metadata"
        raise RuntimeError(f"{name} is not pinned (name==version) in {where}") from None


SGLANG_VERSION = pinned("sglang")  # the SGLang every override and internals check is written against
