"""AReaL's rollout workflow, wrapped so each episode sends lifecycle hints and its requests carry a trajectory id,
without changing AReaL.

AReaL runs ``await workflow.arun_episode(engine, data)`` once per sample: its executor sets the workflow context
(``areal.infra.workflow_context``, whose ``task_id`` names the task) and, for ``group_size > 1``, its
``GroupedRolloutWorkflow`` gathers ``group_size`` calls of your workflow with the same ``data``. Wrap your workflow
and hand the wrapper to AReaL where it takes a workflow (``rollout_batch``, ``prepare_batch``, ``submit``)::

    from sglang_prorsa.integrations.areal import ProrsaWorkflow
    workflow = ProrsaWorkflow(RLVRWorkflow(...), "http://front:30000", task="math")

Each episode sends ``sampled`` first. When it returns, ``reward_start`` / ``reward_end`` close it (``accepted`` is
False for a rejected episode, one that returned None): AReaL computes the reward inside the episode. A workflow of
your own can bracket its reward, tools and sandboxes itself with ``current_trajectory()`` (``with
current_trajectory().tool("bash") as call:``); the wrapper then sends only what is still missing. An episode that
raises or is cancelled sends ``aborted``.

The trajectory id is ``areal-<process>-<task id>-<index>``: AReaL's task id (else the data's ``query_id`` or
``task_id``) and the sample's index in its group, with a token of this process (each rollout worker counts its
tasks from 0). AReaL's engine sends a fresh ``rid`` per request and no header, so the wrapper adds the id as SGLang's
own ``session_id`` field to every ``/generate`` body that AReaL's SGLang backend builds
(``SGLangBackend.build_generation_request``; its ``parse_generation_response`` counts the turns), reached as ``engine._engine.backend`` on ``RemoteSGLangEngine``);
the front and the instances read it as the trajectory id. AReaL is never imported: engines and workflows are
duck-typed.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
import weakref
from collections import OrderedDict
from contextvars import ContextVar
from typing import Any, Mapping

from sglang_prorsa.client import AsyncProrsaClient, AsyncTrajectory, HintConfig
from sglang_prorsa.client.errors import ProrsaClientError
from sglang_prorsa.client.generation import parse_generation

ID_FIELD = "session_id"  # SGLang's own /generate field, first in the trajectory-id precedence
_CURRENT: ContextVar[AsyncTrajectory | None] = ContextVar("prorsa_areal_trajectory", default=None)
_PROCESS = uuid.uuid4().hex[:6]
_MAX_GROUPS = 4096


def areal_task_id() -> Any:
    """The task id AReaL's workflow executor set for the running episode, or None (outside AReaL's executor, or
    AReaL not loaded: it is read only when AReaL already imported its workflow context)."""
    ctx_module = sys.modules.get("areal.infra.workflow_context")
    if ctx_module is None:
        return None
    try:
        return ctx_module.get().task_id
    except Exception:  # another AReaL version's shape: the data's ids are used instead
        return None


def current_trajectory() -> AsyncTrajectory:
    """The trajectory of the episode running here (inside ``ProrsaWorkflow.arun_episode``), for ``tool(...)``,
    ``sandbox(...)`` and ``reward()`` spans."""
    t = _CURRENT.get()
    if t is None:
        raise LookupError("no AReaL episode is running here: call this inside ProrsaWorkflow.arun_episode")
    return t


class _IdBackend:
    """AReaL's generation backend with the running episode's trajectory id added to each ``/generate`` body; every
    other attribute is the wrapped backend's."""

    def __init__(self, backend: Any, field: str) -> None:
        self._prorsa_backend = backend
        self._prorsa_field = field

    def build_generation_request(self, req: Any, *args: Any, **kwargs: Any) -> Any:
        http_req = self._prorsa_backend.build_generation_request(req, *args, **kwargs)
        t = _CURRENT.get()
        payload = getattr(http_req, "payload", None)
        if t is not None and isinstance(payload, dict):
            payload.setdefault(self._prorsa_field, t.trajectory_id)
        return http_req

    def parse_generation_response(self, response: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._prorsa_backend.parse_generation_response(response, *args, **kwargs)
        t = _CURRENT.get()
        if t is not None:  # the turn counter and context length that the next hints carry
            try:
                t._record(parse_generation(response, t.trajectory_id, 0.0))
            except ProrsaClientError:  # not a single prompt's answer: the turn is not counted, the answer stands
                pass
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prorsa_backend, name)


