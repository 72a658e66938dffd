"""verl's agent loop, wrapped so each episode sends lifecycle hints, with verl's own generation path unchanged.

verl 0.9.1's ``AgentLoopWorker`` builds one agent loop per sample with ``hydra.utils.instantiate`` (the loop's entry in
the agent-loop registry, plus ``trainer_config``, ``server_manager``, ``tokenizer``, ``processor``, ``dataset_cls``,
``data_config``, ``hf_model_type``, ``tools``) and awaits ``loop.run(sampling_params, **sample_fields)``. Register
``ProrsaAgentLoop`` in the file named by ``actor_rollout_ref.rollout.agent.agent_loop_config_path``; the keys beside
``name`` and ``_target_`` reach its constructor::

    - name: prorsa_tool_agent
      _target_: sglang_prorsa.integrations.verl.ProrsaAgentLoop
      hints_url: http://front:30000                     # required: where hints go
      agent_loop: verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop   # the loop that runs (the default)

The wrapper builds the named loop with the same arguments and hands it verl's server manager wrapped by
``HintedServerManager``: every ``generate`` still goes through verl's manager (its load balancing, its in-process
SGLang server); the wrapper only adds hints, and the trajectory id as described below. It sends ``sampled`` when an
episode starts, ``tool_start`` / ``tool_end`` around each tool phase of a loop shaped like verl's ``ToolAgentLoop``
(its ``_handle_processing_tools_state``; other loops bracket their own tools and sandboxes with
``current_trajectory()``), and ``aborted`` when ``run`` raises or is cancelled. ``hints_url`` is read from the
loop's config entry only (never from the environment); an entry without it is a ``ValueError`` naming the key.

The reward: verl scores an episode after ``run`` returns, in the same worker, when the rollout streams rewards (no
reward model, or one with its own resource pool: ``AgentLoopWorker._compute_score``), by assigning the returned
output's ``reward_score``. The wrapper sends ``reward_start`` when ``run`` returns and ``reward_end`` at that
assignment (the output's class is swapped for a subclass that notices it, and restored then); an output that is
released unscored sends ``aborted``. Where verl scores later, in the trainer (a reward model sharing the actor's
GPUs), or where the loop already set ``reward_score``, both reward hints are sent when ``run`` returns.

The trajectory id and the engine: verl's ``SGLangHttpServer.generate`` builds the ``GenerateReqInput`` from a fixed
set of fields (``rid``, ``input_ids``, ``sampling_params``, ``return_logprob``, ``image_data``, ``video_data``; its
signature takes no others), and ``rid`` is a fresh uuid per turn; none of the fields the engine reads as the
trajectory id (``session_id``, ``routing_key``, ``conversation_id``, ``trajectory_id``) gets through. The one thing
it passes on as given is the sampling-params dict, so the wrapper adds the id as
``sampling_params["custom_params"]["prorsa_trajectory_id"]`` (``engine_api.TRAJECTORY_ID_PARAM``; SGLang's own field
for per-request values of custom logit processors, carried and otherwise unused). Any sglang-prorsa engine reads the
carried id itself -- ``sglang_prorsa.engine.Engine`` in verl's process in place of SGLang's ``Engine``, or an
instance behind the front -- and strips it before sampling, so the scheduler sees verl's sampling params exactly
(``session_id`` is left unset: SGLang would take the request for one of its sessions). ``carry_id: false`` sends verl's requests unchanged. With ``report_requests`` (on by
default: verl's stock SGLang does not report) the wrapper also reports ``request_arrived`` / ``prefill_end`` /
``decode_end`` around each ``generate``, stamped on the worker's clock; turn it off where verl's servers run a
sglang-prorsa engine, which reports them itself under the carried id.

The trajectory id is ``verl-<process>-<uid>-<index>``: verl's per-prompt ``uid`` (the GRPO group; every member of a
group carries the same one), the member's index among this process's episodes of that uid, and a token of this
process (a group may be split across agent-loop workers). It is put in ``output.extra_fields["prorsa_trajectory_id"]``.
Hints go to ``hints_url`` through one ``AsyncProrsaClient`` per event loop and URL, queued and never awaited by
generation; each episode's end asks for delivery at once. verl is never imported here: its objects are duck-typed.
"""

from __future__ import annotations

import asyncio
import importlib
import time
import uuid
import weakref
from collections import OrderedDict
from contextvars import ContextVar
from typing import Any, Callable, Mapping

from sglang_prorsa.client import AsyncProrsaClient, AsyncTrajectory, HintConfig
from sglang_prorsa.client.errors import ProrsaClientError
from sglang_prorsa.client.generation import Generation
from sglang_prorsa.policy.lifecycle.engine_api import TRAJECTORY_ID_PARAM
from sglang_prorsa.policy.lifecycle.events import MAX_ID_CHARS

