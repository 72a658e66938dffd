"""Unit tests: pure code, or real loopback HTTP at most (``unit_support.py``, importable from every unit test)."""
