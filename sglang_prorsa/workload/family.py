"""A seeded family of held-out workload settings: many generator settings drawn at random, kept as data.

``draw_settings(seed, count)`` draws ``count`` settings; each is a flat, JSON-ready dict holding its id, its own seed
and every parameter ``spec_from_params`` needs to rebuild the ``WorkloadSpec``, plus the trainer's hint set (a replay
option, hints.py) and the simulated duration. ``benchmarks/make_forecast_settings.py`` writes them to
``benchmarks/forecast_settings.json``; ``benchmarks/bench_forecast_heldout.py`` replays them.

Dimensions (``DIMENSIONS``: every value appears at least once when ``count`` allows, the rest are drawn at random):

* base task profile (coding agent, general agent) for everything not listed here;
* tool-time shape (log-normal, gamma, Weibull, bimodal mixture) with its own parameter drawn, and a scale on every
  tool's median (log-uniform, 1/4x to 4x);
* live trajectories 32 to 1,024, in GRPO groups of 1 to 16;
* rollout mode: constant-concurrency asynchronous (group replenishment) or synchronous steps with a training gap
  (log-uniform 15-300 s) and the trainer's weight-update report (none, or 0 / 2 / 10 s before the next launch);
* sandbox: none, or a cold-start fraction of 0 to 100 %;
* turn count (median 1 to 32 model requests per trajectory);
* the trainer's hints: all, no sandbox hints, no tool hints, no reward hints, none (engine events only);
* engine capacity: the prefill instances for a target utilisation (idle ~5 %, light ~30 %, busy ~75 %, saturated
  150-300 %: a queue that never drains; where one instance would still be under half a busy or saturated target,
  prefill is slowed instead), and the
  decode KV cache (unbounded, tight ~1x the expected decode KV demand, full ~0.3-0.6x: finished prefills wait).

Capacities are set from the expected load, estimated from 300 trajectory plans of the setting drawn with another seed
(``estimate``): prefill seconds and decode KV token-seconds per trajectory over its uncontended duration. These are
rough (no queueing); the drawn target and the estimate are both kept in the entry.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np

from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.workload.generator import WorkloadGenerator
from sglang_prorsa.workload.hints import HINT_SETS
from sglang_prorsa.workload.presets import (
    TASKS,
    TOOL_SHAPES,
    EngineModel,
    LogNormal,
    RolloutSetting,
    WorkloadSpec,
    reshape_duration,
)
from sglang_prorsa.workload.simulator import HINT_DELAY_S

FAMILY_VERSION = 1
# categorical dimensions: every value at least once (count permitting); weights for the remaining draws
DIMENSIONS: dict[str, tuple[tuple, tuple[float, ...]]] = {
    "base": (("coding_agent", "general_agent"), (1, 1)),
    "tool_shape": (TOOL_SHAPES, (1, 1, 1, 1)),
    "live": ((32, 64, 128, 256, 512, 1024), (1, 1, 1, 1, 1, 1)),
    "mode": (("async", "sync"), (1, 1)),
    "group_size": ((1, 2, 4, 8, 16), (1, 1, 2, 2, 1)),
    "cold_fraction": ((None, 0.0, 0.1, 0.3, 0.6, 1.0), (1, 1, 2, 2, 1, 1)),  # None: no sandbox
    "turns": ((1, 2, 4, 8, 16, 32), (1, 1, 1, 1, 1, 1)),
    "hints": (tuple(HINT_SETS), (3, 1, 1, 1, 1)),
    "prefill_load": (("idle", "light", "busy", "saturated"), (1, 1, 1, 1)),
    "decode_kv": (("unbounded", "tight", "full"), (2, 1, 1)),
}
PREFILL_UTIL = {"idle": (0.03, 0.1), "light": (0.2, 0.4), "busy": (0.6, 0.9), "saturated": (1.5, 3.0)}
DECODE_KV_FRACTION = {"tight": (0.8, 1.2), "full": (0.3, 0.6)}
WEIGHT_REPORTS = (None, 0.0, 2.0, 10.0)  # sync: weights_updated this long before the next launch (None: not reported)
MAX_PREFILL_INSTANCES = 512
DURATION_S = 10800.0  # 1,080 windows of 10 s
MAX_DURATION_S = 21600.0
ESTIMATE_PLANS = 300


def _sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (the file stays readable; the spec is built from the stored value)."""
    return float(f"{x:.{digits}g}")


def _cover(rng: random.Random, values: tuple, weights: tuple[float, ...], count: int) -> list:
    """``count`` draws: each value once (when count allows), the rest by weight, shuffled."""
    picks = list(values[:count]) if count < len(values) else list(values)
    picks += rng.choices(values, weights=weights, k=max(0, count - len(picks)))
    rng.shuffle(picks)
    return picks


