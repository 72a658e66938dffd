"""slime's hook points, wrapped so a rollout sends lifecycle hints to the front without changing slime.

slime calls ``await generate(args, sample, sampling_params)`` (``--custom-generate-function-path``; ``evaluation=``
too when the function takes it) and ``await reward(args, sample, **kwargs)`` (``--custom-rm-path``; a list of samples
under ``--group-rm``). Wrap your own two functions in a module of yours and point slime's flags at the wrappers::

    from sglang_prorsa.integrations.slime import SlimeHints, current_trajectory, post_generate
    hints = SlimeHints()                 # hints go to http://{sglang_router_ip}:{sglang_router_port}: the front
    generate = hints.generate(my_generate)
    reward = hints.reward(my_reward)

The generate wrapper sends ``sampled`` when a sample starts, ``aborted`` when the function raises (slime cancels
pending samples at the end of a rollout) or returns the sample ``ABORTED``; the reward wrapper sends
``reward_start`` / ``reward_end``. Inside ``my_generate``, ``post_generate(args, payload)`` replaces slime's
``post(url, payload)`` and adds ``X-Trajectory-Id`` (or pass ``trajectory_headers()`` to your own HTTP call), and
``with current_trajectory().tool("bash") as call:`` sends ``tool_start`` / ``tool_end``.

The trajectory id is slime's own per-sample ``session_id`` (slime sets one for every sample of a group, and sends it
as ``X-SMG-Routing-Key`` under consistent hashing, which the front also reads as the id), else a fresh one; it is kept
in ``sample.metadata["prorsa_trajectory_id"]``. A sample generated again after an abort (partial rollout) is a new
trajectory. Samples are duck-typed (``session_id``, ``group_index``, ``tokens``, ``status``, ``reward``,
``metadata``): slime is never imported.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from contextvars import ContextVar
from typing import Any, Awaitable, Callable

from sglang_prorsa.client import TRAJECTORY_ID_HEADER, AsyncProrsaClient, AsyncTrajectory, HintConfig
from sglang_prorsa.client.errors import ProrsaClientError
from sglang_prorsa.client.generation import parse_generation
from sglang_prorsa.client.trajectory import new_trajectory_id

META_KEY = "prorsa_trajectory_id"
_CURRENT: ContextVar[AsyncTrajectory | None] = ContextVar("prorsa_slime_trajectory", default=None)


def router_url(args: Any) -> str:
    """Where slime sends its generation requests (``--sglang-router-ip`` / ``--sglang-router-port``)."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


def is_aborted(sample: Any) -> bool:
    """slime's ``Sample.Status.ABORTED`` (an enum whose name, or a plain string, says it)."""
    status = getattr(sample, "status", None)
    return str(getattr(status, "name", status)).lower().endswith("aborted")


