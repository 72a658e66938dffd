"""The one registry of every change sglang-prorsa makes to SGLang's behaviour.

Each override names its target, says why it exists, and records the SGLang version it was written against. Nothing
else in the package patches SGLang: code that needs a changed behaviour adds an entry here. ``apply_overrides()``
runs in every process that executes SGLang code (the launcher imports it at module load, and SGLang's spawned
scheduler processes re-import the launcher's main module), and refuses to run on any other SGLang version.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from sglang_prorsa.srt.common.pins import SGLANG_VERSION  # the pin's one source is requirements/base.txt (pins.py)

logger = logging.getLogger(__name__)


class SGLangVersionMismatch(RuntimeError):
    pass


@dataclass(frozen=True)
class Override:
    """One change to SGLang: ``target`` is ``module:attribute.path``; ``apply`` performs it and may check a condition."""

    name: str
    target: str
    reason: str
    apply: Callable[[], bool]
    sglang_version: str = SGLANG_VERSION
    kind: str = "patched attribute"


@dataclass
class OverrideRegistry:
    overrides: dict[str, Override] = field(default_factory=dict)
    applied: dict[str, bool] = field(default_factory=dict)

    def register(self, override: Override) -> Override:
        if override.name in self.overrides:
            raise ValueError(f"override {override.name!r} registered twice")
        self.overrides[override.name] = override
        return override

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": o.name, "target": o.target, "kind": o.kind, "reason": o.reason,
             "sglang_version": o.sglang_version, "applied": self.applied.get(o.name, False)}
            for o in self.overrides.values()
        ]


REGISTRY = OverrideRegistry()


def installed_sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def check_sglang_version() -> None:
    found = installed_sglang_version()
    if found != SGLANG_VERSION:
        raise SGLangVersionMismatch(
            f"sglang-prorsa's overrides were written against sglang=={SGLANG_VERSION}, but sglang=={found} is "
            f"installed; re-check every entry in sglang_prorsa/srt/instance/overrides.py before changing the pin"
        )


def resolve(target: str) -> tuple[Any, str]:
    """``'pkg.mod:Cls.attr'`` → (the object owning ``attr``, ``'attr'``)."""
    module, _, path = target.partition(":")
    owner: Any = importlib.import_module(module)
    *parents, attr = path.split(".")
    for p in parents:
        owner = getattr(owner, p)
    if not hasattr(owner, attr):
        raise AttributeError(f"override target {target} does not exist in this SGLang")
    return owner, attr


def set_attribute(target: str, value: Any) -> Callable[[], bool]:
    def _apply() -> bool:
        owner, attr = resolve(target)
        setattr(owner, attr, value)
        return True

    return _apply


def apply_overrides(*, only: set[str] | None = None) -> dict[str, bool]:
    """Apply every registered override once per process (idempotent), after checking every SGLang internal our
    extensions touch (``srt/common/sglang_internals.py``)."""
    check_sglang_version()
    from sglang_prorsa.srt.common.sglang_internals import check_class_level

    check_class_level()
    _register_builtin()
    for name, o in REGISTRY.overrides.items():
        if only is not None and name not in only:
            continue
        if not REGISTRY.applied.get(name):
            REGISTRY.applied[name] = bool(o.apply())
            logger.debug("override %s applied=%s", name, REGISTRY.applied[name])
    return dict(REGISTRY.applied)


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def _mooncake_host_tensor_indices() -> bool:
    # Only on machines without CUDA: on a GPU the fast path is right.
    if not _no_cuda():
        return False
    return set_attribute(
        "sglang.srt.disaggregation.mooncake.conn:MooncakeKVSender.supports_host_tensor_indices", False
    )()


def _add_scheduler_mixin() -> bool:
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_prorsa.srt.scheduler.extension import ProrsaSchedulerMixin

    for name, fn in vars(ProrsaSchedulerMixin).items():
        if not name.startswith("prorsa"):
            continue
        if name in vars(Scheduler):
            raise RuntimeError(f"Scheduler already has {name}: the Prorsa mixin would shadow SGLang")
        setattr(Scheduler, name, fn)
    return True


def wrap_method(owner: Any, name: str, make: Callable[[Callable], Callable], tag: str = "") -> bool:
    """Replace ``owner.name`` by ``make(original)`` once per process and ``tag``; the wrapper must call the original.
    Wrappers of one method with different tags stack (the one applied last runs first)."""
    original = getattr(owner, name)
    tags = getattr(original, "_prorsa_wrapped", frozenset())
    if tag in tags:
        return True
    wrapped = functools.wraps(original)(make(original))
    wrapped._prorsa_wrapped = frozenset(tags | {tag})
    setattr(owner, name, wrapped)
    return True


def _wrap_process_input_requests() -> bool:
    from sglang.srt.managers.scheduler import Scheduler

    def make(original):
        def process_input_requests(self, recv_reqs):
            self.prorsa_test_crash(recv_reqs)  # a no-op unless --prorsa-test-crash-on-tokens was given
            out = original(self, recv_reqs)
            # Between two forward passes: the only point where a busy switch may touch batches, queues and the pool.
            self.prorsa_poll()
            return out

        return process_input_requests

    return wrap_method(Scheduler, "process_input_requests", make)


def _wrap_run_batch() -> bool:
    from sglang.srt.managers.scheduler import Scheduler

    def make(original):
        def run_batch(self, batch, *args, **kwargs):
            if batch is not None and batch.forward_mode.is_extend() and batch.extend_num_tokens:
                self.prorsa_observe_extend(batch)
            return original(self, batch, *args, **kwargs)

        return run_batch

    return wrap_method(Scheduler, "run_batch", make)


# A KV budget far beyond any token budget: the pool is then sized by --max-total-tokens alone.
_UNBOUNDED_KV_BYTES = 1 << 50


def _wrap_cpu_kv_profile() -> bool:
    from sglang.srt.mem_cache import kv_cache_configurator as kvc

    def make(original):
        def _profile_available_bytes(self, pre_model_load_memory):
            try:
                return original(self, pre_model_load_memory)
            except ValueError as e:
                if str(self.device) != "cpu" or kvc.get_schedule().max_total_tokens is None:
                    raise
                logger.warning("CPU KV pool sized by --max-total-tokens=%d alone: free RAM fell while the weights "
                               "loaded (%s)", kvc.get_schedule().max_total_tokens, e)
                return _UNBOUNDED_KV_BYTES

        return _profile_available_bytes

    return wrap_method(kvc.KVCacheConfigurator, "_profile_available_bytes", make)


_HOST_ALLOC = "sglang.srt.mem_cache.pool_host.common"
# The parameters SGLang passes to every ALLOC_MEMORY_FUNCS entry (alloc_with_host_register's, in this order).
_HOST_ALLOC_PARAMS = ("dims", "dtype", "device", "pin_memory", "allocator")


def cpu_host_alloc(dims: tuple, dtype: Any, device: str, pin_memory: bool, allocator: Any,
                   registration_granularity_bytes: int | None = None) -> Any:
    """SGLang's host-buffer allocation for a CPU device: its own allocator's buffer, not registered with CUDA (there
    is no CUDA to register it with, and nothing copies it to a GPU). ``pin_memory`` is moot for the same reason."""
    if allocator is None:  # the callers of SGLang's pin-memory allocators pass none
        import torch

        return torch.empty(dims, dtype=dtype, device=device)
    return allocator.allocate(dims, dtype=dtype, device=device)


def host_alloc_problems() -> list[str]:
    """What in the installed SGLang differs from what ``cpu_host_alloc_without_cuda_register`` replaces (empty:
    nothing): the table is a defaultdict that falls back to ``alloc_with_host_register`` for "cpu", called with
    ``_HOST_ALLOC_PARAMS``, and the routed-experts capture buffer reads that very table."""
    import collections
    import inspect

    common = importlib.import_module(_HOST_ALLOC)
    from sglang.srt.state_capturer import base

    table = getattr(common, "ALLOC_MEMORY_FUNCS", None)
    register = getattr(common, "alloc_with_host_register", None)
    problems = []
    if not isinstance(table, collections.defaultdict) or register is None:
        return [f"{_HOST_ALLOC}: ALLOC_MEMORY_FUNCS is no defaultdict, or alloc_with_host_register is gone"]
    if table.default_factory is None or table.default_factory() is not register:
        problems.append(f"{_HOST_ALLOC}: ALLOC_MEMORY_FUNCS no longer falls back to alloc_with_host_register")
    if table.get("cpu", cpu_host_alloc) is not cpu_host_alloc:
        problems.append(f"{_HOST_ALLOC}: ALLOC_MEMORY_FUNCS has SGLang's own 'cpu' entry (this override is obsolete)")
    params = tuple(inspect.signature(register).parameters)
    if params[: len(_HOST_ALLOC_PARAMS)] != _HOST_ALLOC_PARAMS:
        problems.append(f"{_HOST_ALLOC}: alloc_with_host_register takes {params}, expected {_HOST_ALLOC_PARAMS} first")
    if getattr(base, "ALLOC_MEMORY_FUNCS", None) is not table:
        problems.append("sglang.srt.state_capturer.base: BaseHostCache no longer allocates through ALLOC_MEMORY_FUNCS")
    return problems


def _cpu_host_alloc() -> bool:
    # Checked on every machine (a changed SGLang fails loudly at start-up, GPU or not); applied only without CUDA,
    # where SGLang's default would call cudaHostRegister and fail.
    from sglang_prorsa.srt.common.sglang_internals import SGLangInternalsMismatch

    problems = host_alloc_problems()
    if problems:
        raise SGLangInternalsMismatch(
            f"the CPU host-buffer override was written against sglang {SGLANG_VERSION}, installed sglang "
            f"{installed_sglang_version()}:\n  " + "\n  ".join(problems)
            + "\nre-check cpu_host_alloc_without_cuda_register in sglang_prorsa/srt/instance/overrides.py")
    if not _no_cuda():
        return False
    importlib.import_module(_HOST_ALLOC).ALLOC_MEMORY_FUNCS["cpu"] = cpu_host_alloc
    return True


def _wrap_tokenizer_manager(method: str, hook: str, tag: str = "") -> bool:
    """Wrap ``TokenizerManager.<method>`` with the factory ``srt/engine/hooks.<hook>``."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from sglang_prorsa.srt.engine import hooks

    return wrap_method(TokenizerManager, method, getattr(hooks, hook), tag=tag)


