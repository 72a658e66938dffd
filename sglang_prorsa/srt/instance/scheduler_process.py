"""The scheduler process entry SGLang spawns for an instance: apply our overrides there, then run the scheduler.

SGLang starts schedulers with the ``spawn`` method, so patches made in the instance's main process do not reach them;
``run_scheduler_process_func`` (of ``launch_server`` and ``Engine._launch_subprocesses``) is SGLang's hook for exactly
this. The instance passes ``functools.partial(run_scheduler_process, runtime, inner=...)``: the runtime (channel
addresses, KV store) arrives whole, pickled with the entry, never through environment variables; ``inner`` is the
entry that then runs the scheduler -- SGLang's own, or a framework's replacement of it (AReaL's runs SGLang's
``Scheduler`` with its own bridges bound), which our overrides reach because they patch SGLang's classes first.

The scheduler's data-parallel rank and size are read here from SGLang's spawn arguments (``run_scheduler_process(
server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer, ...)``, positional from both SGLang's engine
and its DP controller): each DP rank's scheduler group binds its own channel (``ChannelAddresses.for_dp_rank``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from sglang_prorsa.srt.common.parallel import dp_ranks
from sglang_prorsa.srt.scheduler.extension import SchedulerRuntime


def run_scheduler_process(runtime: SchedulerRuntime, *args, inner: Callable | None = None, **kwargs):
    from sglang_prorsa.srt.instance.overrides import apply_overrides
    from sglang_prorsa.srt.scheduler import extension

    apply_overrides()
    extension.RUNTIME = with_spawn_ranks(runtime, args, kwargs)
    logging.getLogger("sglang_prorsa").setLevel(logging.INFO)
    if runtime.cpu_threads > 0:  # several CPU instances on one host: see cpu_recipe.instance_threads
        import torch

        torch.set_num_threads(runtime.cpu_threads)
        logging.getLogger("sglang_prorsa").info("scheduler: %d torch thread(s)", runtime.cpu_threads)
    if inner is None:
        from sglang.srt.managers.scheduler import run_scheduler_process as inner
    return inner(*args, **kwargs)


_SPAWN_PARAMETERS = ("server_args", "port_args", "gpu_id", "tp_rank", "pp_rank", "dp_rank")  # sglang_internals.SIGNATURES


def with_spawn_ranks(runtime: SchedulerRuntime, args: tuple, kwargs: dict[str, Any]) -> SchedulerRuntime:
    """The runtime with this scheduler's DP rank (None without a DP controller; SGLang's own fallback to
    ``SGLANG_DP_RANK`` applies) and the instance's DP size, from the arguments SGLang spawned it with."""
    from sglang.srt.managers.scheduler import resolve_spawn_dp_rank

    bound = dict(zip(_SPAWN_PARAMETERS, args))
    bound.update({k: kwargs[k] for k in _SPAWN_PARAMETERS if k in kwargs})
    dp_rank = resolve_spawn_dp_rank(bound.get("dp_rank"))
    if dp_rank is None:  # no DP controller spawned it: the instance's one scheduler group, the runtime as it came
        return runtime
    return dataclasses.replace(runtime, dp_rank=int(dp_rank), dp_size=dp_ranks(bound["server_args"]))
