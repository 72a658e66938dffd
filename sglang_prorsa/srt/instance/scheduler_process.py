"""The scheduler process entry SGLang spawns for an instance: apply our overrides there, then run SGLang's own.

SGLang starts schedulers with the ``spawn`` method, so patches made in the instance's main process do not reach them;
``launch_server(run_scheduler_process_func=...)`` is SGLang's hook for exactly this. The instance passes
``functools.partial(run_scheduler_process, runtime)``: the runtime (channel addresses, KV store) arrives whole,
pickled with the entry, never through environment variables.
"""

from __future__ import annotations

import logging

from sglang_prorsa.srt.scheduler.extension import SchedulerRuntime


def run_scheduler_process(runtime: SchedulerRuntime, *args, **kwargs):
    from sglang_prorsa.srt.instance.overrides import apply_overrides
    from sglang_prorsa.srt.scheduler import extension

    apply_overrides()
    extension.RUNTIME = runtime
    logging.getLogger("sglang_prorsa").setLevel(logging.INFO)
    if runtime.cpu_threads > 0:  # several CPU instances on one host: see cpu_recipe.instance_threads
        import torch

        torch.set_num_threads(runtime.cpu_threads)
        logging.getLogger("sglang_prorsa").info("scheduler: %d torch thread(s)", runtime.cpu_threads)
    from sglang.srt.managers.scheduler import run_scheduler_process as sglang_run_scheduler_process

    return sglang_run_scheduler_process(*args, **kwargs)
