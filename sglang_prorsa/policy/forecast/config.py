"""Predictor configuration: what the trainer tells the engine (``POST /lifecycle/config``) plus tuning knobs.

Trainer-facing fields (issue 3): the injection policy (``replace_on_reward``; ``fixed_rate`` with ``rate_per_s``;
``group`` with ``group_size``; ``sync``, synchronous steps with the next step forecast, optional ``step_size``;
``none``, nothing injected), ``default_prompt_tokens`` (x_hat of a new sample, B.2 Eq. 5) and ``horizon_s`` (S,
default 10 s, Appendix B.1; the server sets it at construction and reports it with every forecast; a server launched
with ``--prorsa-horizon`` keeps it fixed, refusing another value with ``FixedSettingError``, see
``LifecycleControlPlane.configure``). Engine-facing
fields: the prefill instances, the profiled g(x) and the KV page size for kappa_D(x) (B.7). The rest are priors used
until enough history exists, and the bias-correction knobs.

JSON form accepted by ``apply_config_update`` (all keys optional, merged into the current config)::

    {"horizon_s": 10, "default_prompt_tokens": 4096,
     "injection": {"policy": "fixed_rate", "rate_per_s": 2.0},          # or "injection": "replace_on_reward"
     "prefill_instances": ["p0", "p1"], "kv_page_size": 64,
     "prefill_profile": {"points": [[1024, 0.05], [32768, 1.4]]},    # or {"base_s", "per_token_s", "per_token2_s"}
     "combiner_members": ["lifecycle", "persistence", "timeseries"],  # the served forecast (combiner.py)
     "combiner_half_life_windows": 4, "combiner_selection_margin": 0.2, "combiner_noise_half_life_windows": 12}
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sglang_prorsa.policy.forecast.combiner import MEMBERS
from sglang_prorsa.policy.forecast.profile import PrefillTimeProfile
from sglang_prorsa.policy.forecast.sampler import InjectionConfig, InjectionPolicy
from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S


class ConfigError(ValueError):
    status = 422  # a malformed value

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"field '{field_name}': {message}")
        self.field = field_name


class FixedSettingError(ConfigError):
    """A well-formed value for a setting the running process fixed at start-up (the horizon S on a server: its flag
    is S's one source), different from the value in force."""

    status = 409


@dataclass(frozen=True)
class PredictorConfig:
    horizon_s: float = DEFAULT_HORIZON_S
    injection: InjectionConfig = field(default_factory=InjectionConfig)
    default_prompt_tokens: int | None = None  # None: learn x_hat from first requests
    prefill_instances: tuple[str, ...] = ()
    prefill_profile: PrefillTimeProfile = field(default_factory=PrefillTimeProfile)
    kv_page_size: int = 1
    tool_ema_alpha: float = 0.1  # Eq. 9 (the EMA is kept for reference; the forecast uses survival curves)
    min_class_samples: int = 5  # first prompts seen before their mean replaces default_prompt_tokens
    min_survival_samples: int = 32  # completions before a finer duration class's survival curve is trusted
    history_per_class: int = 2048
    # priors: mean durations (exponential) used until a class has completions
    reward_prior_s: float = 10.0
    prewarm_startup_prior_s: float = 3.0
    cold_startup_prior_s: float = 30.0
    launch_delay_prior_s: float = 2.0
    tool_prior_s: float = 5.0
    ready_wait_prior_s: float = 0.5
    post_tool_prior_s: float = 0.5
    handoff_prior_s: float = 0.5  # decode_end -> tool_start: the trainer's hint follows the response
    decode_prior_s: float = 10.0
    resend_prior_s: float = 1.0
    train_gap_prior_s: float = 60.0  # sync: last reward of a step -> the next step's first sample
    # bias correction (B.8), per source, only on predicted parts, gated (issue 10 item 2)
    bias_enabled: bool = True
    bias_beta: float = 0.2
    bias_bounds: tuple[float, float] = (0.5, 2.0)
    bias_gate_windows: int = 20  # recent scored windows the gate compares corrected and raw error over
    bias_gate_min_windows: int = 8  # fewer scored windows than this: no correction
    bias_gate_margin: float = 0.05  # the correction must cut the recent error by this fraction to be applied
    recent_windows: int = 30
    # the served forecast (combiner.py, beyond the paper): members, the half-life of their discounted errors, the
    # margin by which the best member must lead to be served alone, the Kalman member's noise-estimate half-life
    combiner_members: tuple[str, ...] = MEMBERS
    combiner_half_life_windows: float = 4.0
    combiner_selection_margin: float = 0.2
    combiner_noise_half_life_windows: float = 12.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise ConfigError("horizon_s", f"must be > 0, got {self.horizon_s}")
        if self.default_prompt_tokens is not None and self.default_prompt_tokens < 0:
            raise ConfigError("default_prompt_tokens", "must be >= 0")
        if self.kv_page_size < 1:
            raise ConfigError("kv_page_size", "must be >= 1")
        if not 0.0 <= self.bias_gate_margin < 1.0:
            raise ConfigError("bias_gate_margin", f"must be in [0, 1), got {self.bias_gate_margin}")
        for name in ("min_class_samples", "min_survival_samples", "history_per_class", "bias_gate_windows",
                     "recent_windows"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be >= 1")
        for name in ("combiner_half_life_windows", "combiner_noise_half_life_windows"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(name, f"must be > 0, got {value}")
        if not 0.0 <= self.combiner_selection_margin < 1.0:
            raise ConfigError("combiner_selection_margin", f"must be in [0, 1), got {self.combiner_selection_margin}")
        members = self.combiner_members
        if not members or len(set(members)) != len(members) or set(members) - set(MEMBERS):
            raise ConfigError("combiner_members", f"must be distinct names among {', '.join(MEMBERS)}, got {members}")

    def to_dict(self) -> dict[str, Any]:
        prof = self.prefill_profile
        return {
            "horizon_s": self.horizon_s,
            "injection": {
                "policy": self.injection.policy.value,
                "rate_per_s": self.injection.rate_per_s,
                "group_size": self.injection.group_size,
                **({"step_size": self.injection.step_size} if self.injection.step_size else {}),
            },
            "default_prompt_tokens": self.default_prompt_tokens,
            "prefill_instances": list(self.prefill_instances),
            "prefill_profile": {
                "points": [list(p) for p in prof.points],
                "base_s": prof.base_s,
                "per_token_s": prof.per_token_s,
                "per_token2_s": prof.per_token2_s,
            },
            "kv_page_size": self.kv_page_size,
            # the other settings POST /lifecycle/config takes: what GET returns posts back unchanged
            "tool_ema_alpha": self.tool_ema_alpha,
            "bias_enabled": self.bias_enabled,
            "combiner_members": list(self.combiner_members),
            "combiner_half_life_windows": self.combiner_half_life_windows,
            "combiner_selection_margin": self.combiner_selection_margin,
            "combiner_noise_half_life_windows": self.combiner_noise_half_life_windows,
        }


def _number(payload: dict, name: str, *, integer: bool = False, minimum: float = 0.0) -> float | int:
    value = payload[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, f"must be a number, got {value!r:.40}")
    if integer and not float(value).is_integer():
        raise ConfigError(name, f"must be an integer, got {value}")
    if value < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {value}")
    return int(value) if integer else float(value)


def _injection(value: Any) -> InjectionConfig:
    if isinstance(value, str):
        value = {"policy": value}
    if not isinstance(value, dict):
        raise ConfigError("injection", "must be a policy name or an object with 'policy'")
    unknown = sorted(set(value) - {"policy", "rate_per_s", "group_size", "step_size"})
    if unknown:
        raise ConfigError(f"injection.{unknown[0]}", "unknown field")
    try:
        policy = InjectionPolicy(value.get("policy"))
    except ValueError:
        names = ", ".join(p.value for p in InjectionPolicy)
        raise ConfigError("injection.policy", f"must be one of {names}, got {value.get('policy')!r:.40}") from None
    rate = _number(value, "rate_per_s") if "rate_per_s" in value else 0.0
    size = _number(value, "group_size", integer=True) if "group_size" in value else 0
    step = _number(value, "step_size", integer=True) if "step_size" in value else 0
    try:
        return InjectionConfig(policy, float(rate), int(size), int(step))
    except ValueError as exc:
        raise ConfigError("injection", str(exc)) from None


def _profile(value: Any) -> PrefillTimeProfile:
    if not isinstance(value, dict):
        raise ConfigError("prefill_profile", "must be an object")
    unknown = sorted(set(value) - {"points", "base_s", "per_token_s", "per_token2_s"})
    if unknown:
        raise ConfigError(f"prefill_profile.{unknown[0]}", "unknown field")
    kwargs: dict[str, Any] = {k: _number(value, k) for k in ("base_s", "per_token_s", "per_token2_s") if k in value}
    if "points" in value:
        points = value["points"]
        ok = isinstance(points, list) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)
            for p in points
        )
        if not ok:
            raise ConfigError("prefill_profile.points", "must be a list of [prompt_tokens, seconds] pairs")
        kwargs["points"] = tuple((float(x), float(s)) for x, s in points)
    try:
        return PrefillTimeProfile(**kwargs)
    except ValueError as exc:
        raise ConfigError("prefill_profile", str(exc)) from None


def apply_config_update(config: PredictorConfig, payload: Any) -> PredictorConfig:
    """Merge a ``/lifecycle/config`` body into ``config``; raises ``ConfigError`` naming the offending field."""
    if not isinstance(payload, dict):
        raise ConfigError("body", "must be a JSON object")
    changes: dict[str, Any] = {}
    for name, value in payload.items():
        if name == "horizon_s":
            changes[name] = _number(payload, name, minimum=1e-3)
        elif name == "default_prompt_tokens":
            changes[name] = None if value is None else _number(payload, name, integer=True)
        elif name == "injection":
            changes[name] = _injection(value)
        elif name == "prefill_instances":
            if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
                raise ConfigError(name, "must be a list of instance ids")
            changes[name] = tuple(str(v) for v in value)
        elif name == "prefill_profile":
            changes[name] = _profile(value)
        elif name == "kv_page_size":
            changes[name] = _number(payload, name, integer=True, minimum=1)
        elif name == "tool_ema_alpha":
            alpha = _number(payload, name)
            if not 0 < alpha <= 1:
                raise ConfigError(name, "must be in (0, 1]")
            changes[name] = alpha
        elif name == "bias_enabled":
            if not isinstance(value, bool):
                raise ConfigError(name, "must be a boolean")
            changes[name] = value
        elif name in ("combiner_half_life_windows", "combiner_noise_half_life_windows"):
            changes[name] = _number(payload, name, minimum=1e-3)
        elif name == "combiner_selection_margin":
            margin = _number(payload, name)
            if margin >= 1:
                raise ConfigError(name, f"must be in [0, 1), got {margin}")
            changes[name] = margin
        elif name == "combiner_members":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(name, f"must be a list of member names among {', '.join(MEMBERS)}")
            changes[name] = tuple(value)  # names and duplicates are checked by PredictorConfig
        else:
            raise ConfigError(name, "unknown field")
    return dataclasses.replace(config, **changes)  # __post_init__ checks what needs the whole config