def _wrap_control_method(name: str) -> bool:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from sglang_prorsa.srt.engine.control_guard import wrap_control

    return wrap_method(TokenizerManager, name, wrap_control(name))






_BUILTIN_DONE = False


def _register_builtin() -> None:
    global _BUILTIN_DONE
    if _BUILTIN_DONE:
        return
    _BUILTIN_DONE = True
    REGISTRY.register(Override(
        name="mooncake_sender_no_host_tensor_indices",
        target="sglang.srt.disaggregation.mooncake.conn:MooncakeKVSender.supports_host_tensor_indices",
        reason=(
            "With True the prefill side pins host memory and records torch.cuda.Event()s for the KV indices, "
            "which crashes on a machine without CUDA; False keeps the plain path, and KV still moves over TCP."
        ),
        apply=_mooncake_host_tensor_indices,
    ))
    REGISTRY.register(Override(
        name="cpu_kv_pool_sized_by_tokens",
        target="sglang.srt.mem_cache.kv_cache_configurator:KVCacheConfigurator._profile_available_bytes",
        kind="wrapped method",
        reason=(
            "On CPU SGLang measures free RAM machine-wide before and after loading the weights and refuses to start "
            "when it fell by more than the static fraction; several instances loading on one host at once make it "
            "fall (a CI start failed at --mem-fraction-static 0.97 with 2 % of the earlier free RAM left). With "
            "--max-total-tokens given the pool is sized by tokens anyway, so on CPU that refusal is replaced by a "
            "warning and the token budget; on a GPU, or without a token budget, SGLang's check stands."
        ),
        apply=_wrap_cpu_kv_profile,
    ))
    REGISTRY.register(Override(
        name="cpu_host_alloc_without_cuda_register",
        target=f"{_HOST_ALLOC}:ALLOC_MEMORY_FUNCS",
        kind="table entry (added)",
        reason=(
            "SGLang allocates its host buffers through ALLOC_MEMORY_FUNCS[device], whose fallback pins the buffer "
            "with cudaHostRegister; on a machine without CUDA that fails, so --enable-return-routed-experts (whose "
            "capture buffer is such a host buffer) could not start on CPU. Without CUDA the 'cpu' entry allocates "
            "with SGLang's own allocator and registers nothing; on a GPU SGLang's table stands. The table, its "
            "fallback and the parameters SGLang passes are checked at start-up (host_alloc_problems)."
        ),
        apply=_cpu_host_alloc,
    ))
    REGISTRY.register(Override(
        name="scheduler_prorsa_mixin",
        target="sglang.srt.managers.scheduler:Scheduler",
        kind="mixin (added methods)",
        reason=(
            "Busy-instance switching needs code inside the scheduler process: take requests off keeping their tokens, "
            "export their KV to the store, release the halves of PD pairs that moved, load a persisted prefix into "
            "the radix cache, report counters and busy intervals. Only new prorsa_* methods are added; none of "
            "SGLang's is replaced (srt/scheduler/extension.py)."
        ),
        apply=_add_scheduler_mixin,
    ))
    REGISTRY.register(Override(
        name="scheduler_poll_prorsa_control",
        target="sglang.srt.managers.scheduler:Scheduler.process_input_requests",
        kind="wrapped method",
        reason=(
            "Our control messages must be answered from the scheduler's event loop between two forward passes, "
            "where SGLang handles its own control requests; the wrapper runs SGLang's method unchanged, then polls "
            "our channel and records busy/idle transitions for the busy-interval counters (θ)."
        ),
        apply=_wrap_process_input_requests,
    ))
    REGISTRY.register(Override(
        name="scheduler_count_computed_prompt_tokens",
        target="sglang.srt.managers.scheduler:Scheduler.run_batch",
        kind="wrapped method",
        reason=(
            "Counts the prompt tokens each extend pass really computes (prefix-cache and store hits excluded), "
            "which is how a resume shows it recomputed at most one page; SGLang's method runs unchanged."
        ),
        apply=_wrap_run_batch,
    ))
    REGISTRY.register(Override(
        name="tokenizer_manager_hand_on_at_arrival",
        target="sglang.srt.managers.tokenizer_manager:TokenizerManager.generate_request",
        kind="wrapped method",
        reason=(
            "A request reaching an instance that is switching roles (or closed, or meant for the other role) is "
            "handed on at arrival instead of entering its scheduler; otherwise SGLang's method runs unchanged. The "
            "wrapper also counts requests on their way to the scheduler for the switch's quiet check "
            "(srt/engine/hooks.py)."
        ),
        apply=functools.partial(_wrap_tokenizer_manager, "generate_request", "wrap_generate_request"),
    ))
    REGISTRY.register(Override(
        name="tokenizer_manager_refuse_scheduler_crashers",
        target="sglang.srt.managers.tokenizer_manager:TokenizerManager.generate_request",
        kind="wrapped method",
        reason=(
            "SGLang sends some malformed generation requests on to the scheduler, where they raise and kill it with "
            "every request it holds (a list bootstrap_room on a single prompt, token ids outside the vocabulary, a "
            "per-prompt field given as a list on a single prompt, top_logprobs_num above the vocabulary); others end "
            "in a 500 (a sampling parameter of the wrong type). The wrapper refuses them first, a ValueError that "
            "SGLang's routes answer with 400 naming the field, on every instance and route, then runs SGLang's method "
            "unchanged (srt/engine/request_guard.py). Applied after hand_on_at_arrival, so it runs first."
        ),
        apply=functools.partial(_wrap_tokenizer_manager, "generate_request", "wrap_generate_request_guard",
                                tag="guard"),
    ))
    REGISTRY.register(Override(
        name="tokenizer_manager_refuse_empty_tokenized_prompt",
        target="sglang.srt.managers.tokenizer_manager:TokenizerManager._validate_one_request",
        kind="wrapped method",
        reason=(
            "A text prompt that tokenizes to no tokens (\"\" without a BOS token, alone or inside a batch) reaches "
            "the scheduler as a 0-token prefill, whose forward raises and kills it (found by the generation fuzz). "
            "SGLang calls this method for every tokenized prompt, single or batched; the wrapper refuses an empty "
            "one with a 400 naming the field, then runs SGLang's method unchanged (srt/engine/request_guard.py)."
        ),
        apply=functools.partial(_wrap_tokenizer_manager, "_validate_one_request", "wrap_validate_one_request"),
    ))
    REGISTRY.register(Override(
        name="tokenizer_manager_resume_in_engine",
        target="sglang.srt.managers.tokenizer_manager:TokenizerManager._stream_one_response",
        kind="wrapped method",
        reason=(
            "Busy switching behind any router: a request taken off this instance ends in an abort, and the caller "
            "(HTTP, OpenAI routes, streaming, in-process) is still waiting here; the wrapper continues it on another "
            "pair from its persisted KV and gives the caller the stitched outputs instead of the abort. Outputs of "
            "every other request pass through unchanged (srt/engine/hooks.py). While the continuation runs on other "
            "instances the request gives back its reader lock on this instance's model_update_lock (this scheduler "
            "no longer has it): held, an update or pause here would wait on work elsewhere, and SGLang's writer-"
            "preferring lock then deadlocks across instances."
        ),
        apply=functools.partial(_wrap_tokenizer_manager, "_stream_one_response", "wrap_stream_one_response"),
    ))
    REGISTRY.register(Override(
        name="tokenizer_manager_keep_prompt_ids",
        target="sglang.srt.managers.tokenizer_manager:TokenizerManager._tokenize_one_request",
        kind="wrapped method",
        reason=(
            "A text prompt's token ids are needed after SGLang tokenized it (a trajectory's arrival report, a "
            "decode half restarted from its prompt, an aborted answer's prompt_tokens): the wrapper keeps SGLang's "
            "own ids on the request object so they are not tokenized a second time on the event loop; SGLang's "
            "method runs unchanged (srt/engine/hooks.py)."
        ),
        apply=functools.partial(_wrap_tokenizer_manager, "_tokenize_one_request", "wrap_tokenize_one_request"),
    ))
    from sglang_prorsa.srt.engine.control_guard import GUARDED

    for method in GUARDED:
        REGISTRY.register(Override(
            name=f"tokenizer_manager_{method}_vs_switch",
            target=f"sglang.srt.managers.tokenizer_manager:TokenizerManager.{method}",
            kind="wrapped method",
            reason=(
                f"{method} must never interleave with this instance's busy switch (issue 13): it runs under the lock "
                "the switch holds (and a pause or a memory release holds switches until its counterpart). SGLang's "
                "method runs unchanged (srt/engine/control_guard.py)."
                + (" An update whose flush SGLang refused (a health check or a transfer in flight) records its "
                   "weight version and is flushed by SGLang's deferred flush once the instance is idle."
                   if method.startswith("update_weights_from") else "")
            ),
            apply=functools.partial(_wrap_control_method, method),
        ))
