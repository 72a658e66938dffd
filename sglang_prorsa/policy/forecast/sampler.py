"""Data-sampler forecast: new samples launched because rewards complete (paper B.2, Eq. 2-5).

    q_i      = P(T_rew < e_i + S | T_rew > e_i)            for i in R_t (trajectories in reward)      (Eq. 2)
    N_pass   = p_hat * sum_i q_i                                                                        (Eq. 3)
    N_samp   = f(N_pass)                                                                                (Eq. 4)
    S_pw     = max(0, S - d_hat);  re-evaluate Eq. 2-4 over S_pw with the same sampler state
    W_samp   = N_samp(S_pw) * x_hat        (0 when S_pw = 0)                                            (Eq. 5)

The injection rule f is pluggable. It sees each reward candidate's q and its group's completion state, because the
paper evaluates f "with the current sampler state, including known group-completion information, held fixed"; for
nonlinear / group rules this is a plug-in approximation, not an exact expectation (as the paper says).
Only members still in reward are summed; members past reward are gone from R_t and members in decode or tool are
excluded (one-step assumption). New samples are assumed to hit the prewarm pool (their delay is d_hat).

The predictor uses this module's policies, p_hat and d_hat; the sampler's arrivals themselves are computed in
samples.py (the launch delay as a distribution chained after each reward, beyond the paper). ``forecast_sampler``
and the ``InjectionRule`` classes are the first cut's Eq. 2-5, kept as the reference.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, Sequence

import numpy as np


class InjectionPolicy(str, Enum):
    REPLACE_ON_REWARD = "replace_on_reward"  # each admitted trajectory is replaced: f(n) = n
    FIXED_RATE = "fixed_rate"  # refresh at a configured rate, independent of rewards
    GROUP = "group"  # a whole GRPO group is launched when a group's members have all finished reward
    NONE = "none"  # synchronous rollout: nothing is injected inside a step (extension beyond the paper's list)
    # synchronous rollout with the next step forecast: when the step's last trajectories finish, the next step's batch
    # (``step_size`` samples, or as many as the last step launched) arrives after a learned training gap (beyond B.2)
    SYNC = "sync"


@dataclass(frozen=True)
class InjectionConfig:
    policy: InjectionPolicy = InjectionPolicy.REPLACE_ON_REWARD
    rate_per_s: float = 0.0  # fixed_rate
    group_size: int = 0  # group
    step_size: int = 0  # sync: samples per step (0: learn it from the last step)

    def __post_init__(self) -> None:
        if self.policy is InjectionPolicy.FIXED_RATE and not self.rate_per_s > 0:
            raise ValueError("fixed_rate needs rate_per_s > 0")
        if self.policy is InjectionPolicy.GROUP and self.group_size < 1:
            raise ValueError("group needs group_size >= 1")
        if self.step_size < 0:
            raise ValueError("step_size must be >= 0")


@dataclass(frozen=True, slots=True)
class RewardCandidate:
    q: float  # probability of completing reward within the horizon being evaluated
    group_id: str | None
    group_complete_if_done: bool  # no live member of the group is outside reward


class InjectionRule(Protocol):
    def launches(self, candidates: Sequence[RewardCandidate], p_hat: float, horizon_s: float) -> float:
        """Expected number of sample launches decided within ``horizon_s``."""


class ReplaceOnReward:
    def launches(self, candidates: Sequence[RewardCandidate], p_hat: float, horizon_s: float) -> float:
        return p_hat * sum(c.q for c in candidates)


class FixedRate:
    def __init__(self, rate_per_s: float) -> None:
        self.rate_per_s = rate_per_s

    def launches(self, candidates: Sequence[RewardCandidate], p_hat: float, horizon_s: float) -> float:
        return self.rate_per_s * horizon_s


class GroupReplenish:
    """A group's quota frees when all its members have finished reward; then ``group_size`` samples launch.

    Plug-in: P(group completes in the horizon) = prod of its in-reward members' q (independent completions), and only
    groups with no member outside reward can complete. p_hat is not applied: the quota frees whether or not the
    group is admitted to training.
    """

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def launches(self, candidates: Sequence[RewardCandidate], p_hat: float, horizon_s: float) -> float:
        completion: dict[str, float] = {}
        ungrouped = 0.0
        for c in candidates:
            if c.group_id is None:
                ungrouped += c.q  # a trajectory without a group is a group of one
            elif c.group_complete_if_done:
                completion[c.group_id] = completion.get(c.group_id, 1.0) * c.q
        return self.group_size * (sum(completion.values()) + ungrouped)


class NoInjection:
    def launches(self, candidates: Sequence[RewardCandidate], p_hat: float, horizon_s: float) -> float:
        return 0.0


def make_injection_rule(config: InjectionConfig) -> InjectionRule:
    if config.policy is InjectionPolicy.FIXED_RATE:
        return FixedRate(config.rate_per_s)
    if config.policy is InjectionPolicy.GROUP:
        return GroupReplenish(config.group_size)
    if config.policy is InjectionPolicy.NONE:
        return NoInjection()
    return ReplaceOnReward()


class AcceptanceRate:
    """p_hat: fraction of reward-completed trajectories admitted to training, over the last ``window`` outcomes.

    With no outcomes yet p_hat = 1 (the paper's "all reward-completed trajectories are eligible" case).
    """

    def __init__(self, window: int = 512) -> None:
        self._outcomes: deque[bool] = deque(maxlen=window)
        self._accepted = 0

    def observe(self, accepted: bool) -> None:
        if len(self._outcomes) == self._outcomes.maxlen:
            self._accepted -= self._outcomes[0]
        self._outcomes.append(bool(accepted))
        self._accepted += bool(accepted)

    @property
    def value(self) -> float:
        return self._accepted / len(self._outcomes) if self._outcomes else 1.0


class LaunchDelay:
    """d_hat: online mean delay from an injection decision to the first request joining ready (prewarmed)."""

    def __init__(self, prior_s: float = 0.0, window: int = 256) -> None:
        self.prior_s = prior_s
        self._delays: deque[float] = deque(maxlen=window)
        self._sum = 0.0

    def observe(self, delay_s: float) -> None:
        if len(self._delays) == self._delays.maxlen:
            self._sum -= self._delays[0]
        self._delays.append(float(delay_s))
        self._sum += float(delay_s)

    @property
    def value(self) -> float:
        return self._sum / len(self._delays) if self._delays else self.prior_s


@dataclass(frozen=True)
class SamplerForecast:
    n_pass: float  # Eq. 3 over S
    n_samp: float  # Eq. 4 over S (launch decisions in the horizon)
    launch_horizon_s: float  # S_pw
    n_launch: float  # Eq. 4 over S_pw: launches whose first request arrives before t + S
    tokens: float  # Eq. 5
    arrival_offset_s: float  # mean delay from t to those arrivals (for the decode-admission recurrence, B.7)


def forecast_sampler(
    q_full: np.ndarray,
    q_launch: np.ndarray,
    residual_launch: np.ndarray,
    groups: Sequence[tuple[str | None, bool]],
    *,
    rule: InjectionRule,
    p_hat: float,
    launch_delay_s: float,
    horizon_s: float,
    new_prompt_tokens: float,
) -> SamplerForecast:
    """Eq. 2-5 from per-candidate q over S (``q_full``) and over S_pw (``q_launch``, ``residual_launch``)."""
    full = [RewardCandidate(float(q), g, ok) for q, (g, ok) in zip(q_full, groups)]
    n_pass = p_hat * float(np.sum(q_full))
    n_samp = rule.launches(full, p_hat, horizon_s)
    s_pw = max(0.0, horizon_s - launch_delay_s)
    if s_pw <= 0.0:
        return SamplerForecast(n_pass, n_samp, 0.0, 0.0, 0.0, horizon_s)
    short = [RewardCandidate(float(q), g, ok) for q, (g, ok) in zip(q_launch, groups)]
    n_launch = rule.launches(short, p_hat, s_pw)
    weight = float(np.sum(q_launch))
    if isinstance(rule, FixedRate) or weight <= 0.0:
        decision = s_pw / 2.0  # uniform decisions over [t, t + S_pw)
    else:
        decision = float(np.dot(q_launch, residual_launch)) / weight
    return SamplerForecast(n_pass, n_samp, s_pw, n_launch, n_launch * new_prompt_tokens, launch_delay_s + decision)