OUTPUT_KEY = "prorsa_trajectory_id"  # in AgentLoopOutput.extra_fields
DEFAULT_AGENT_LOOP = "verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop"
REWARD_MODES = ("auto", "after_run", "run_end")

_CURRENT: ContextVar[AsyncTrajectory | None] = ContextVar("prorsa_verl_trajectory", default=None)
_PROCESS = uuid.uuid4().hex[:6]
_MAX_GROUPS = 4096
_GROUPS: OrderedDict[str, int] = OrderedDict()  # uid -> episodes started here (verl builds one loop per sample)
_CLIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> {(url, HintConfig): client}
_SCORED: dict[type, type] = {}  # output class -> its subclass that notices the reward assignment
_UNSCORED: dict[int, tuple[AsyncTrajectory, type, Any]] = {}  # id(output) -> (trajectory, class, finalizer)


def current_trajectory() -> AsyncTrajectory:
    """The trajectory of the episode running here (inside ``ProrsaAgentLoop.run``), for ``tool(...)``,
    ``sandbox(...)`` and ``reward()`` spans in a loop of your own."""
    t = _CURRENT.get()
    if t is None:
        raise LookupError("no verl episode is running here: call this inside ProrsaAgentLoop.run")
    return t


# ----- the trajectory id on verl's requests -----

def with_trajectory_id(sampling_params: Mapping[str, Any], trajectory_id: str) -> dict[str, Any]:
    """A copy of verl's sampling params carrying ``trajectory_id`` in ``custom_params[TRAJECTORY_ID_PARAM]``, where
    the engine reads it (``engine_api.carried_id``) and strips it (``strip_carried_id``) before sampling. The
    caller's dict is left as it was: verl reuses it for every turn."""
    out = dict(sampling_params)
    custom = dict(out.get("custom_params") or {})
    custom[TRAJECTORY_ID_PARAM] = trajectory_id
    out["custom_params"] = custom
    return out


# ----- hints around verl's generation -----

class HintedServerManager:
    """verl's server manager with the running episode's hints around each ``generate``; every other attribute is the
    wrapped manager's. The call goes to verl's manager with the same arguments, the sampling params carrying the
    trajectory id when ``carry_id``."""

    def __init__(self, server_manager: Any, *, carry_id: bool = True, report_requests: bool = True) -> None:
        self._prorsa_manager = server_manager
        self._prorsa_carry_id = carry_id
        self._prorsa_report = report_requests

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        """verl's ``generate(request_id, *, prompt_ids, sampling_params, ...)``, forwarded as it was called."""
        t = _CURRENT.get()
        if t is None or t.finished:
            return await self._prorsa_manager.generate(*args, **kwargs)
        tid = t.trajectory_id
        client = t._client
        prompt_tokens = _length(kwargs.get("prompt_ids"))
        if self._prorsa_carry_id and isinstance(kwargs.get("sampling_params"), Mapping):
            kwargs["sampling_params"] = with_trajectory_id(kwargs["sampling_params"], tid)
        if self._prorsa_report:
            client._report(tid, "request_arrived", prompt_tokens=prompt_tokens or 0)
        if not client._buffer.drained:  # this turn's hints (tool_end) go out beside the request, not after it
            client._sender.notify(urgent=True)
        started = time.perf_counter()
        out = await self._prorsa_manager.generate(*args, **kwargs)
        token_ids = list(getattr(out, "token_ids", None) or [])
        if self._prorsa_report and not t.finished:
            client._report(tid, "prefill_end")
            client._report(tid, "decode_end", output_tokens=len(token_ids))
        cached = (getattr(out, "extra_fields", None) or {}).get("num_cached_tokens")
        t._record(Generation(output_ids=token_ids, text="", output_logprobs=getattr(out, "log_probs", None),
                             prompt_tokens=prompt_tokens or 0, completion_tokens=len(token_ids),
                             cached_tokens=int(cached or 0), finish_reason=getattr(out, "stop_reason", None),
                             weight_version=None, trajectory_id=tid, latency_s=time.perf_counter() - started))
        return out

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_prorsa_"):
            raise AttributeError(name)
        return getattr(self._prorsa_manager, name)