def draw_settings(seed: int, count: int) -> list[dict]:
    """``count`` settings drawn from ``seed`` (deterministic: the same arguments give the same list)."""
    rng = random.Random(f"forecast-settings/{seed}")
    columns = {name: _cover(rng, values, weights, count) for name, (values, weights) in DIMENSIONS.items()}
    settings = []
    for i in range(count):
        p: dict = {"id": f"s{i:03d}", "seed": rng.randrange(1, 1_000_000)}
        p.update({name: columns[name][i] for name in DIMENSIONS})
        shape = p["tool_shape"]
        p["tool_shape_param"] = _sig({"lognormal": rng.uniform(0.3, 1.2), "gamma": rng.uniform(1.0, 6.0),
                                      "weibull": rng.uniform(0.5, 1.5), "bimodal": rng.uniform(0.5, 0.9)}[shape])
        p["tool_bimodal_spread"] = _sig(rng.uniform(3.0, 12.0)) if shape == "bimodal" else None
        p["tool_scale"] = _sig(math.exp(rng.uniform(math.log(0.25), math.log(4.0))))
        p["turns_sigma"] = 0.0 if p["turns"] == 1 else _sig(rng.uniform(0.2, 0.7))
        sync = p["mode"] == "sync"
        p["train_gap_s"] = _sig(math.exp(rng.uniform(math.log(15.0), math.log(300.0)))) if sync else None
        p["weights_updated_before_s"] = rng.choice(WEIGHT_REPORTS) if sync else None
        p["prefill_target_util"] = _sig(rng.uniform(*PREFILL_UTIL[p["prefill_load"]]))
        kv = DECODE_KV_FRACTION.get(p["decode_kv"])
        p["decode_kv_fraction"] = _sig(rng.uniform(*kv)) if kv else None
        p.update(_capacities(p))
        settings.append(p)
    return settings


def task_for(p: dict):
    base = TASKS[p["base"]]
    tools = tuple(replace(t, duration_s=reshape_duration(t.duration_s, p["tool_shape"], scale=p["tool_scale"],
                                                         param=p["tool_shape_param"],
                                                         spread=p["tool_bimodal_spread"] or 4.0))
                  for t in base.tools)
    n = p["turns"]
    turns = LogNormal(float(n), p["turns_sigma"], 1, max(1.0, round(n * 3.3)))
    sandbox = p["cold_fraction"] is not None
    return replace(base, name=f"{p['base']}-{p['id']}", tools=tools, turns=turns, uses_sandbox=sandbox,
                   prewarm_hit_rate=1.0 - p["cold_fraction"] if sandbox else 1.0)


def rollout_for(p: dict) -> RolloutSetting:
    size = p["group_size"]
    groups = max(1, round(p["live"] / size))
    if p["mode"] == "sync":
        return RolloutSetting("sync", groups, size, InjectionConfig(InjectionPolicy.NONE), train_gap_s=p["train_gap_s"],
                              weights_updated_before_s=p["weights_updated_before_s"])
    return RolloutSetting("async", groups, size, InjectionConfig(InjectionPolicy.GROUP, group_size=size))


def spec_from_params(p: dict) -> WorkloadSpec:
    """The workload of one setting (the hint set and the duration are replay options, read by the caller)."""
    base_engine = EngineModel()
    engine = replace(base_engine, prefill_instances=p["prefill_instances"],
                     prefill_base_s=base_engine.prefill_base_s * p["prefill_slowdown"],
                     prefill_per_token_s=base_engine.prefill_per_token_s * p["prefill_slowdown"],
                     decode_kv_tokens=p["decode_kv_tokens"])
    return WorkloadSpec(task_for(p), engine, rollout_for(p))


def estimate(task, engine: EngineModel, seed: int, plans: int = ESTIMATE_PLANS) -> dict:
    """Per trajectory, from ``plans`` plans drawn with a seed of their own (no queueing): mean prefill seconds,
    decode KV token-seconds and uncontended duration, and the duration's quantiles."""
    gen = WorkloadGenerator(task, seed + 1_000_003)
    g, tpot = engine.profile(), engine.decode_s_per_token
    work, kv, total = np.zeros(plans), np.zeros(plans), np.zeros(plans)
    for i in range(plans):
        plan = gen.plan(i)
        t = plan.dispatch_s + plan.startup_s + plan.first_request_s + plan.reward_s
        for k, turn in enumerate(plan.turns):
            x = plan.prompt_tokens_at(k)
            decode = turn.output_tokens * tpot
            work[i] += g(x)
            kv[i] += decode * (x + turn.output_tokens)
            t += g(x) + decode + HINT_DELAY_S + turn.tool_s + turn.agent_overhead_s
        total[i] = t
    return {"prefill_s": float(work.mean()), "kv_token_s": float(kv.mean()), "duration_s": float(total.mean()),
            "duration_q": {q: float(np.quantile(total, q)) for q in (0.5, 0.9, 0.99)}}


def _capacities(p: dict) -> dict:
    est = estimate(task_for(p), EngineModel(), p["seed"])
    live = max(1, round(p["live"] / p["group_size"])) * p["group_size"]
    demand = live * est["prefill_s"] / est["duration_s"]  # instance-seconds of prefill per second at base speed
    target = p["prefill_target_util"]
    instances = min(MAX_PREFILL_INSTANCES, max(1, round(demand / target)))
    # a loaded target one instance still serves too fast (few, short prompts): slow prefill down instead
    slowdown = _sig(target * instances / demand) if target >= 0.5 and demand / instances < 0.5 * target else 1.0
    out = {"prefill_instances": instances, "prefill_slowdown": slowdown,
           "est_prefill_util": _sig(demand * slowdown / instances),
           "est_decode_kv_demand": _sig(live * est["kv_token_s"] / est["duration_s"])}
    frac = p["decode_kv_fraction"]
    out["decode_kv_tokens"] = None if frac is None else float(round(frac * out["est_decode_kv_demand"]))
    duration = DURATION_S
    if p["mode"] == "sync":  # room for three steps and their gaps, where a step's slowest trajectory allows it
        step = est["duration_q"][0.99 if live >= 100 else 0.9]
        duration = min(MAX_DURATION_S, max(DURATION_S, 3.0 * (step + p["train_gap_s"])))
    out["est_trajectory_s"] = _sig(est["duration_s"])
    out["duration_s"] = float(math.ceil(duration / 100.0) * 100)
    return out
