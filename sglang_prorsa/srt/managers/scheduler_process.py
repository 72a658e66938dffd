"""The scheduler process entry SGLang spawns for us: apply our overrides there, then run SGLang's own.

SGLang starts schedulers with the ``spawn`` method, so patches made in the launcher process do not reach them;
``launch_server(run_scheduler_process_func=...)`` is SGLang's hook for exactly this, and the function must be a
module-level name the child can import.
"""

from __future__ import annotations


def run_scheduler_process(*args, **kwargs):
    from sglang_prorsa.srt.overrides import apply_overrides

    apply_overrides()
    from sglang.srt.managers.scheduler import run_scheduler_process as sglang_run_scheduler_process

    return sglang_run_scheduler_process(*args, **kwargs)