def bracket_tool_phases(agent_loop: Any) -> bool:
    """Send ``tool_start`` / ``tool_end`` around each ``_handle_processing_tools_state(agent_data)`` of
    ``agent_loop`` (verl's ``ToolAgentLoop`` and loops of its shape; this instance only, idempotent). ``tool`` names
    the phase's tool calls; ``tool_end`` carries the prompt length after the tool responses were merged. False if the
    loop has no such method."""
    original = getattr(agent_loop, "_handle_processing_tools_state", None)
    if original is None:
        return False
    if getattr(original, "_prorsa_brackets", False):
        return True
    max_calls = getattr(agent_loop, "max_parallel_calls", None)

    async def processing_tools(agent_data: Any, *args: Any, **kwargs: Any) -> Any:
        t = _CURRENT.get()
        if t is None or t.finished:
            return await original(agent_data, *args, **kwargs)
        before = _length(getattr(agent_data, "prompt_ids", None))
        t.tool_start(_tool_name(getattr(agent_data, "tool_calls", None), max_calls))
        try:
            return await original(agent_data, *args, **kwargs)
        finally:
            if not t.finished:
                after = _length(getattr(agent_data, "prompt_ids", None))
                t.tool_end(result_tokens=None if before is None or after is None else max(0, after - before),
                           prompt_tokens=after)

    processing_tools._prorsa_brackets = True  # type: ignore[attr-defined]
    agent_loop._handle_processing_tools_state = processing_tools
    return True


def _length(ids: Any) -> int | None:
    try:
        return len(ids)
    except TypeError:
        return None


def _tool_name(calls: Any, max_calls: Any) -> str | None:
    names = []
    for call in list(calls or [])[: max_calls if isinstance(max_calls, int) and max_calls > 0 else None]:
        name = getattr(call, "name", None)
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return ",".join(names)[:MAX_ID_CHARS] or None


# ----- the reward, when verl scores after run() -----

def reward_mode(trainer_config: Any) -> str:
    """``after_run`` when verl scores each episode in its agent-loop worker after ``run`` returns (it hands the worker
    reward-loop handles unless a reward model shares the actor's GPUs: ``reward.reward_model.enable`` and not
    ``enable_resource_pool``), else ``run_end``."""
    rm = _get(_get(trainer_config, "reward"), "reward_model")
    enabled = bool(_get(rm, "enable", False))
    return "after_run" if not enabled or bool(_get(rm, "enable_resource_pool", False)) else "run_end"


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def await_reward(output: Any, t: AsyncTrajectory) -> bool:
    """Send ``reward_end`` when ``output.reward_score`` is assigned (verl's ``_compute_score`` does
    ``final_output.reward_score = result["reward_score"]``), ``aborted`` if the output is released unscored. False
    (nothing armed) when the output's class cannot be swapped."""
    base = type(output)
    try:
        scored = _SCORED.get(base) or _SCORED.setdefault(base, _scored_subclass(base))
        object.__setattr__(output, "__class__", scored)
    except TypeError:  # a class with its own layout (__slots__): the trajectory is closed by the caller
        return False
    key = id(output)
    try:
        finalizer = weakref.finalize(output, _released_unscored, key)
    except TypeError:
        finalizer = None
    _UNSCORED[key] = (t, base, finalizer)
    return True


def _scored_subclass(base: type) -> type:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        base.__setattr__(self, name, value)
        if name == "reward_score":
            _reward_assigned(self)

    return type(base.__name__, (base,), {"__setattr__": __setattr__, "__module__": __name__,
                                         "__qualname__": f"ProrsaScored{base.__name__}"})


def _reward_assigned(output: Any) -> None:
    t, base, finalizer = _UNSCORED.pop(id(output), (None, None, None))
    if base is not None:
        object.__setattr__(output, "__class__", base)  # verl's own class again from here on
    if finalizer is not None:
        finalizer.detach()
    if t is not None and not t.finished:
        _close(t, rewarded=True, started=True)


def _released_unscored(key: int) -> None:
    t, _, _ = _UNSCORED.pop(key, (None, None, None))
    if t is not None and not t.finished:
        try:
            _close(t, rewarded=False)
        except (ProrsaClientError, RuntimeError):  # not on the client's loop (interpreter exit): nothing to send
            pass


def _close(t: AsyncTrajectory, *, rewarded: bool, started: bool = False) -> None:
    if rewarded:
        if not started:
            t.reward_start()
        t.reward_end()
    else:
        t.abort()
    t._client._sender.notify(urgent=True)  # the episode ended: deliver now, without waiting for the batch window


# ----- the agent loop -----

def _resolve(target: Any) -> Callable[..., Any]:
    if isinstance(target, str):
        module, _, name = target.rpartition(".")
        return getattr(importlib.import_module(module), name)
    if callable(target):
        return target
    raise TypeError(f"agent_loop must be a class, a factory or a dotted path, got {type(target).__name__}")


def _hint_config(hints: Any) -> HintConfig | None:
    if hints is None or isinstance(hints, HintConfig):
        return hints
    return HintConfig(**{str(k): v for k, v in dict(hints).items()})


def client_for(hints_url: str, hints: HintConfig | None = None) -> AsyncProrsaClient:
    """This event loop's hint client for ``hints_url`` (created on first use; verl runs every episode of an
    agent-loop worker on one loop)."""
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (hints_url, hints)
    if key not in per_loop:
        per_loop[key] = AsyncProrsaClient(hints_url, hints=hints)
    client: AsyncProrsaClient = per_loop[key]
    return client


