"""Hypothesis profiles shared by the test suite and the fuzz benchmark.

``ci`` (the default): small and reproducible -- derandomized, no deadline, health checks off, no example database
(a failure is reported with the body that was sent; nothing is written into the checkout). ``full``: random seeds,
selected with ``pytest --hypothesis-profile=full`` (the hypothesis pytest plugin's flag). Tests size their own runs
with ``examples(n)``: ``n`` under ``full``, about a tenth (at least 10) under ``ci``; settings a test passes
explicitly (``derandomize=True``, say) win over the profile's.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

CI, FULL = "ci", "full"
CI_FRACTION = 10  # a ci run makes 1/CI_FRACTION of a test's full examples
CI_MIN_EXAMPLES = 10

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None, print_blob=True)


def register() -> None:
    """Register ``ci`` and ``full`` and load ``ci`` (pytest's ``--hypothesis-profile`` loads another afterwards)."""
    settings.register_profile(CI, max_examples=CI_MIN_EXAMPLES * 5, derandomize=True, **_COMMON)
    settings.register_profile(FULL, max_examples=1000, derandomize=False, **_COMMON)
    settings.load_profile(CI)


def current() -> str:
    """The name of the loaded profile (hypothesis >= 6.1xx has a public accessor; older ones keep it private)."""
    getter = getattr(settings, "get_current_profile_name", None)
    if getter is not None:
        return getter()
    return getattr(settings, "_current_profile", None) or "default"


def examples(n: int) -> int:
    """``n`` under ``full``; about ``n / 10`` (at least 10, never more than ``n``) under any other profile."""
    if current() == FULL:
        return n
    return min(n, max(CI_MIN_EXAMPLES, n // CI_FRACTION))
