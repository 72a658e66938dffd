"""Typed messages between an engine's HTTP process and its scheduler, and the records a busy switch hands back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class MigrateOut:
    """Cancel every request on the instance: persist the KV of those that have it, report all of them."""

    reason: str = "role switch"


@dataclass(frozen=True)
class LoadPrefix:
    """Load a persisted prefix from the KV store into this instance's prefix cache."""

    token_ids: list[int]
    keys: list[str]
    block_tokens: int


@dataclass(frozen=True)
class Status:
    """Ask for counters and whether the scheduler is idle."""


@dataclass
class MigratedRequest:
    """One request taken off a switched instance (paper Appendix C: cancelled with its tokens kept).

    ``kv_tokens`` leading tokens of ``input_ids + output_ids`` have their KV in the store under ``keys``; a request with
    ``kv_tokens == 0`` had not started (or had no KV yet) and is simply re-sent.
    """

    rid: str
    input_ids: list[int]
    output_ids: list[int]
    sampling_params: dict[str, Any]
    kv_tokens: int = 0
    keys: list[str] = field(default_factory=list)
    block_tokens: int = 0
    stage: str = "running"  # running | waiting | transferring | queued

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MigrateOutResult:
    role: str
    requests: list[MigratedRequest]
    persist_s: float
    persisted_bytes: int
    persisted_blocks: int

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["requests"] = [r.to_json() for r in self.requests]
        return d


@dataclass
class LoadPrefixResult:
    loaded_tokens: int
    already_cached_tokens: int
    missing_blocks: int
    checksum_failures: int
    load_s: float


@dataclass
class StatusResult:
    role: str
    idle: bool
    running: int
    queued: int
    counters: dict[str, float]
    kv_footprint_tokens: int
    kv_capacity_tokens: int
