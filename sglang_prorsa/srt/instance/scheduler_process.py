"""The scheduler process entry SGLang spawns for an instance: apply our overrides there, then run the scheduler.

SGLang starts schedulers with the ``spawn`` method, so patches made in the instance's main process do not reach them;
``run_scheduler_process_func`` (of ``launch_server`` and ``Engine._launch_subprocesses``) is SGLang's hook for exactly
this. The instance passes ``functools.partial(run_scheduler_process, runtime, inner=...)``: the runtime (channel
addresses, KV store) arrives whole, pickled with the entry, never through environment variables; ``inner`` is the
entry that then runs the scheduler -- SGLang's own, or a framework's replacement of it (AReaL's runs SGLang's
``Scheduler`` with its own bridges bound), which our overrides reach because they patch SGLang's classes first.
"""

from __future__ import annotations

import logging
from typing import Callable

from sglang_prorsa.srt.scheduler.extension import SchedulerRuntime


def run_scheduler_process(runtime: SchedulerRuntime, *args, inner: Callable | None = None, **kwargs):
    from sglang_prorsa.srt.instance.overrides import apply_overrides
    from sglang_prorsa.srt.scheduler import extension

    apply_overrides()
    extension.RUNTIME = runtime
    logging.getLogger("sglang_prorsa").setLevel(logging.INFO)
    if runtime.cpu_threads > 0:  # several CPU instances on one host: see cpu_recipe.instance_threads
        import torch

        torch.set_num_threads(runtime.cpu_threads)
        logging.getLogger("sglang_prorsa").info("scheduler: %d torch thread(s)", runtime.cpu_threads)
    if inner is None:
        from sglang.srt.managers.scheduler import run_scheduler_process as inner
    return inner(*args, **kwargs)
