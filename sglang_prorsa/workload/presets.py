"""Typed parameters of a synthetic agentic-RL rollout workload, and the presets.

A ``WorkloadSpec`` = a ``TaskProfile`` (what one trajectory looks like: turns, prompt growth, tool / sandbox / reward
durations, acceptance), an ``EngineModel`` (how fast prefill and decode run) and a ``RolloutSetting`` (synchronous
steps or asynchronous injection, GRPO groups, concurrency). The presets are shaped after the paper's tasks (§5.1):
a coding agent (SWE-style, long trajectories: ~850 s end to end in §5.4), a general agent (~220 s) and single-turn
math. The numbers are plausible stand-ins, not measurements.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

import numpy as np

from sglang_prorsa.policy.forecast.profile import PrefillTimeProfile
from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy


@dataclass(frozen=True)
class LogNormal:
    """A positive quantity with a long right tail, given by its median; clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: float = 0.0
    hi: float = math.inf

    def sample(self, rng: random.Random) -> float:
        if self.sigma <= 0:
            return min(self.hi, max(self.lo, self.median))
        # min(hi, max(lo, x)) spelled out (the plan generator's hot path), returning the same objects
        x = self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        if x <= self.lo:
            x = self.lo
        return self.hi if x >= self.hi else x

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` independent draws with the distribution of ``sample`` (the floor oracle's Monte Carlo)."""
        if self.sigma <= 0:
            return np.full(n, min(self.hi, max(self.lo, self.median)))
        return np.clip(self.median * np.exp(self.sigma * rng.standard_normal(n)), self.lo, self.hi)


@dataclass(frozen=True)
class Gamma:
    """A duration with a lighter tail than the log-normal (shape > 1: rarely near zero), clipped to [lo, hi]."""

    mean: float
    shape: float
    lo: float = 0.0
    hi: float = math.inf

    @property
    def median(self) -> float:  # the presets read medians for defaults; close enough for shape >= 1
        return self.mean * (1.0 - 1.0 / (3.0 * self.shape + 0.2))

    def sample(self, rng: random.Random) -> float:
        return min(self.hi, max(self.lo, rng.gammavariate(self.shape, self.mean / self.shape)))

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(rng.gamma(self.shape, self.mean / self.shape, n), self.lo, self.hi)


@dataclass(frozen=True)
class Weibull:
    """Weibull(scale, shape): shape < 1 gives a heavy tail with many very short values (e.g. cached tool calls)."""

    scale: float
    shape: float
    lo: float = 0.0
    hi: float = math.inf

    @property
    def median(self) -> float:
        return self.scale * math.log(2.0) ** (1.0 / self.shape)

    def sample(self, rng: random.Random) -> float:
        return min(self.hi, max(self.lo, rng.weibullvariate(self.scale, self.shape)))

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(self.scale * rng.weibull(self.shape, n), self.lo, self.hi)


@dataclass(frozen=True)
class Bimodal:
    """With probability ``p_fast`` the ``fast`` distribution, else ``slow`` (e.g. a tool that usually hits a cache)."""

    fast: LogNormal
    slow: LogNormal
    p_fast: float

    @property
    def median(self) -> float:
        return self.fast.median if self.p_fast >= 0.5 else self.slow.median

    def sample(self, rng: random.Random) -> float:
        return (self.fast if rng.random() < self.p_fast else self.slow).sample(rng)

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.where(rng.random(n) < self.p_fast, self.fast.sample_many(rng, n), self.slow.sample_many(rng, n))


Duration = LogNormal | Gamma | Weibull | Bimodal


@dataclass(frozen=True)
class ToolSpec:
    name: str
    weight: float
    duration_s: Duration
    result_tokens: LogNormal


@dataclass(frozen=True)
class TaskProfile:
    name: str
    turns: LogNormal  # model requests per trajectory (rounded, >= 1)
    first_prompt_tokens: LogNormal
    output_tokens: LogNormal
    tools: tuple[ToolSpec, ...]
    agent_overhead_s: LogNormal  # tool result -> next request reaches the engine
    uses_sandbox: bool
    prewarm_hit_rate: float
    prewarm_start_s: LogNormal  # sandbox_start -> ready
    cold_start_s: LogNormal
    dispatch_s: LogNormal  # injection decision -> sandbox_start (or first request without sandbox)
    first_request_s: LogNormal  # sandbox ready -> first request
    reward_s: LogNormal
    accept_rate: float


@dataclass(frozen=True)
class EngineModel:
    """Serial per-instance prefill (what B.7 assumes) with noise around the profile, and per-token decode.

    ``decode_kv_tokens`` bounds the decode side's KV cache (None: unbounded, the presets): a request whose prefill
    finished is admitted to decode, in completion order, only when its prompt plus its whole output fit beside the
    requests decoding (a request larger than the cache is admitted alone), so a full cache holds finished prefills
    back, as a decode instance with no free KV does."""

    prefill_instances: int = 8
    prefill_base_s: float = 0.02
    prefill_per_token_s: float = 1.0 / 60_000.0  # effective, cache hits included (full-prompt convention, §4.2)
    prefill_noise_sigma: float = 0.15
    decode_s_per_token: float = 0.035  # per-trajectory TPOT of a large MoE under rollout load
    decode_noise_sigma: float = 0.2
    decode_kv_tokens: float | None = None  # decode KV capacity in tokens (None: unbounded)

    def profile(self) -> PrefillTimeProfile:
        """The profiled g(x) handed to the predictor (noise-free)."""
        return PrefillTimeProfile(base_s=self.prefill_base_s, per_token_s=self.prefill_per_token_s)


@dataclass(frozen=True)
class RolloutSetting:
    mode: str  # "sync" | "async"
    groups: int  # GRPO groups in flight (sync: per step; async: initial)
    group_size: int
    injection: InjectionConfig = field(default_factory=lambda: InjectionConfig(InjectionPolicy.NONE))
    train_gap_s: float = 60.0  # sync: step end -> next step's launch (training + weight sync)
    # sync: the trainer reports weights_updated this long before the next launch (None: it reports nothing)
    weights_updated_before_s: float | None = 2.0

    @property
    def concurrency(self) -> int:
        return self.groups * self.group_size


@dataclass(frozen=True)
class WorkloadSpec:
    task: TaskProfile
    engine: EngineModel
    rollout: RolloutSetting

    @property
    def name(self) -> str:
        return f"{self.task.name}/{self.rollout.mode}"


CODING_AGENT = TaskProfile(
    name="coding_agent",
    turns=LogNormal(24, 0.5, 3, 80),
    first_prompt_tokens=LogNormal(6000, 0.3, 1500, 20000),
    output_tokens=LogNormal(500, 0.6, 50, 8000),  # reasoning + tool call per turn
    tools=(
        ToolSpec("bash", 0.55, LogNormal(6.0, 0.8, 0.2, 180), LogNormal(800, 1.0, 20, 16000)),
        ToolSpec("edit", 0.25, LogNormal(2.0, 0.5, 0.1, 30), LogNormal(300, 0.6, 20, 4000)),
        ToolSpec("run_tests", 0.20, LogNormal(25.0, 0.6, 2, 300), LogNormal(1500, 0.8, 50, 16000)),
    ),
    agent_overhead_s=LogNormal(0.3, 0.5, 0.02, 5),
    uses_sandbox=True,
    prewarm_hit_rate=0.8,
    prewarm_start_s=LogNormal(2.0, 0.4, 0.3, 20),
    cold_start_s=LogNormal(35.0, 0.4, 5, 240),
    dispatch_s=LogNormal(0.4, 0.5, 0.02, 5),
    first_request_s=LogNormal(0.5, 0.5, 0.02, 5),
    reward_s=LogNormal(25.0, 0.6, 2, 300),
    accept_rate=0.85,
)

GENERAL_AGENT = TaskProfile(
    name="general_agent",
    turns=LogNormal(7, 0.5, 1, 30),
    first_prompt_tokens=LogNormal(3500, 0.4, 500, 16000),
    output_tokens=LogNormal(400, 0.7, 30, 8000),
    tools=(
        ToolSpec("search", 0.5, LogNormal(8.0, 0.5, 0.5, 90), LogNormal(1500, 0.6, 50, 12000)),
        ToolSpec("browse", 0.3, LogNormal(15.0, 0.6, 1, 180), LogNormal(2500, 0.7, 50, 16000)),
        ToolSpec("api_call", 0.2, LogNormal(3.0, 0.6, 0.1, 60), LogNormal(400, 0.6, 20, 4000)),
    ),
    agent_overhead_s=LogNormal(0.2, 0.5, 0.02, 5),
    uses_sandbox=True,
    prewarm_hit_rate=0.9,
    prewarm_start_s=LogNormal(1.5, 0.4, 0.2, 20),
    cold_start_s=LogNormal(20.0, 0.4, 3, 120),
    dispatch_s=LogNormal(0.3, 0.5, 0.02, 5),
    first_request_s=LogNormal(0.3, 0.5, 0.02, 5),
    reward_s=LogNormal(8.0, 0.5, 1, 120),
    accept_rate=0.8,
)

MATH = TaskProfile(
    name="math",
    turns=LogNormal(1, 0.0, 1, 1),
    first_prompt_tokens=LogNormal(400, 0.4, 50, 4000),
    output_tokens=LogNormal(6000, 0.8, 200, 32000),
    tools=(),
    agent_overhead_s=LogNormal(0.05, 0.0),
    uses_sandbox=False,
    prewarm_hit_rate=1.0,
    prewarm_start_s=LogNormal(0.0, 0.0),
    cold_start_s=LogNormal(0.0, 0.0),
    dispatch_s=LogNormal(0.2, 0.5, 0.01, 5),
    first_request_s=LogNormal(0.0, 0.0),
    reward_s=LogNormal(1.0, 0.5, 0.1, 20),
    accept_rate=0.7,
)

TASKS = {t.name: t for t in (CODING_AGENT, GENERAL_AGENT, MATH)}
_ENGINES = {
    "coding_agent": EngineModel(prefill_instances=8),
    "general_agent": EngineModel(prefill_instances=6),
    "math": EngineModel(prefill_instances=4, decode_s_per_token=0.02),
}
_GROUPS = {"coding_agent": (32, 8), "general_agent": (32, 8), "math": (64, 8)}


def preset(name: str, mode: str = "async") -> WorkloadSpec:
    """``coding_agent`` | ``general_agent`` | ``math`` in ``sync`` (steps) or ``async`` (group replenishment) mode."""
    if name not in TASKS:
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(TASKS)}")
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    groups, size = _GROUPS[name]
    if mode == "sync":
        rollout = RolloutSetting("sync", groups, size, InjectionConfig(InjectionPolicy.NONE))
    else:
        rollout = RolloutSetting("async", groups, size, InjectionConfig(InjectionPolicy.GROUP, group_size=size))
    return WorkloadSpec(TASKS[name], _ENGINES[name], rollout)


def with_injection(spec: WorkloadSpec, injection: InjectionConfig) -> WorkloadSpec:
    """The same workload under another (asynchronous) injection policy."""
    return replace(spec, rollout=replace(spec.rollout, mode="async", injection=injection))


def scaled(spec: WorkloadSpec, live: int) -> WorkloadSpec:
    """The same workload with about ``live`` trajectories in flight: more groups, and prefill instances in
    proportion, so the engine runs at the same utilisation as the preset."""
    groups = max(1, round(live / spec.rollout.group_size))
    factor = groups / spec.rollout.groups
    engine = replace(spec.engine, prefill_instances=max(1, round(spec.engine.prefill_instances * factor)))
    return replace(spec, engine=engine, rollout=replace(spec.rollout, groups=groups))


def varied(spec: WorkloadSpec, *, tool_shape: str | None = None, turns_scale: float = 1.0,
           prewarm_hit_rate: float | None = None) -> WorkloadSpec:
    """A robustness variant: tool durations of another shape with the same median ("gamma": light tail,
    "weibull": heavy tail with many short calls, "bimodal": 70 % fast cache hits, 30 % four times slower), the turn
    count scaled, or another prewarm / cold startup mix."""
    task = spec.task
    if tool_shape is not None:
        task = replace(task, tools=tuple(replace(t, duration_s=_reshape(t.duration_s, tool_shape)) for t in task.tools))
    if turns_scale != 1.0:
        t = task.turns
        task = replace(task, turns=replace(t, median=t.median * turns_scale, hi=max(t.lo, t.hi * turns_scale)))
    if prewarm_hit_rate is not None:
        task = replace(task, prewarm_hit_rate=prewarm_hit_rate)
    return replace(spec, task=task)


TOOL_SHAPES = ("lognormal", "gamma", "weibull", "bimodal")


def reshape_duration(d: LogNormal, shape: str, *, scale: float = 1.0, param: float | None = None,
                     spread: float = 4.0) -> Duration:
    """``d`` as a duration of another shape with its median times ``scale`` (its clipping range scaled too), for
    held-out families of settings. ``param`` is the shape's own parameter (default: ``d``'s or the robustness
    variant's): the log-normal's sigma, the gamma's or Weibull's shape k (Weibull k < 1: heavy tail, many very short
    values), the bimodal mixture's probability of the fast mode; ``spread`` is the bimodal's slow / fast median ratio
    (the two modes sit at median / sqrt(spread) and median * sqrt(spread))."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    median, lo, hi = d.median * scale, d.lo * scale, d.hi * scale
    if shape == "lognormal":
        return LogNormal(median, d.sigma if param is None else param, lo, hi)
    if shape == "gamma":
        k = 3.0 if param is None else param
        if not k > 0:
            raise ValueError(f"gamma shape must be > 0, got {k}")
        return Gamma(mean=median / (1.0 - 1.0 / (3.0 * k + 0.2)), shape=k, lo=lo, hi=hi)
    if shape == "weibull":
        k = 0.7 if param is None else param
        if not k > 0:
            raise ValueError(f"weibull shape must be > 0, got {k}")
        return Weibull(scale=median / math.log(2.0) ** (1 / k), shape=k, lo=lo, hi=hi)
    if shape == "bimodal":
        p_fast = 0.7 if param is None else param
        if not (0.0 <= p_fast <= 1.0 and spread >= 1.0):
            raise ValueError(f"bimodal needs 0 <= p_fast <= 1 and spread >= 1, got {p_fast}, {spread}")
        root = math.sqrt(spread)
        return Bimodal(LogNormal(median / root, 0.3, lo, hi), LogNormal(median * root, 0.4, lo, hi), p_fast)
    raise ValueError(f"tool shape must be one of {', '.join(TOOL_SHAPES)}, got {shape!r}")


def _reshape(d: LogNormal, shape: str) -> Duration:
    if shape == "gamma":
        return Gamma(mean=d.median * 1.1, shape=3.0, lo=d.lo, hi=d.hi)
    if shape == "weibull":
        return Weibull(scale=d.median / math.log(2.0) ** (1 / 0.7), shape=0.7, lo=d.lo, hi=d.hi)
    if shape == "bimodal":
        return Bimodal(LogNormal(d.median * 0.6, 0.3, d.lo, d.hi), LogNormal(d.median * 2.4, 0.4, d.lo, d.hi), 0.7)
    raise ValueError(f"tool_shape must be gamma, weibull or bimodal, got {shape!r}")
