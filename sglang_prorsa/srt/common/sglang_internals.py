"""Every SGLang internal our extensions touch, checked once at start-up, failing loudly on a mismatch.

Written against the pinned SGLang (``pins.SGLANG_VERSION``: 0.5.23). Code elsewhere may use every name declared
here directly, without ``getattr(..., None)`` fallbacks; a ``getattr`` with a default on an SGLang object is left
only where the attribute is optional in the pinned SGLang itself, with a comment saying why.

Three kinds of declarations, all checked by ``check_class_level()`` when the overrides are applied (every process
that runs SGLang code, ``srt/instance/overrides.py``) and by ``tests/unit/srt/common/test_sglang_internals.py``
against the installed SGLang:

- ``CLASS_LEVEL``: module-level names, classes, methods and class attributes (resolved by name).
- ``INSTANCE_LEVEL``: attributes an *instance* of an SGLang class has -- request objects, the tokenizer manager's
  request state, sampling parameters, the batch, the KV pools and allocator, the disaggregation queues, the server
  arguments. Most of these classes cannot be built cheaply (a scheduler or a tokenizer manager needs a model), so no
  instance is made: ``instance_names(cls)`` reads what the class defines -- its class attributes and methods, its
  dataclass / msgspec / NamedTuple fields, and every ``self.<name>`` assigned anywhere in the source of the class or
  one of its bases (parsed with ``ast``; ``setattr(self, "<name>", ...)`` too). That is what a version change
  renames or drops, and it needs neither a model nor a GPU. It cannot tell whether every code path assigns a name;
  names set only on some paths are read with ``getattr`` and a comment where they are used.
- ``CONSTANTS``: values we rely on.

Every problem found is reported at once: ``SGLangInternalsMismatch`` names each missing item, the version these
declarations were written against and the installed one.

Live objects are checked too, where their class depends on the configuration: the scheduler's per-role attributes
and its tree cache when our scheduler extension starts and after each role rebuild (``check_scheduler``), and the
tokenizer manager when the instance builds it (``check_instance``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
from pathlib import Path
from typing import Any, Iterable

from sglang_prorsa.srt.common.paths import cache_root
from sglang_prorsa.srt.common.pins import SGLANG_VERSION as WRITTEN_AGAINST  # the pin (requirements/base.txt)


class SGLangInternalsMismatch(RuntimeError):
    pass


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return "unknown"


def _mismatch(problems: Iterable[str]) -> SGLangInternalsMismatch:
    problems = list(problems)
    return SGLangInternalsMismatch(
        f"{len(problems)} SGLang internal(s) sglang-prorsa uses are missing or changed (written against sglang "
        f"{WRITTEN_AGAINST}, installed sglang {_installed_version()}):\n  " + "\n  ".join(problems)
        + "\nre-check sglang_prorsa/srt/common/sglang_internals.py and the code using these names")


# (module:dotted.name, why we need it)
CLASS_LEVEL: tuple[tuple[str, str], ...] = (
    ("sglang.srt.managers.scheduler:Scheduler.process_input_requests", "wrapped: our channel is polled there"),
    ("sglang.srt.managers.scheduler:Scheduler.run_batch", "wrapped: counts prompt tokens computed"),
    ("sglang.srt.managers.scheduler:Scheduler.collect_inflight_reqs", "requests in the running batches"),
    ("sglang.srt.managers.scheduler:Scheduler.is_fully_idle", "quiet before a rebuild; busy intervals"),
    ("sglang.srt.managers.scheduler:Scheduler.abort_request", "takes queued requests off the instance"),
    ("sglang.srt.managers.scheduler:run_scheduler_process", "our scheduler entry runs it after the overrides"),
    ("sglang.srt.managers.scheduler:resolve_spawn_dp_rank", "our scheduler entry reads its DP rank as SGLang does "
                                                            "(the spawn argument, else SGLANG_DP_RANK)"),
    ("sglang.srt.utils:broadcast_pyobj", "TP rank 0 hands our control messages to the other TP ranks "
                                         "(scheduler/ranks.py), as SGLang hands them its recv_reqs"),
    ("sglang.srt.mem_cache.kv_cache_configurator:KVCacheConfigurator._profile_available_bytes",
     "wrapped: a CPU pool sized by --max-total-tokens"),
    ("sglang.srt.mem_cache.kv_cache_configurator:get_schedule", "the token budget, read by that wrapper"),
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
                   "update_weights_from_ipc", "begin_weight_update", "end_weight_update", "check_weights",
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
    ("sglang.srt.entrypoints.engine:init_tokenizer_manager", "the instance keeps the tokenizer manager it builds"),
    ("sglang.srt.entrypoints.engine:Engine", "the in-process entry point subclasses it (sglang_prorsa/engine.py)"),
    ("sglang.srt.entrypoints.engine:Engine._launch_subprocesses", "the in-process entry point's launch, which "
                                                                  "verl and AReaL call directly"),
    ("sglang.srt.server_args:prepare_server_args", "the instance's and the launcher's server arguments"),
    ("sglang.srt.server_args:ServerArgs.add_cli_args", "the launcher's parser is SGLang's"),
    ("sglang.srt.utils:kill_process_tree", "an instance ends its children"),
    ("sglang.srt.utils.auth:AuthLevel.ADMIN_OPTIONAL", "our state-changing routes (auth.py)"),
    ("sglang.srt.utils.auth:auth_level", "the same"),
    ("sglang.srt.utils.auth:add_api_key_middleware", "the front's API keys (auth.py)"),
    ("sglang.srt.managers.io_struct:GenerateReqInput", "hooks.py: only generation requests are ours"),
    ("sglang.srt.managers.io_struct:TokenizedGenerateReqInput", "the test crash marker"),
    ("sglang.srt.managers.io_struct:TokenizedEmbeddingReqInput", "the test crash marker"),
    ("sglang.srt.managers.io_struct:BatchTokenizedEmbeddingReqInput", "the test crash marker"),
    ("sglang.srt.utils.weight_versions:compute_weight_version_spans", "a taken-off request's weight-version spans"),
    ("sglang.srt.runtime_context:get_serving", "the scheduler's weight version (get_serving().weight_version: a "
                                               "config bag resolved at run time, not checkable statically)"),
    ("sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache", "the tree cache's base class"),
    ("sglang.srt.mem_cache.pool_host.common:ALLOC_MEMORY_FUNCS", "the CPU host-buffer override adds its 'cpu' entry "
                                                                 "(overrides.py, host_alloc_problems)"),
    ("sglang.srt.mem_cache.pool_host.common:alloc_with_host_register", "the same: the fallback it stands in for"),
)

# Callables we call with named or positional arguments: (module:name, the parameters we pass, in order).
SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sglang.srt.managers.schedule_batch:FINISH_ABORT", ("message", "status_code", "err_type")),
    ("sglang.srt.utils.weight_versions:compute_weight_version_spans", ("events", "current_version",
                                                                       "num_output_tokens")),
    ("sglang.srt.utils.network:NetworkAddress", ("host", "port")),
    ("sglang.srt.mem_cache.radix_cache:RadixKey", ("token_ids",)),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.flush_cache", ("self", "timeout_s")),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.config_value", ("self", "name")),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._tokenize_texts", ("self", "texts")),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._validate_one_request", ("self", "obj", "input_ids")),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager._stream_one_response", ("self", "obj", "state",
                                                                                     "request")),
    ("sglang.srt.managers.tokenizer_manager:TokenizerManager.generate_request", ("self", "obj", "request")),
    ("sglang.srt.entrypoints.engine:Engine._launch_subprocesses", ("server_args", "init_tokenizer_manager_func",
                                                                   "run_scheduler_process_func",
                                                                   "run_detokenizer_process_func", "port_args",
                                                                   "placement_group")),
    ("sglang.srt.mem_cache.kv_cache_configurator:KVCacheConfigurator._profile_available_bytes",
     ("self", "pre_model_load_memory")),
    # instance/scheduler_process.py reads the DP rank from SGLang's positional spawn arguments.
    ("sglang.srt.managers.scheduler:run_scheduler_process", ("server_args", "port_args", "gpu_id", "tp_rank",
                                                             "pp_rank", "dp_rank")),
    ("sglang.srt.managers.scheduler:resolve_spawn_dp_rank", ("dp_rank",)),
    ("sglang.srt.utils:broadcast_pyobj", ("data", "rank", "dist_group", "src")),
)

# Scheduler instance attributes, per role ("any" = every role).
SCHEDULER_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "any": ("waiting_queue", "running_batch", "chunked_req", "tree_cache", "token_to_kv_pool_allocator",
            "req_to_token_pool", "disaggregation_mode", "server_args", "page_size", "max_total_num_tokens",
            "idle_sleeper", "tp_size", "tp_group", "attn_tp_group", "attn_cp_group"),
    "prefill": ("disagg_prefill_bootstrap_queue", "disagg_prefill_inflight_queue"),
    "decode": ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"),
}
REQ_ATTRIBUTES: tuple[str, ...] = ("rid", "origin_input_ids", "output_ids", "sampling_params", "bootstrap_room",
                                   "bootstrap_host", "bootstrap_port", "kv", "to_finish", "weight_version_events",
                                   "cached_tokens")
# SGLang 0.5.23's UnifiedRadixCache (Rust tree core): nodes are handles, locks are TreeLock receipts, and a reset
# mints a new root handle (handles are never re-used), which is how a held lock is known to be stale.
TREE_CACHE_METHODS: tuple[str, ...] = ("match_prefix", "insert", "evict", "lock", "unlock", "path_device_indices",
                                       "root_node_handle", "evictable_size", "protected_size", "disable")

_IO = "sglang.srt.managers.io_struct"
_TM = "sglang.srt.managers.tokenizer_manager"
_SB = "sglang.srt.managers.schedule_batch"
_MC = "sglang.srt.mem_cache"
# Fields of GenerateReqInput that request_guard.py checks per prompt (PER_PROMPT, PD_FIELDS) and that a continuation
# carries over (continuation.CARRIED_FIELDS), and the trajectory id fields hooks.py reads (engine_api.SGLANG_ID_FIELDS); a
# unit test keeps these in step with those lists.
GENERATE_REQ_FIELDS: tuple[str, ...] = (
    "rid", "text", "input_ids", "input_embeds", "sampling_params", "stream", "image_data", "video_data", "audio_data",
    "session_params", "session_id", "positional_embed_overrides", "token_ids_logprob", "disagg_prefill_dp_rank",
    "routed_dp_rank", "data_parallel_rank", "return_logprob", "logprob_start_len", "top_logprobs_num",
    "return_sampling_mask", "lora_path", "lora_id", "custom_logit_processor", "extra_key", "cache_salt",
    "return_hidden_states", "return_text_in_logprobs", "priority", "bootstrap_room", "bootstrap_host",
    "bootstrap_port", "bootstrap_pair_key", "decode_tp_size", "return_routed_experts", "routed_experts_start_len",
    "routing_key", "conversation_id",
)
# SamplingParams attributes a taken-off request's record carries (scheduler/extension.py _SAMPLING_FIELDS).
SAMPLING_PARAMS_FIELDS: tuple[str, ...] = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stop_token_ids", "n", "stop_strs",
)

# (module:Class, what an instance of it has that we read, write or call, where / why). Checked without building an
# instance (see the module docstring): class attributes, methods, declared fields, and ``self.<name>`` assignments.
INSTANCE_LEVEL: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (f"{_MC}.kv_cache_configurator:KVCacheConfigurator", ("device",), "the CPU KV-pool override: which device"),
    # -- the tokenizer manager's side (srt/engine/) ------------------------------------------------------------------
    (f"{_IO}:GenerateReqInput", GENERATE_REQ_FIELDS + ("normalize_batch_and_arguments", "is_single"),
     "request_guard, hooks (hand-on at arrival), side/aborts/continuation (resume); is_single is set only by "
     "normalize_batch_and_arguments (hooks.py reads it with hasattr for that reason)"),
    (f"{_IO}:EmbeddingReqInput", ("input_ids",), "keep_prompt_ids (engine) sees every tokenized request"),
    (f"{_IO}:TokenizedGenerateReqInput", ("rid", "input_ids"), "keep_prompt_ids (engine); the test crash marker"),
    (f"{_IO}:TokenizedEmbeddingReqInput", ("rid", "input_ids"), "the same"),
    (f"{_IO}:BatchTokenizedGenerateReqInput", ("batch",), "the test crash marker: a batch's requests"),
    (f"{_IO}:BatchTokenizedEmbeddingReqInput", ("batch",), "the same"),
    (f"{_TM}:ReqState", ("obj", "finished", "output_ids", "output_token_logprobs", "output_top_logprobs",
                         "output_token_ids_logprobs"),
     "hooks/aborts/continuation: a taken-off request's tokens and logprobs; watchdog: held rooms"),
    (f"{_TM}:TokenizerManager", ("rid_to_state", "model_update_lock", "incremental_streaming_output",
                                 "disaggregation_mode", "tokenizer", "server_args", "model_config", "is_pause"),
     "engine side: role, held rooms, resume, request limits, the deferred flush"),
    ("sglang.srt.configs.model_config:ModelConfig", ("vocab_size", "hf_text_config"),
     "request_guard limits; a routed_experts row's size (engine/local.py)"),
    ("sglang.srt.server_args:ServerArgs", ("host", "port", "device", "model_path", "api_key", "admin_api_key",
                                           "disaggregation_mode", "disaggregation_bootstrap_port",
                                           "disaggregation_transfer_backend", "enable_pd_role_switch",
                                           "disaggregation_decode_enable_radix_cache", "grammar_backend", "dp_size",
                                           "tp_size", "pp_size", "enable_dp_attention", "attn_dp_size", "base_gpu_id",
                                           "gpu_id_step", "nnodes"),
     "instance/server.py, launch_server.py, auth.py, request_guard limits, kv_persist.layout_of, common/parallel.py"),
    (f"{_IO}:PdRoleSwitchReqInput", ("new_role", "decode_cuda_graph_memory_gb"), "switch.py: the role rebuild"),
    (f"{_IO}:PdRoleSwitchReqOutput", ("success", "message", "safe_to_restore"), "switch.py: the role rebuild"),
    (f"{_IO}:FlushCacheReqInput", ("timeout_s",), "control_guard.py: SGLang's deferred flush"),
    (f"{_IO}:FlushCacheReqOutput", ("success",), "control_guard.py"),
    (f"{_IO}:PauseGenerationReqInput", ("mode",), "control_guard.py: a pause in abort mode is the trainer's abort"),
    *((f"{_IO}:{name}", ("weight_version",), "control_guard.py: the version of an update that could not flush")
      for name in ("UpdateWeightFromDiskReqInput", "UpdateWeightsFromTensorReqInput",
                   "UpdateWeightsFromDistributedReqInput")),
    (f"{_IO}:UpdateWeightVersionReqInput", ("new_version", "abort_all_requests"), "control_guard.py"),
    (f"{_IO}:AbortReq", ("rid", "finished_reason"), "scheduler/extension.py: aborts with our reason"),
    ("sglang.srt.utils.aio_rwlock:RWLock", ("_lock", "_readers", "release_reader"),
     "hooks.py: a resumed request gives back the model-update reader lock"),
    ("sglang.srt.sampling.sampling_params:SamplingParams", SAMPLING_PARAMS_FIELDS + ("verify", "normalize"),
     "scheduler/extension.py sampling_dict; request_guard verifies parameters"),
    # -- the scheduler's side (srt/scheduler/, srt/disaggregation/, kernels/) --------------------------------------------
    ("sglang.srt.managers.scheduler:Scheduler", tuple(dict.fromkeys(
        a for attrs in SCHEDULER_ATTRIBUTES.values() for a in attrs)),
     "scheduler/extension.py, scheduler/kv.py (checked per role on the live scheduler too)"),
    ("sglang.srt.managers.scheduler_components.idle_sleeper:IdleSleeper", ("poller",),
     "our channel wakes an idle scheduler"),
    ("sglang.srt.distributed.parallel_state:GroupCoordinator", ("rank", "ranks", "rank_in_group", "world_size",
                                                                 "cpu_group"),
     "scheduler/ranks.py: the scheduler's tp_group or attn_tp_group (its rank; the broadcast of our control "
     "messages); attn_cp_group's size (refused above 1)"),
    (f"{_SB}:Req", REQ_ATTRIBUTES + ("finished",), "taking requests off, records, counters"),
    (f"{_SB}:ReqKvInfo", ("req_pool_idx",), "scheduler/kv.py: a request's req_to_token row"),
    (f"{_SB}:ScheduleBatch", ("reqs", "extend_lens", "extend_num_tokens", "forward_mode"),
     "overrides.py run_batch wrapper, extension.prorsa_observe_extend, the running batch"),
    ("sglang.srt.model_executor.forward_batch_info:ForwardMode", ("is_extend",), "overrides.py run_batch wrapper"),
    (f"{_SB}:FINISH_ABORT", ("to_json",), "scheduler/extension.py: our abort reason"),
    ("sglang.srt.disaggregation.decode:DecodeRequest", ("req",), "decode queue items"),
    ("sglang.srt.disaggregation.decode:DecodePreallocQueue", ("queue", "kv_manager"), "decode queues; forget_prefill"),
    ("sglang.srt.disaggregation.decode:DecodeTransferQueue", ("queue",), "decode queues"),
    ("sglang.srt.disaggregation.prefill:PrefillBootstrapQueue", ("queue",), "prefill bootstrap queue"),
    ("sglang.srt.disaggregation.common.conn:CommonKVManager", ("prefill_info_table", "connection_pool",
                                                                "_handle_node_failure"),
     "forget_prefill: a decode instance forgets a prefill whose role was rebuilt"),
    (f"{_MC}.unified_radix_cache:UnifiedRadixCache", TREE_CACHE_METHODS, "scheduler/kv.py (and on the live cache)"),
    (f"{_MC}.base_prefix_cache:MatchPrefixParams", ("key",), "scheduler/kv.py"),
    (f"{_MC}.base_prefix_cache:MatchResult", ("device_prefix_len", "last_device_node"), "scheduler/kv.py"),
    (f"{_MC}.base_prefix_cache:InsertParams", ("key", "value", "prev_prefix_len"), "scheduler/kv.py"),
    (f"{_MC}.base_prefix_cache:EvictParams", ("num_tokens",), "scheduler/kv.py"),
    (f"{_MC}.base_prefix_cache:EvictResult", ("num_tokens_evicted",), "scheduler/kv.py"),
    (f"{_MC}.memory_pool:ReqToTokenPool", ("req_to_token",), "scheduler/kv.py: a request's KV slots"),
    ("sglang.srt.disaggregation.decode:DecodeReqToTokenPool", ("req_to_token",), "the same, on a decode instance"),
    (f"{_MC}.allocator.base:BaseTokenToKVPoolAllocator", ("get_kvcache", "available_size", "alloc"),
     "scheduler/kv.py: KV occupancy, room for a loaded prefix"),
    (f"{_MC}.memory_pool:MHATokenToKVPool", ("k_buffer", "v_buffer", "page_size", "kv_cache_layout"),
     "kernels/sglang_pool.py: the pool's layout (k/v_scale_buffer are read with getattr there: unset on NPU)"),
    (f"{_MC}.memory_pool:MLATokenToKVPool", ("kv_buffer", "page_size"), "kernels/sglang_pool.py"),
    ("sglang.srt.utils.network:NetworkAddress", ("to_host_port_str",), "forget_prefill"),
    ("sglang.srt.utils.weight_versions:WeightVersionSpan", ("version", "start", "end"), "a record's weight spans"),
)


def resolve(target: str) -> Any:
    module, _, path = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise SGLangInternalsMismatch(f"{target}: SGLang has no module {module} ({e})") from None
    for part in path.split("."):
        if not hasattr(obj, part):
            raise SGLangInternalsMismatch(f"{target}: SGLang has no {part!r} here")
        obj = getattr(obj, part)
    return obj


# Constants whose values we rely on: (module:name, the value we assume, why).
CONSTANTS: tuple[tuple[str, Any, str], ...] = (
    ("sglang.srt.constants:HEALTH_CHECK_RID_PREFIX", "HEALTH_CHECK", "health-check requests are not counted as work"),
)


@functools.lru_cache(maxsize=None)
def _class_nodes(filename: str) -> dict[str, ast.ClassDef]:
    """The class definitions of one source file by qualified name (each file parsed once)."""
    with open(filename, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename)
    found: dict[str, ast.ClassDef] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                found[prefix + child.name] = child
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


@functools.lru_cache(maxsize=None)
def _assigned_on_self(klass: type) -> frozenset[str]:
    """Every ``self.<name>`` the source of ``klass`` itself assigns (in any method, on any code path)."""
    try:
        tree = _class_nodes(inspect.getsourcefile(klass) or "")[klass.__qualname__]
    except (OSError, TypeError, KeyError, SyntaxError):  # no Python source (a builtin or compiled class)
        return frozenset()
    names: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.args.args or any(
                isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list):
            continue
        me = fn.args.args[0].arg  # "self" (classmethods' "cls" assignments are class attributes: in dir() anyway)
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == me):
                names.add(node.attr)
            elif (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)
                  and ((isinstance(node.func, ast.Name) and node.func.id == "setattr"
                        and isinstance(node.args[0], ast.Name) and node.args[0].id == me)
                       or (isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"
                           and isinstance(node.args[0], ast.Name) and node.args[0].id == me))):
                names.add(node.args[1].value)
    return frozenset(names)


def instance_names(cls: type) -> frozenset[str]:
    """The attribute names an instance of ``cls`` has, read from the class (see the module docstring)."""
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    # msgspec.Struct, NamedTuple and pydantic fields (reflection on the class: absent on other kinds of class)
    for fields in (getattr(cls, "__struct_fields__", ()), getattr(cls, "_fields", ()) if issubclass(cls, tuple) else (),
                   getattr(cls, "model_fields", None)):
        if isinstance(fields, (tuple, dict)):
            names.update(fields)
    for klass in cls.__mro__:
        if klass is not object:
            names.update(vars(klass))  # what dir() leaves out (an Enum's methods)
            names.update(_assigned_on_self(klass))
    return frozenset(names)


def _signature_problem(target: str, expected: tuple[str, ...]) -> str | None:
    params = tuple(inspect.signature(resolve(target)).parameters)
    if params[: len(expected)] != expected:
        return f"{target}: parameters {params[:len(expected) + 2]}, expected {expected} first"
    return None


def class_level_problems() -> list[str]:
    """Every declared internal the installed SGLang lacks or has changed, one line each (empty: all present)."""
    problems: list[str] = []
    for target, why in CLASS_LEVEL:
        try:
            resolve(target)
        except SGLangInternalsMismatch as e:
            problems.append(f"{e} (used for: {why})")
    for target, attrs, why in INSTANCE_LEVEL:
        try:
            cls = resolve(target)
        except SGLangInternalsMismatch as e:
            problems.append(f"{e} (used for: {why})")
            continue
        names = instance_names(cls)
        problems += [f"{target}: an instance has no {a!r} (used for: {why})" for a in attrs if a not in names]
    for target, expected in SIGNATURES:
        try:
            problem = _signature_problem(target, expected)
        except (SGLangInternalsMismatch, TypeError, ValueError) as e:
            problem = str(e)
        if problem:
            problems.append(problem)
    for target, value, why in CONSTANTS:
        try:
            found = resolve(target)
        except SGLangInternalsMismatch as e:
            problems.append(f"{e} (used for: {why})")
            continue
        if found != value:
            problems.append(f"{target} is {found!r}, not {value!r} (used for: {why})")
    return problems


def _passed_stamp() -> Path | None:
    """Where a passed check of these declarations against this very SGLang installation is recorded: the key hashes
    the declarations, both versions and every SGLang source file's path, size and modification time (a stat each,
    ~20 ms), so any change to either side checks again. None when SGLang cannot be found."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    digest = hashlib.sha256(repr((CLASS_LEVEL, INSTANCE_LEVEL, SIGNATURES, CONSTANTS, WRITTEN_AGAINST,
                                  _installed_version())).encode())
    for directory, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            st = os.stat(os.path.join(directory, name))
            digest.update(f"{directory}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return cache_root() / "sglang-internals-checked" / digest.hexdigest()[:24]


def check_class_level() -> None:
    """Raise ``SGLangInternalsMismatch`` naming every declared internal the installed SGLang lacks.

    Parsing SGLang's sources takes ~2 s, in each of an instance's processes; a check that passed is recorded
    (``_passed_stamp``) and not repeated for the same declarations and the same installed files."""
    stamp = _passed_stamp()
    if stamp is not None and stamp.exists():
        return
    problems = class_level_problems()
    if problems:
        raise _mismatch(problems)
    if stamp is not None:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        except OSError:
            pass  # a read-only cache only costs the next process the same check


def check_instance(obj: Any, target: str) -> None:
    """A live object of a class declared in ``INSTANCE_LEVEL`` has every attribute declared for it."""
    declared = [a for t, attrs, _ in INSTANCE_LEVEL if t == target for a in attrs]
    missing = [a for a in declared if not hasattr(obj, a)]
    if missing:
        raise _mismatch(f"{target}: the live {type(obj).__name__} has no {a!r}" for a in missing)


def check_scheduler(scheduler: Any, role: str) -> None:
    """Per-instance attributes for the scheduler's current role (called at start and after every rebuild)."""
    missing = [a for a in SCHEDULER_ATTRIBUTES["any"] + SCHEDULER_ATTRIBUTES.get(role, ()) if not hasattr(scheduler, a)]
    if role in ("prefill", "decode"):
        queues = ("disagg_prefill_bootstrap_queue",) if role == "prefill" else (
            "disagg_decode_prealloc_queue", "disagg_decode_transfer_queue")
        missing += [f"{q}.queue" for q in queues if hasattr(scheduler, q) and not hasattr(getattr(scheduler, q), "queue")]
    missing += [f"tree_cache.{m}" for m in TREE_CACHE_METHODS
                if hasattr(scheduler, "tree_cache") and not hasattr(scheduler.tree_cache, m)]
    if role == "decode" and hasattr(scheduler, "disagg_decode_prealloc_queue"):
        manager = getattr(scheduler.disagg_decode_prealloc_queue, "kv_manager", None)
        missing += [f"disagg_decode_prealloc_queue.kv_manager.{a}"
                    for a in ("prefill_info_table", "connection_pool", "_handle_node_failure")
                    if not hasattr(manager, a)]
    if missing:
        raise _mismatch(f"the live {role} scheduler has no {m!r}" for m in missing)


def check_req(req: Any) -> None:
    missing = [a for a in REQ_ATTRIBUTES if not hasattr(req, a)]
    if missing:
        raise _mismatch(f"the live Req has no {a!r}" for a in missing)
