"""Configuration of a cluster simulation: the model's performance parameters, the rollout, the cluster.

Three frozen dataclasses, each with one job:

* ``ModelConfig``   - how fast one instance of a model runs (perf_model.py reads it). Loaded from
  ``sglang_prorsa/sim/models/<name>.json``; every number there names its source in a ``sources`` field: the paper
  (a table or section), a public profile (LMSYS, DeepSeek, SGLang defaults), our ``sim fit``, or ``ASSUMED`` (listed by
  ``assumed_parameters`` and printed with every result). An optional ``decode_wide`` block is the decode instance
  shape of stage-specific parallelism (§3.2, §5.3: doubled EP for decode).
* ``RolloutConfig`` - what the trainer does: workload (a preset task of §5.1 or a mix, workloads.py), GRPO group
  size, groups per step (the load), staleness bound (0 = synchronous / on-policy, §2), training steps.
* ``ClusterConfig`` - G GPUs in instances, and how they are used: ``colocated``, ``static`` PD with
  ``prefill_instances`` of them prefilling, or ``adaptive`` (our control plane, §4); DP-rank routing; instance shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.workload.scaling import PlanScale

MODELS_DIR = Path(__file__).resolve().parent / "models"
MODES = ("colocated", "static", "adaptive")
ROUTING = ("sglang", "rank_aware")
PLANNERS = ("guarded", "waits", "paper")


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
class Shape:
    """One instance shape: GPUs, attention-DP ranks, per-rank KV pool and batch limit, per-rank costs."""

    gpus_per_instance: int
    dp_ranks: int
    kv_tokens_per_rank: int
    max_running_per_rank: int
    prefill: PrefillParams
    decode: DecodeParams

    def __post_init__(self) -> None:
        if self.gpus_per_instance < 1 or self.dp_ranks < 1 or self.gpus_per_instance % self.dp_ranks:
            raise ValueError("gpus_per_instance and dp_ranks must be >= 1, and ranks must split the GPUs evenly")
        if self.kv_tokens_per_rank < 1 or self.max_running_per_rank < 1:
            raise ValueError("kv_tokens_per_rank and max_running_per_rank must be >= 1")

    @property
    def gpus_per_rank(self) -> int:
        return self.gpus_per_instance // self.dp_ranks


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
    transfer_gbytes_per_s: float  # NIC bandwidth per GPU; a rank sends its KV shards over its GPUs' NICs in parallel
    transfer_latency_s: float = 0.005
    switch_s: float = 5.0  # role switch (Appendix C: "around 5 seconds on average")
    moe_dp_sync: bool = True  # a DP group's iteration waits for its slowest rank (MoE layers are collective)
    max_running_per_rank: int = 16  # SGLang --max-running-requests per DP rank (paper Table 1: batch 16 per rank)
    reserved_decode_tokens: int = 512  # SGLang --num-reserved-decode-tokens: KV kept free per running request
    decode_wide: dict[str, Any] | None = None  # the decode shape of stage-specific parallelism (see Shape)
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.gpus_per_instance < 1 or self.dp_ranks < 1 or self.chunk_tokens < 1:
            raise ValueError("gpus_per_instance, dp_ranks and chunk_tokens must be >= 1")
        if self.kv_tokens_per_rank < 1 or self.transfer_gbytes_per_s <= 0 or self.switch_s < 0:
            raise ValueError("kv_tokens_per_rank, transfer bandwidth must be positive and switch_s >= 0")
        if self.max_running_per_rank < 1 or self.reserved_decode_tokens < 0:
            raise ValueError("max_running_per_rank >= 1 and reserved_decode_tokens >= 0 required")
        self.shape("wide") if self.decode_wide is not None else None  # validate early

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

    def shape(self, kind: str = "same") -> Shape:
        """``same``: the model's one instance shape; ``wide``: its ``decode_wide`` decode shape."""
        base = Shape(self.gpus_per_instance, self.dp_ranks, self.kv_tokens_per_rank, self.max_running_per_rank,
                     self.prefill, self.decode)
        if kind == "same":
            return base
        if kind != "wide" or self.decode_wide is None:
            raise ValueError(f"model {self.name!r} has no {kind!r} decode shape")
        wide = dict(self.decode_wide)
        unknown = sorted(set(wide) - {"gpus_per_instance", "dp_ranks", "kv_tokens_per_rank", "max_running_per_rank",
                                      "decode"})
        if unknown:
            raise ValueError(f"unknown decode_wide field {unknown[0]!r}")
        if "decode" in wide:
            wide["decode"] = DecodeParams(**wide["decode"])
        return replace(base, **wide)


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