def tag_engine(engine: Any, field: str = ID_FIELD) -> bool:
    """Make ``engine``'s ``/generate`` bodies carry the running episode's trajectory id (idempotent). ``engine`` is
    AReaL's ``RemoteSGLangEngine`` (its backend is ``engine._engine.backend``) or a ``RemoteInfEngine``
    (``engine.backend``). False when no backend with ``build_generation_request`` is found: the hints still go
    out, the requests stay untracked."""
    for owner in (getattr(engine, "_engine", None), engine):
        if owner is None:
            continue
        backend = getattr(owner, "backend", None)
        if isinstance(backend, _IdBackend):
            return True
        if backend is not None and callable(getattr(backend, "build_generation_request", None)):
            owner.backend = _IdBackend(backend, field)
            return True
    return False


class ProrsaWorkflow:
    """An AReaL ``RolloutWorkflow`` (duck-typed: ``arun_episode(engine, data)``) with lifecycle hints."""

    def __init__(self, workflow: Any, hints_url: str, *, task: str | None = None, hints: HintConfig | None = None,
                 id_field: str = ID_FIELD) -> None:
        self.workflow = workflow
        self.hints_url = hints_url
        self.task = task
        self.hint_config = hints
        self.id_field = id_field
        self._groups: OrderedDict[str, int] = OrderedDict()  # group key -> samples started
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __getattr__(self, name: str) -> Any:  # the wrapped workflow's own attributes (AReaL reads some)
        if name == "workflow":
            raise AttributeError(name)
        return getattr(self.workflow, name)

    def client(self) -> AsyncProrsaClient:
        """This event loop's hint client (created on first use; AReaL runs episodes on its own loop)."""
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = AsyncProrsaClient(self.hints_url, hints=self.hint_config)
        client: AsyncProrsaClient = self._clients[loop]
        return client

    def group_key(self, data: Any) -> str:
        """AReaL's task id, else the data's ``query_id`` / ``task_id``, else a fresh key (a group of one)."""
        key = areal_task_id()
        if key is None and isinstance(data, Mapping):
            key = data.get("query_id", data.get("task_id"))
        return str(key) if key is not None else uuid.uuid4().hex[:12]

    def next_ids(self, data: Any) -> tuple[str, str]:
        """``(trajectory id, group id)`` of a new episode: the group's next sample index."""
        key = self.group_key(data)
        index = self._groups.pop(key, 0)
        self._groups[key] = index + 1
        while len(self._groups) > _MAX_GROUPS:
            self._groups.popitem(last=False)
        group_id = f"areal-{_PROCESS}-{key}"
        return f"{group_id}-{index}", group_id

    async def arun_episode(self, engine: Any, data: Any) -> Any:
        tag_engine(engine, self.id_field)
        tid, group_id = self.next_ids(data)
        t = self.client().trajectory(self.task, trajectory_id=tid, group_id=group_id,
                                     prompt_tokens=_prompt_tokens(data))
        t.sampled()
        token = _CURRENT.set(t)
        try:
            result = await self.workflow.arun_episode(engine, data)
        except BaseException:  # CancelledError too: AReaL cancels running episodes when it stops or pauses a rollout
            t.abort()
            raise
        finally:
            _CURRENT.reset(token)
        if not t.finished:  # the reward was computed inside the episode (AReaL's workflows do)
            t.reward_start()
            t.reward_end(accepted=result is not None)
        return result

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Deliver every hint queued on this loop; True once all are settled."""
        client = self._clients.get(asyncio.get_running_loop())
        return True if client is None else await client.flush_hints(timeout_s)

    async def aclose(self) -> None:
        """Deliver what is queued and close this loop's client."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


def _prompt_tokens(data: Any) -> int | None:
    if isinstance(data, Mapping):
        ids = data.get("input_ids")
        if isinstance(ids, (list, tuple)):
            return len(ids)
    return None
