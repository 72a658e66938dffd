"""GRPO group helpers: ``n`` trajectories sharing a prompt and a ``group_id``, run concurrently.

The group id lets the forecast apply the group injection rule (paper Appendix B.2: a group's next prompt is sampled
once every member has reached reward). ``grpo_advantages`` is the group-normalised advantage of GRPO
((r - mean) / (std + eps), population std), for trainers that want it next to the rollout.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

from sglang_prorsa.client.errors import GroupError, InvalidArgument

if TYPE_CHECKING:
    from sglang_prorsa.client.async_client import AsyncProrsaClient
    from sglang_prorsa.client.sync_client import ProrsaClient
    from sglang_prorsa.client.trajectory import AsyncTrajectory, Trajectory


def new_group_id() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


def _check_n(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument("n", f"must be a positive integer, got {n!r}")


def _settle(group_id: str, outcomes: list[tuple[Any, BaseException | None]], return_exceptions: bool) -> list[Any]:
    errors = {i: e for i, (_, e) in enumerate(outcomes) if e is not None}
    if return_exceptions:
        return [e if e is not None else r for r, e in outcomes]
    if errors:
        raise GroupError(group_id, errors, [r for r, _ in outcomes])
    return [r for r, _ in outcomes]


def run_group(client: "ProrsaClient", n: int, fn: Callable[["Trajectory"], Any], *, task: str | None = None,
              group_id: str | None = None, prompt_tokens: int | None = None, max_workers: int | None = None,
              return_exceptions: bool = False) -> list[Any]:
    """Run ``fn(trajectory)`` for ``n`` members in threads, each inside its own trajectory context."""
    _check_n(n)
    gid = group_id or new_group_id()

    def member(i: int) -> tuple[Any, BaseException | None]:
        try:
            with client.trajectory(task=task, group_id=gid, prompt_tokens=prompt_tokens,
                                   trajectory_id=f"{gid}-{i}") as t:
                return fn(t), None
        except Exception as exc:  # reported per member; the other members keep running
            return None, exc

    with ThreadPoolExecutor(max_workers or n, thread_name_prefix=f"grpo-{gid}") as pool:
        outcomes = list(pool.map(member, range(n)))
    return _settle(gid, outcomes, return_exceptions)


async def run_group_async(client: "AsyncProrsaClient", n: int, fn: Callable[["AsyncTrajectory"], Awaitable[Any]], *,
                          task: str | None = None, group_id: str | None = None, prompt_tokens: int | None = None,
                          return_exceptions: bool = False) -> list[Any]:
    """Run ``await fn(trajectory)`` for ``n`` members concurrently, each inside its own trajectory context."""
    _check_n(n)
    gid = group_id or new_group_id()

    async def member(i: int) -> tuple[Any, BaseException | None]:
        try:
            async with client.trajectory(task=task, group_id=gid, prompt_tokens=prompt_tokens,
                                         trajectory_id=f"{gid}-{i}") as t:
                return await fn(t), None
        except Exception as exc:
            return None, exc

    outcomes = await asyncio.gather(*(member(i) for i in range(n)))
    return _settle(gid, list(outcomes), return_exceptions)


def grpo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) over one group (population standard deviation)."""
    if not rewards:
        raise InvalidArgument("rewards", "must hold at least one reward")
    values = [float(r) for r in rewards]
    if not all(math.isfinite(v) for v in values):
        raise InvalidArgument("rewards", "must be finite numbers")
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + eps) for v in values]
