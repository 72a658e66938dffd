"""One deployment for every test in this package: four engine instances (2 prefill, 2 decode to start) under one
front, and sglang-router 0.3.2 in PD mode over the same instances (the front's controller fills its pools). Started
once, ended by PID when the package's last test is done."""

from __future__ import annotations

import pytest
from tests_support import running_front, running_router


@pytest.fixture(scope="package")
def deployment(tiny_model, log_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("kv-store")
    with running_router(log_dir) as router, running_front(
            log_dir, ["--prorsa-kv-store", "file", "--prorsa-kv-store-path", str(store), "--prorsa-router",
                      router.url,
                      # Two torch threads each, as before the front shared the cores out (one each): with the faster
                      # instances, the first two busy-switch tests failed once in CI (passing alone); the timing they
                      # depend on is not yet understood (see docs/failures.md, known limits). Kept until it is.
                      "--prorsa-cpu-threads", "2"], n_instances=4, initial_prefill=2) as front:
        front.router, front.store = router, store
        yield front
