"""Shared test configuration: every server a test starts binds and advertises 127.0.0.1 only.

Tiers by path: everything under ``tests/unit`` is marked ``unit`` (no servers; ``make test-unit``), everything under
``tests/integration`` ``integration`` (real SGLang servers; ``make test-integration``); ``-m unit`` selects the same.

Hypothesis profiles (``sglang_prorsa/testing/profiles.py``): ``ci`` is the default; ``pytest
--hypothesis-profile=full`` runs every property test at its full example count (``examples(n)``).
"""

import os
from pathlib import Path

import pytest

from sglang_prorsa.testing import profiles

os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
os.environ.setdefault("MOONCAKE_PROTOCOL", "tcp")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

profiles.register()


TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(item.path).resolve().relative_to(TESTS).parts[0]
        item.add_marker(getattr(pytest.mark, tier))
    _last_in_package(items)


def _last_in_package(items: list[pytest.Item]) -> None:
    """Tests of a module that sets ``RUNS_LAST_IN_PACKAGE = True`` (it kills and restarts the package's shared
    servers) run after the rest of their package, in the positions the package's tests already hold, so that no other
    test of the package meets an instance restarted mid-package and the package's fixtures are set up once."""
    last = {i for i, item in enumerate(items) if getattr(getattr(item, "module", None), "RUNS_LAST_IN_PACKAGE", False)}
    for package in {Path(items[i].path).parent for i in last}:
        slots = [i for i, item in enumerate(items) if Path(item.path).parent == package]
        ordered = [items[i] for i in slots if i not in last] + [items[i] for i in slots if i in last]
        for slot, item in zip(slots, ordered):
            items[slot] = item
