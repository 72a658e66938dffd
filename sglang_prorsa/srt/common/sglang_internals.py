"""Every SGLang internal our extensions touch, checked once at start-up, failing loudly on a mismatch.

Written against sglang 0.5.23. Class-level names are checked when the overrides are applied (every process that
runs SGLang code); per-instance attributes of the scheduler are checked when our scheduler extension starts and
again after each role rebuild, for the role the scheduler then has. Code elsewhere may then use these names
directly, without ``getattr(..., None)`` fallbacks.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any


class SGLangInternalsMismatch(RuntimeError):
    pass


# (module:dotted.name, why we need it)
CLASS_LEVEL: tuple[tuple[str, str], ...] = (
    ("sglang.srt.managers.scheduler:Scheduler.process_input_requests", "wrapped: our channel is polled there"),
    ("sglang.srt.managers.scheduler:Scheduler.run_batch", "wrapped: counts prompt tokens computed"),
    ("sglang.srt.managers.scheduler:Scheduler.collect_inflight_reqs", "requests in the running batches"),
    ("sglang.srt.managers.scheduler:Scheduler.is_fully_idle", "quiet before a rebuild; busy intervals"),
    ("sglang.srt.managers.scheduler:Scheduler.abort_request", "takes queued requests off the instance"),
    ("sglang.srt.managers.scheduler:run_scheduler_process", "our scheduler entry runs it after the overrides"),
    ("sglang.srt.managers.schedule_batch:FINISH_ABORT", "typed abort reasons (err_type) of migrated requests"),
    ("sglang.srt.managers.io_struct:AbortReq", "aborts with our finish reason"),
    ("sglang.srt.managers.schedule_batch:INIT_INCREMENTAL_DETOKENIZATION_OFFSET", "stitched text is decoded after "
                                                                                  "as many prompt tokens (5)"),
    ("sglang.srt.managers.io_struct:PdRoleSwitchReqInput", "the role rebuild"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.generate_request", "wrapped: admission of a "
                                                                                 "switching instance"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._stream_one_response", "wrapped: resume in the engine"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._tokenize_one_request", "wrapped: keeps a text "
                                                                                    "prompt's ids"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.pd_role_switch", "SGLang's idle role flip"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._validate_one_request", "wrapped: refuses a prompt "
                                                                                    "empty once tokenized"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.config_value", "the weight version in our answers"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.create_abort_task", "reads is_single: set on refusal"),
    ("sglang.srt.managers.io_struct:BatchTokenizedGenerateReqInput.batch", "test crash marker: a batch's requests"),
    ("sglang.srt.sampling.sampling_params:SamplingParams.verify", "the request guard verifies sampling parameters"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._handle_abort_finish_reason", "the raise of a finished "
                                                                                        "abort hooks.py continues"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._tokenize_texts", "a text prompt's ids for a request "
                                                                              "continued without SGLang's state"),
    *((f"sglang.srt.managers.tokenizer_manager:TokenizerManager.{name}", "wrapped: serialised with switches")
      for name in ("update_weights_from_disk", "update_weights_from_tensor", "update_weights_from_distributed",
                   "init_weights_update_group", "destroy_weights_update_group", "flush_cache", "pause_generation",
                   "continue_generation", "release_memory_occupation", "resume_memory_occupation")),
    ("sglang.srt.mem_cache.radix_cache:RadixKey", "prefix-cache keys for loaded prefixes"),
    ("sglang.srt.mem_cache.base_prefix_cache:MatchPrefixParams", "prefix match of a loaded prefix"),
    ("sglang.srt.mem_cache.base_prefix_cache:InsertParams", "insert a loaded prefix"),
    ("sglang.srt.mem_cache.base_prefix_cache:EvictParams", "make room for a loaded prefix"),
    ("sglang.srt.disaggregation.common.conn:CommonKVManager._handle_node_failure", "a decode instance forgets "
                                                                                  "a prefill whose role was rebuilt"),
    ("sglang.srt.utils.network:NetworkAddress", "the decode side's key for a prefill's bootstrap address"),
    ("sglang.srt.managers.io_struct:UpdateWeightVersionReqInput", "an update that could not flush still records "
                                                                  "its weight version (control_guard.py)"),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.update_weight_version", "the same"),
    ("sglang.srt.utils.aio_rwlock:RWLock.release_reader", "a resumed request gives back the model-update reader "
                                                          "lock while it continues elsewhere (hooks.py)"),
    ("sglang.srt.entrypoints.http_server:launch_server", "instances run SGLang's own HTTP server"),
    ("sglang.srt.entrypoints.http_server:_global_state", "the tokenizer manager of this process"),
    ("sglang.srt.entrypoints.http_server:app", "our routes are mounted on SGLang's app"),
    ("sglang.srt.entrypoints.http_server:_execute_server_warmup", "its wait for the port is why an instance whose "
                                                                  "port is taken exits itself (ExitWhenPortTaken)"),
)

# Scheduler instance attributes, per role ("any" = every role).
SCHEDULER_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "any": ("waiting_queue", "running_batch", "chunked_req", "tree_cache", "token_to_kv_pool_allocator",
            "req_to_token_pool", "disaggregation_mode", "server_args", "page_size", "max_total_num_tokens",
            "idle_sleeper"),
    "prefill": ("disagg_prefill_bootstrap_queue", "disagg_prefill_inflight_queue"),
    "decode": ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"),
}
REQ_ATTRIBUTES: tuple[str, ...] = ("rid", "origin_input_ids", "output_ids", "sampling_params", "bootstrap_room",
                                   "bootstrap_host", "bootstrap_port", "kv", "to_finish", "weight_version_events",
                                   "cached_tokens")
# SGLang 0.5.23's UnifiedRadixCache (Rust tree core): nodes are handles, locks are TreeLock receipts, and a reset
# mints a new root handle (handles are never re-used), which is how a held lock is known to be stale.
TREE_CACHE_METHODS: tuple[str, ...] = ("match_prefix", "insert", "evict", "lock", "unlock", "path_device_indices",
                                       "root_node_handle", "evictable_size", "protected_size")


def resolve(target: str) -> Any:
    module, _, path = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        if not hasattr(obj, part):
            raise SGLangInternalsMismatch(f"{target}: SGLang has no {part!r} here (written against sglang 0.5.23)")
        obj = getattr(obj, part)
    return obj


# Constants whose values we rely on: (module:name, the value we assume, why).
CONSTANTS: tuple[tuple[str, Any, str], ...] = (
    ("sglang.srt.constants:HEALTH_CHECK_RID_PREFIX", "HEALTH_CHECK", "health-check requests are not counted as work"),
)


def check_class_level() -> None:
    for target, _why in CLASS_LEVEL:
        resolve(target)
    from sglang.srt.utils.aio_rwlock import RWLock

    lock = RWLock()
    missing = [a for a in ("_lock", "_readers") if not hasattr(lock, a)]
    if missing:
        raise SGLangInternalsMismatch(f"SGLang's RWLock lacks {missing} (written against sglang 0.5.23)")
    from sglang.srt.managers.io_struct import FlushCacheReqInput

    if "timeout_s" not in inspect.signature(FlushCacheReqInput).parameters:  # the deferred flush (control_guard.py)
        raise SGLangInternalsMismatch("SGLang's FlushCacheReqInput has no timeout_s (written against sglang 0.5.23)")
    for target, value, _why in CONSTANTS:
        if resolve(target) != value:
            raise SGLangInternalsMismatch(f"{target} is {resolve(target)!r}, not {value!r} (written against sglang 0.5.23)")


def check_scheduler(scheduler: Any, role: str) -> None:
    """Per-instance attributes for the scheduler's current role (called at start and after every rebuild)."""
    missing = [a for a in SCHEDULER_ATTRIBUTES["any"] + SCHEDULER_ATTRIBUTES.get(role, ()) if not hasattr(scheduler, a)]
    if role in ("prefill", "decode"):
        queues = ("disagg_prefill_bootstrap_queue",) if role == "prefill" else (
            "disagg_decode_prealloc_queue", "disagg_decode_transfer_queue")
        missing += [f"{q}.queue" for q in queues if hasattr(scheduler, q) and not hasattr(getattr(scheduler, q), "queue")]
    missing += [f"tree_cache.{m}" for m in TREE_CACHE_METHODS
                if hasattr(scheduler, "tree_cache") and not hasattr(scheduler.tree_cache, m)]
    if missing:
        raise SGLangInternalsMismatch(f"the {role} scheduler lacks {missing} (written against sglang 0.5.23)")


def check_req(req: Any) -> None:
    missing = [a for a in REQ_ATTRIBUTES if not hasattr(req, a)]
    if missing:
        raise SGLangInternalsMismatch(f"SGLang's Req lacks {missing} (written against sglang 0.5.23)")