class SlimeHints:
    """The hint side of one rollout: a client per event loop (slime runs its rollout on one background loop), and
    the live trajectories by id, shared by the generate and reward wrappers made from this object."""

    def __init__(self, hints_url: str | None = None, *, task: str | None = None,
                 hints: HintConfig | None = None) -> None:
        self.hints_url = hints_url  # None: the router slime generates through (our front)
        self.task = task
        self.hint_config = hints
        self.live: dict[str, AsyncTrajectory] = {}
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def client(self, args: Any) -> AsyncProrsaClient:
        """This loop's client for ``args``'s router (created on first use)."""
        per_loop = self._clients.setdefault(asyncio.get_running_loop(), {})
        url = router_url(args)
        if url not in per_loop:
            per_loop[url] = AsyncProrsaClient(url, hints_url=self.hints_url or url, hints=self.hint_config)
        return per_loop[url]

    def trajectory(self, args: Any, sample: Any) -> AsyncTrajectory:
        """The sample's live trajectory, or a new one (``sampled`` is sent then)."""
        meta = _metadata(sample)
        tid = meta.get(META_KEY)
        if tid in self.live:
            return self.live[tid]
        # A stored id whose trajectory ended (aborted) is not reused: the sample starts again, as a new trajectory.
        tid = new_trajectory_id("slime") if tid else (getattr(sample, "session_id", None) or new_trajectory_id("slime"))
        meta[META_KEY] = tid
        group = getattr(sample, "group_index", None)
        tokens = getattr(sample, "tokens", None)
        t = self.client(args).trajectory(self.task, trajectory_id=tid, group_id=None if group is None else str(group),
                                         prompt_tokens=len(tokens) if tokens else None)
        t.sampled()
        self.live[tid] = t
        return t

    def generate(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """``fn`` with hints, for ``--custom-generate-function-path`` (same signature: slime inspects it)."""

        @functools.wraps(fn)
        async def generate(args: Any, sample: Any, sampling_params: dict, **kwargs: Any) -> Any:
            t = self.trajectory(args, sample)
            token = _CURRENT.set(t)
            try:
                result = await fn(args, sample, sampling_params, **kwargs)
            except BaseException:  # CancelledError too: slime cancels pending samples when it aborts a rollout
                self._end(t)
                raise
            finally:
                _CURRENT.reset(token)
            outs = result if isinstance(result, list) else [result]
            if is_aborted(sample) or any(is_aborted(s) for s in outs):
                self._end(t)
            elif all(getattr(s, "reward", None) is not None for s in outs):
                # Rewarded inside generate: slime will not call the reward function for it.
                t.reward_start()
                self._end(t, rewarded=True)
            return result

        return generate

    def reward(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """``fn`` with ``reward_start`` / ``reward_end`` around it, for ``--custom-rm-path`` (one sample or a group)."""

        @functools.wraps(fn)
        async def reward(args: Any, samples: Any, **kwargs: Any) -> Any:
            group = samples if isinstance(samples, list) else [samples]
            known = [self.live[tid] for tid in (_metadata(s).get(META_KEY) for s in group) if tid in self.live]
            for t in known:
                t.reward_start()
            try:
                value = await fn(args, samples, **kwargs)
            except BaseException:
                for t in known:
                    self._end(t)
                raise
            for t in known:
                self._end(t, rewarded=True)
            return value

        return reward

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Deliver every hint queued on this loop (e.g. before the trainer's step); True once all are settled."""
        per_loop = self._clients.get(asyncio.get_running_loop(), {})
        return all([await c.flush_hints(timeout_s) for c in per_loop.values()])

    def _end(self, t: AsyncTrajectory, rewarded: bool = False) -> None:
        self.live.pop(t.trajectory_id, None)
        if rewarded:
            t.reward_end()
        else:
            t.abort()


def _metadata(sample: Any) -> dict:
    meta = getattr(sample, "metadata", None)
    if not isinstance(meta, dict):
        meta = {}
        sample.metadata = meta
    return meta


def current_trajectory() -> AsyncTrajectory:
    """The trajectory of the sample whose wrapped generate function is running (for ``tool(...)`` and friends)."""
    t = _CURRENT.get()
    if t is None:
        raise LookupError("no slime sample is being generated here: call this inside a SlimeHints.generate wrapper")
    return t


def trajectory_headers() -> dict[str, str]:
    """``{"X-Trajectory-Id": id}`` inside a wrapped generate function, else ``{}``: add it to each ``/generate``."""
    t = _CURRENT.get()
    return {TRAJECTORY_ID_HEADER: t.trajectory_id} if t is not None else {}


async def post_generate(args: Any, payload: dict) -> Any:
    """slime's ``post(router + "/generate", payload)`` with this sample's ``X-Trajectory-Id``: the answer's JSON, as
    SGLang sent it (an HTTP error raises ``ProrsaHTTPError``). Counts the turn and the context length for the next
    hints (``tool_end``'s prompt estimate)."""
    t = current_trajectory()
    started = time.perf_counter()
    answer = await t._client.post_json("/generate", payload, headers=trajectory_headers(), base=router_url(args))
    try:
        t._record(parse_generation(answer, t.trajectory_id, time.perf_counter() - started))
    except ProrsaClientError:  # not a single prompt's answer (a batch): the turn is not counted, the answer stands
        pass
    return answer
