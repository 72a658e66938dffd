"""Switch safety on the instance itself (issue 13), for trainers that call instances directly, as slime and AReaL do.

SGLang's control methods on the tokenizer manager -- weight updates, pause/continue, memory release/resume, cache
flush -- and this instance's busy switch take one lock: an operation that arrives during a switch waits for the
rebuilt role (and then applies before the instance serves the next request, which SGLang's own update lock
guarantees), and no switch starts while one runs. A pause or a memory release holds switches here until its
counterpart arrives (``POST /prorsa/switch_role`` answers 409 ``control_operation`` meanwhile).
"""

from __future__ import annotations

from typing import Any, Callable

# SGLang TokenizerManager method -> (holds, releases) of a switch-blocking state.
GUARDED: dict[str, tuple[str | None, str | None]] = {
    "update_weights_from_disk": (None, None),
    "update_weights_from_tensor": (None, None),
    "update_weights_from_distributed": (None, None),
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
    success = getattr(out, "success", None)
    return True if success is None else bool(success)


def wrap_control(name: str) -> Callable[[Callable], Callable]:
    holds, releases = GUARDED[name]

    def make(original: Callable) -> Callable:
        async def method(self, *args, **kwargs):
            from sglang_prorsa.srt.engine import hooks

            side = hooks.ENGINE
            if side is None:
                return await original(self, *args, **kwargs)
            if name == "pause_generation" and getattr(args[0] if args else kwargs.get("obj"), "mode", None) == "abort":
                side.user_aborts += 1  # requests failing from here on were aborted by the trainer (hooks.py)
            async with side.ops_lock:
                out = await original(self, *args, **kwargs)
            if _succeeded(out):
                if holds:
                    side.held.add(holds)
                if releases:
                    side.held.discard(releases)
            side.counters[f"control_{name}"] += 1
            return out

        return method

    return make