def clients() -> list[AsyncProrsaClient]:
    """The hint clients of this event loop."""
    return list(_CLIENTS.get(asyncio.get_running_loop(), {}).values())


async def flush(timeout_s: float = 5.0) -> bool:
    """Deliver every hint queued on this event loop; True once all are settled."""
    return all([await c.flush_hints(timeout_s) for c in clients()])


async def aclose() -> None:
    """Deliver what is queued and close this event loop's clients."""
    for client in _CLIENTS.pop(asyncio.get_running_loop(), {}).values():
        await client.aclose()


class ProrsaAgentLoop:
    """A verl agent loop (``run(sampling_params, **kwargs) -> AgentLoopOutput``) that runs ``agent_loop`` with
    lifecycle hints. Constructor keywords beside verl's come from the loop's entry in the agent-loop config:

    - ``agent_loop``: the loop to run, a dotted path (default verl's ``ToolAgentLoop``), a class or a factory; it gets
      every other keyword, with ``server_manager`` wrapped;
    - ``hints_url`` (required): where hints go (the front, or a control plane); ``task``: the hints' task name;
    - ``carry_id`` (true): the trajectory id in each request's sampling params, for the engine to read;
      ``report_requests`` (true): the request events reported from here (off where the engine reports them);
    - ``reward``: ``auto`` (``after_run`` or ``run_end``, from verl's config as ``reward_mode`` reads it),
      ``after_run`` or ``run_end``; ``bracket_tools`` (true): tool hints around ``ToolAgentLoop``'s tool phases;
    - ``hints``: ``HintConfig`` fields (a mapping).
    """

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any = None, *,
                 agent_loop: Any = DEFAULT_AGENT_LOOP, hints_url: str | None = None, task: str | None = None,
                 carry_id: bool = True, report_requests: bool = True, reward: str = "auto",
                 bracket_tools: bool = True, hints: Any = None, **kwargs: Any) -> None:
        if not hints_url:
            raise ValueError("field 'hints_url': required; set it in the loop's entry of the agent-loop config "
                             "(actor_rollout_ref.rollout.agent.agent_loop_config_path)")
        if reward not in REWARD_MODES:
            raise ValueError(f"field 'reward': one of {list(REWARD_MODES)}, got {reward!r}")
        self.hints_url = str(hints_url)
        self.task = task
        self.hint_config = _hint_config(hints)
        self.config = getattr(trainer_config, "config", trainer_config)
        self.reward = reward_mode(self.config) if reward == "auto" else reward
        self.server_manager = HintedServerManager(server_manager, carry_id=carry_id, report_requests=report_requests)
        self.inner = _resolve(agent_loop)(trainer_config=trainer_config, server_manager=self.server_manager,
                                          tokenizer=tokenizer, processor=processor, **kwargs)
        if bracket_tools:
            bracket_tool_phases(self.inner)

    def __getattr__(self, name: str) -> Any:  # the running loop's own attributes
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def next_ids(self, kwargs: Mapping[str, Any]) -> tuple[str, str]:
        """``(trajectory id, group id)`` of a new episode: verl's ``uid`` names the group (else ``index``, else a
        fresh key: a group of one), the member index counts this process's episodes of it."""
        key = kwargs.get("uid")
        if key is None:
            key = kwargs.get("index")
        key = str(key) if key is not None else uuid.uuid4().hex[:12]
        index = _GROUPS.pop(key, 0)
        _GROUPS[key] = index + 1
        while len(_GROUPS) > _MAX_GROUPS:
            _GROUPS.popitem(last=False)
        group_id = f"verl-{_PROCESS}-{key}"[: MAX_ID_CHARS - 8]
        return f"{group_id}-{index}", group_id

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        tid, group_id = self.next_ids(kwargs)
        ids = kwargs.get("prompt_ids")
        t = client_for(self.hints_url, self.hint_config).trajectory(
            self.task, trajectory_id=tid, group_id=group_id,
            prompt_tokens=len(ids) if isinstance(ids, (list, tuple)) else None)
        t.sampled()
        token = _CURRENT.set(t)
        try:
            output = await self.inner.run(sampling_params, **kwargs)
        except BaseException:  # CancelledError too
            _close(t, rewarded=False)
            raise
        finally:
            _CURRENT.reset(token)
        extra = getattr(output, "extra_fields", None)
        if isinstance(extra, dict):
            extra[OUTPUT_KEY] = tid
        if t.finished:  # the loop bracketed its reward itself (current_trajectory().reward())
            t._client._sender.notify(urgent=True)
        elif getattr(output, "reward_score", None) is not None or self.reward == "run_end":
            _close(t, rewarded=True)
        else:
            t.reward_start()
            if not await_reward(output, t):
                _close(t, rewarded=True, started=True)
        return output
