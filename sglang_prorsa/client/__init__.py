"""Trainer SDK for sglang-prorsa: generation carrying the trajectory id, lifecycle hints batched in the background,
GRPO group helpers. Pure HTTP (requests / aiohttp); it imports no SGLang and works against our adaptive front, one
engine, the standalone control plane (hints only) or anything serving SGLang's ``/generate``.

    from sglang_prorsa.client import ProrsaClient, AsyncProrsaClient, HintConfig
"""

from sglang_prorsa.client.async_client import AsyncProrsaClient
from sglang_prorsa.client.errors import (
    GroupError,
    HintBufferFull,
    HintError,
    InvalidArgument,
    ProrsaClientError,
    ProrsaConnectionError,
    ProrsaHTTPError,
)
from sglang_prorsa.client.generation import TRAJECTORY_ID_HEADER, Generation
from sglang_prorsa.client.grpo import grpo_advantages, new_group_id
from sglang_prorsa.client.hints import HintConfig, HintStats
from sglang_prorsa.client.sync_client import ProrsaClient
from sglang_prorsa.client.trajectory import AsyncTrajectory, RewardOutcome, ToolCall, Trajectory, new_trajectory_id

__all__ = [
    "AsyncProrsaClient", "AsyncTrajectory", "Generation", "GroupError", "HintBufferFull", "HintConfig", "HintError",
    "HintStats", "InvalidArgument", "ProrsaClient", "ProrsaClientError", "ProrsaConnectionError", "ProrsaHTTPError",
    "RewardOutcome", "TRAJECTORY_ID_HEADER", "ToolCall", "Trajectory", "grpo_advantages", "new_group_id",
    "new_trajectory_id",
]
