"""An engine started the way slime starts one, with our entry point in place of SGLang's (the one line a slime user
changes): ``ServerArgs`` built by the caller, ``launch_server(server_args)`` run in a spawned
``multiprocessing.Process``, then slime's readiness wait (``GET /health_generate`` until 200, then
``GET /flush_cache`` until 200; slime/backends/sglang_utils/sglang_engine.py, ``launch_server_process`` and
``_wait_server_healthy``). Registering it (``POST /workers``) is left to the test, as slime does it after this.

    python -m slime_engine [--kv-store mooncake --mooncake-master HOST:PORT] -- SGLANG FLAGS...

On a host without CUDA it adds the CPU recipe's flags and environment first, as a trainer on such a host would
(the environment before the spawn: the engine's own process loads the libcuda stub at exec).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import sys
import time

import requests


def wait_healthy(url: str, alive) -> bool:
    """slime's wait; False as soon as the engine process is gone (its exit code is then this process's)."""
    for path in ("/health_generate", "/flush_cache"):
        while True:
            try:
                if requests.get(url + path, timeout=30).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if not alive():
                return False
            time.sleep(1)
    return True


def main(argv: list[str]) -> int:
    from sglang.srt.server_args import prepare_server_args

    from sglang_prorsa.launch_server import launch_server
    from sglang_prorsa.srt import cpu_recipe
    from sglang_prorsa.testing.tiny_model import ensure_default_model

    parser = argparse.ArgumentParser(prog="slime_engine")
    parser.add_argument("--kv-store", default="file")
    parser.add_argument("--mooncake-master", default="")
    ours, flags = parser.parse_known_args(argv)
    flags = [f for f in flags if f != "--"]
    if not cpu_recipe.given(flags, "--model-path"):
        flags += ["--model-path", str(ensure_default_model()), "--dtype", "float32"]
    if not cpu_recipe.cuda_available():
        flags = cpu_recipe.apply_cpu_flags(flags)
        os.environ.update(cpu_recipe.cpu_environment(dict(os.environ)))
    server_args = prepare_server_args(flags)  # a ServerArgs, as slime's ServerArgs(**server_args_dict)

    multiprocessing.set_start_method("spawn", force=True)
    engine = multiprocessing.Process(
        target=functools.partial(launch_server, kv_store=ours.kv_store, mooncake_master=ours.mooncake_master),
        args=(server_args,))
    engine.start()
    if wait_healthy(server_args.url(), engine.is_alive):
        print(f"slime_engine: {server_args.url()} healthy", flush=True)
    engine.join()
    return engine.exitcode or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