def assumed_parameters(model: ModelConfig) -> dict[str, str]:
    """The model's parameters whose source says ASSUMED (no paper table, public profile or fit behind them)."""
    return {k: v for k, v in sorted(model.sources.items()) if "ASSUMED" in v}


@dataclass(frozen=True)
class RolloutConfig:
    preset: str = "coding_agent"  # a task of workload/presets.py or a mix of sim/workloads.py
    staleness: int = 0  # 0: synchronous on-policy steps; k > 0: asynchronous, trajectories may span k versions
    group_size: int = 32  # GRPO group (§5.1: 8 for math, 32 for the agentic tasks)
    groups_per_step: int = 8  # a training batch = groups_per_step whole groups: the load
    steps: int = 3  # training steps to simulate
    seed: int = 0
    train_s: float = 0.0  # async: a batch's completion -> the new weights reach the engines (training + sync)
    scale: PlanScale | None = None  # plans shrunk for a small deployment (bench_rollout.py's run; scaling.py)

    def __post_init__(self) -> None:
        if self.staleness < 0 or self.group_size < 1 or self.groups_per_step < 1 or self.steps < 1:
            raise ValueError("staleness >= 0; group_size, groups_per_step and steps >= 1")
        if not self.train_s >= 0:
            raise ValueError(f"train_s must be >= 0, got {self.train_s}")

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
    horizon_s: float = DEFAULT_HORIZON_S  # S, forecast horizon and control period (Appendix B)
    min_dwell_s: float = 30.0  # planner's dwell floor (planner.py)
    hysteresis: float = 0.1  # planner's absolute coverage band
    max_sim_s: float = 6 * 3600.0  # safety stop in simulated seconds
    decode_shape: str = "same"  # PD decode instances: "same" as prefill, or the model's "wide" shape (§5.3)
    routing: str = "sglang"  # DP-rank choice: SGLang's default (round robin / bootstrap room) or rank_aware (sticky)
    planner: str = "guarded"  # adaptive: our guarded planner, "waits" (it with the wait rule) or "paper" (Eq. 1, no guard)
    time_quantum_s: float = 0.25  # regime.py: a regime may run through completions this long (0 = exact)
    anticipate: bool = True  # adaptive: announce the re-prefill of a coming weight update (needs train_s > 0)
    move_review: bool = False  # adaptive: each move undone if decode's completions fell (policy/role_switch/review.py)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.gpus < 1 or self.horizon_s <= 0:
            raise ValueError("gpus >= 1 and horizon_s > 0")
        if self.routing not in ROUTING:
            raise ValueError(f"routing must be one of {ROUTING}, got {self.routing!r}")
        if self.planner not in PLANNERS:
            raise ValueError(f"planner must be one of {PLANNERS}, got {self.planner!r}")
        if self.time_quantum_s < 0:
            raise ValueError(f"time_quantum_s must be >= 0, got {self.time_quantum_s}")
        if self.decode_shape not in ("same", "wide"):
            raise ValueError(f"decode_shape must be 'same' or 'wide', got {self.decode_shape!r}")

    def shapes(self, model: ModelConfig) -> tuple[Shape, Shape]:
        """(prefill / colocated shape, decode shape)."""
        prefill = model.shape("same")
        wide = self.decode_shape == "wide" and self.mode != "colocated"
        return prefill, model.shape("wide") if wide else prefill

    def instances(self, model: ModelConfig) -> int:
        """Instances of the prefill shape the GPUs hold (the unit static ratios count in)."""
        n = self.gpus // model.gpus_per_instance
        if n < (1 if self.mode == "colocated" else 2):
            raise ValueError(f"{self.gpus} GPUs hold {n} instances of {model.gpus_per_instance}: too few for {self.mode}")
        return n

    def split(self, model: ModelConfig) -> tuple[int, int]:
        """(prefill instances, decode instances) at t = 0; (0, n) colocated. Adaptive starts at half the GPUs unless
        told otherwise; decode instances of a wide shape take the GPUs prefill leaves, in whole instances."""
        n = self.instances(model)
        if self.mode == "colocated":
            return 0, n
        prefill_shape, decode_shape = self.shapes(model)
        p = self.prefill_instances or (n // 2 if self.mode == "adaptive" else 0)
        d = (self.gpus - p * prefill_shape.gpus_per_instance) // decode_shape.gpus_per_instance
        if not (p >= 1 and d >= 1):
            raise ValueError(f"{self.mode} needs >= 1 prefill and >= 1 decode instance; prefill_instances={p} "
                             f"leaves room for {d} decode instances of {decode_shape.gpus_per_instance} GPUs")
        return p, d

    def initial_prefill(self, model: ModelConfig) -> int:
        return self.split(model)[0]
