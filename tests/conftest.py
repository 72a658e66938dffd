"""Shared test configuration: every server a test starts binds and advertises 127.0.0.1 only.

Hypothesis profiles (``sglang_prorsa/testing/profiles.py``): ``ci`` is the default; ``pytest
--hypothesis-profile=full`` runs every property test at its full example count (``examples(n)``).
"""

import os

from sglang_prorsa.testing import profiles

os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
os.environ.setdefault("MOONCAKE_PROTOCOL", "tcp")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

profiles.register()
