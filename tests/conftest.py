"""Shared test configuration: every server a test starts binds and advertises 127.0.0.1 only."""

import os

os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
os.environ.setdefault("MOONCAKE_PROTOCOL", "tcp")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
