"""Switch safety on the instance itself (issue 13), for trainers that call instances directly, as slime and AReaL do.

SGLang's control methods on the tokenizer manager -- weight updates, pause/continue, memory release/resume, cache
flush -- and this instance's busy switch take one lock: an operation that arrives during a switch waits for the
rebuilt role (and then applies before the instance serves the next request, which SGLang's own update lock
guarantees), and no switch starts while one runs. A pause or a memory release holds switches here until its
counterpart arrives (``POST /prorsa/switch_role`` answers 409 ``control_operation`` meanwhile).

Beyond SGLang: a weight update whose flush SGLang refused while the instance was not paused is flushed once the
instance falls idle (SGLang's own deferred flush, at most ``FLUSH_WAIT_S``). SGLang's update waits for the requests
it knows (the model-update writer lock), so what still keeps the cache from flushing then is short: health-check
generations (sglang-router checks every worker), halves still in KV transfer. Without this, an update answered 400
at random whenever a router's health check was in flight.
"""

from __future__ import annotations

from typing import Any, Callable

# SGLang TokenizerManager method -> (holds, releases) of a switch-blocking state.
GUARDED: dict[str, tuple[str | None, str | None]] = {
    "update_weights_from_disk": (None, None),
    "update_weights_from_tensor": (None, None),
    "update_weights_from_distributed": (None, None),
    "update_weights_from_ipc": (None, None),
    # SGLang 0.5.23 loads tensor and distributed updates only between these two: no switch with half-loaded weights
    "begin_weight_update": ("weight update session", None),
    "end_weight_update": (None, "weight update session"),
    "check_weights": (None, None),  # its reset_tensors action changes the weights
    "init_weights_update_group": (None, None),
    "destroy_weights_update_group": (None, None),
    "flush_cache": (None, None),
    "pause_generation": ("generation paused", None),
    "continue_generation": (None, "generation paused"),
    "release_memory_occupation": ("memory released", None),
    "resume_memory_occupation": (None, "memory released"),
}


def _succeeded(out: Any) -> bool:
    if isinstance(out, tuple) and out and isinstance(out[0], bool):
        return out[0]  # SGLang's (success, message, ...) answers
    # pause/continue_generation and release/resume_memory_occupation answer None; flush_cache a FlushCacheReqOutput
    return True if out is None else bool(out.success)


# SGLang 0.5.23's answer when it swapped the weights but could not flush the prefix cache (requests were running):
# success is False, so it also skips recording the new weight version, and the instance would go on reporting the
# old one. There is no typed code for this case; the message is the only signal.
NOT_FLUSHED = "Weights were updated, but the cache was not flushed"


def _updated_but_not_flushed(out: Any) -> bool:
    message = out[1] if isinstance(out, tuple) and len(out) > 1 else ""  # update_weights_from_*: (success, message, ...)
    return not _succeeded(out) and isinstance(message, str) and NOT_FLUSHED in message


# How long an update that could not flush waits for the instance to fall idle (seconds). Long enough for a health
# check or a transfer in flight; an instance still busy after it answers SGLang's 400 as before.
FLUSH_WAIT_S = 5.0


async def _flush_when_idle(tm: Any) -> bool:
    """SGLang's deferred flush (``FlushCacheReqInput.timeout_s``), called past our wrapper: we hold its lock."""
    flush = getattr(type(tm).flush_cache, "__wrapped__", type(tm).flush_cache)  # our wrapper's (functools.wraps)
    out = await flush(tm, timeout_s=FLUSH_WAIT_S)
    return bool(out.success)


def _flushed(out: tuple, version: Any) -> tuple:
    """The update's answer once the deferred flush went through: SGLang's success, with the version it recorded."""
    message = "Succeeded to update model weights; the cache was flushed once in-flight requests finished."
    if version is not None:
        message += f" Weight version updated to {version}."
    return (True, message, *out[2:])


async def _record_version(tm: Any, obj: Any) -> None:
    """Record the version the weights now have, through SGLang's own route logic (scheduler and tokenizer side)."""
    version = obj.weight_version  # UpdateWeight(s)From*ReqInput (sglang_internals)
    if version is None:
        return
    from sglang.srt.managers.io_struct import UpdateWeightVersionReqInput

    # abort_all_requests defaults to True in SGLang: the running requests that kept the cache from flushing stay.
    await tm.update_weight_version(UpdateWeightVersionReqInput(new_version=version, abort_all_requests=False))


def wrap_control(name: str) -> Callable[[Callable], Callable]:
    holds, releases = GUARDED[name]

    def make(original: Callable) -> Callable:
        async def method(self, *args, **kwargs):
            from sglang_prorsa.srt.engine import hooks

            side = hooks.ENGINE
            if side is None:
                return await original(self, *args, **kwargs)
            if name == "pause_generation" and (args[0] if args else kwargs["obj"]).mode == "abort":
                side.user_aborts += 1  # requests failing from here on were aborted by the trainer (hooks.py)
            async with side.ops_lock:
                out = await original(self, *args, **kwargs)
                if name.startswith("update_weights_from") and _updated_but_not_flushed(out):
                    obj = args[0] if args else kwargs.get("obj")
                    await _record_version(self, obj)
                    # Paused in place, the held requests will not finish: SGLang's answer stands.
                    if not self.is_pause and isinstance(out, tuple) and await _flush_when_idle(self):
                        out = _flushed(out, obj.weight_version)
            if _succeeded(out):
                if holds:
                    side.held.add(holds)
                if releases:
                    side.held.discard(releases)
            side.counters[f"control_{name}"] += 1
            return out

        return method

    return make
