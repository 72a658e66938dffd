"""Configuration of a cluster simulation: the model's performance parameters, the rollout, the cluster.

Three frozen dataclasses, each with one job:

* ``ModelConfig``   - how fast one instance of a model runs (perf_model.py reads it). Loaded from
  ``sglang_prorsa/sim/models/<name>.json``; every number there names its source in a ``sources`` field (the paper's
  Table 1 ratios, public serving profiles, or an explicit assumption).
* ``RolloutConfig`` - what the trainer does: preset task (§5.1), GRPO group size, groups per step, staleness bound
  (0 = synchronous / on-policy, §2), number of training steps.
* ``ClusterConfig`` - G GPUs in instances of m GPUs, and how they are used: ``colocated``, ``static`` PD with
  ``prefill_instances`` of them prefilling, or ``adaptive`` (our control plane, §4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MODELS_DIR = Path(__file__).resolve().parent / "models"
MODES = ("colocated", "static", "adaptive")


@dataclass(frozen=True)
class PrefillParams:
    """Time of one prefill iteration on one attention-DP rank (perf_model.prefill_iteration_s)."""

    iter_base_s: float  # fixed cost of a forward pass (kernel launches, MoE all-to-all latency)
    per_token_s: float  # linear cost per new token (GEMMs)
    per_token_ctx_s: float  # attention: cost per new token per token of context it attends to


@dataclass(frozen=True)
class DecodeParams:
    """Time of one decode step on one attention-DP rank (perf_model.decode_step_s)."""

    iter_base_s: float  # weight reads + MoE all-to-all latency: dominates at small batch
    per_seq_s: float  # per running sequence
    per_ctx_token_s: float  # attention over the KV of every running sequence


@dataclass(frozen=True)
class ModelConfig:
    name: str
    gpus_per_instance: int  # m: one instance = one EP group
    dp_ranks: int  # attention data-parallel ranks per instance; their steps synchronise at every MoE layer
    chunk_tokens: int  # chunked-prefill size per rank (SGLang's recommended value, §5.1)
    prefill: PrefillParams
    decode: DecodeParams
    kv_tokens_per_rank: int  # usable KV pool of one attention rank, in token slots
    kv_bytes_per_token: int  # what a P->D transfer moves per prompt token
    transfer_gbytes_per_s: float  # P->D KV bandwidth available to one transfer
    transfer_latency_s: float = 0.005
    switch_s: float = 5.0  # role switch (Appendix C: "around 5 seconds on average")
    moe_dp_sync: bool = True  # a DP group's iteration waits for its slowest rank (MoE layers are collective)
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.gpus_per_instance < 1 or self.dp_ranks < 1 or self.chunk_tokens < 1:
            raise ValueError("gpus_per_instance, dp_ranks and chunk_tokens must be >= 1")
        if self.kv_tokens_per_rank < 1 or self.transfer_gbytes_per_s <= 0 or self.switch_s < 0:
            raise ValueError("kv_tokens_per_rank, transfer bandwidth must be positive and switch_s >= 0")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown model field {unknown[0]!r}")
        values = dict(raw)
        values["prefill"] = PrefillParams(**raw["prefill"])
        values["decode"] = DecodeParams(**raw["decode"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = _asdict(self)
        out["prefill"], out["decode"] = _asdict(self.prefill), _asdict(self.decode)
        return out


def _asdict(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def available_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_model(name_or_path: str) -> ModelConfig:
    """A model by name (``mimo_v25_pro``) from models/, or any JSON file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = MODELS_DIR / f"{name_or_path}.json"
    if not path.exists():
        raise FileNotFoundError(f"no model config {name_or_path!r}; available: {available_models()}")
    return ModelConfig.from_dict(json.loads(path.read_text()))


@dataclass(frozen=True)
class RolloutConfig:
    preset: str = "coding_agent"  # math | coding_agent | general_agent (workload/presets.py)
    staleness: int = 0  # 0: synchronous on-policy steps; k > 0: asynchronous, trajectories may span k versions
    group_size: int = 32  # GRPO group (§5.1: 8 for math, 32 for the agentic tasks)
    groups_per_step: int = 8  # a training batch = groups_per_step whole groups
    steps: int = 3  # training steps to simulate
    seed: int = 0

    def __post_init__(self) -> None:
        if self.staleness < 0 or self.group_size < 1 or self.groups_per_step < 1 or self.steps < 1:
            raise ValueError("staleness >= 0; group_size, groups_per_step and steps >= 1")

    @property
    def batch(self) -> int:
        return self.group_size * self.groups_per_step

    @property
    def synchronous(self) -> bool:
        return self.staleness == 0

    @property
    def label(self) -> str:
        return "sync" if self.synchronous else f"stale{self.staleness}"


@dataclass(frozen=True)
class ClusterConfig:
    gpus: int = 128  # G (paper testbed: 16 servers x 8 GPUs, §5.1)
    mode: str = "colocated"  # colocated | static | adaptive
    prefill_instances: int = 0  # static: instances serving prefill (the rest decode); adaptive: the starting split
    horizon_s: float = 10.0  # S, forecast horizon and control period (Appendix B)
    min_dwell_s: float = 30.0  # planner's anti-flapping guard (planner.py); 0 with hysteresis 0 = the paper's planner
    hysteresis: float = 0.1
    max_sim_s: float = 6 * 3600.0  # safety stop in simulated seconds

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.gpus < 1 or self.horizon_s <= 0:
            raise ValueError("gpus >= 1 and horizon_s > 0")

    def instances(self, model: ModelConfig) -> int:
        n = self.gpus // model.gpus_per_instance
        if n < (1 if self.mode == "colocated" else 2):
            raise ValueError(f"{self.gpus} GPUs hold {n} instances of {model.gpus_per_instance}: too few for {self.mode}")
        return n

    def initial_prefill(self, model: ModelConfig) -> int:
        """Prefill instances at t = 0 (0 for colocated); adaptive starts at half unless told otherwise."""
        n = self.instances(model)
        if self.mode == "colocated":
            return 0
        p = self.prefill_instances or (n // 2 if self.mode == "adaptive" else 0)
        if not 1 <= p <= n - 1:
            raise ValueError(f"{self.mode} needs 1 <= prefill_instances <= {n - 1}, got {p}")
        return p
