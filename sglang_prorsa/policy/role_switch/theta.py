"""θ^P as a model (§4.2): prefill busy time as a function of the work in a busy interval, fitted continuously.

θ^P converts Ŵ^P (full-prompt tokens, cached prefixes included) into prefill instances in Eq. 1. The paper measures it
from completed, uninterrupted busy intervals "with comparable prompt-length distributions and average prefix-cache hit
ratios". Bucketing those two (the old ThroughputEstimator) made θ^P jump ~9x when the hit ratio crossed a bucket edge.
Here one model covers every mix instead: the busy seconds of an interval are

    s ≈ c_req·r + c_new·n + c_cached·h + c_attn·(n·h + n²/2)/r

with r requests, n newly computed tokens, h cached (prefix-hit) tokens. The terms: per-request overhead (scheduling,
chunk tails), per new token (GEMMs, MoE), per cached token (prefix matching, KV reads), and attention of the new tokens
over their context, with the interval's mean request standing in for each request (token i of a request attends to
h_req + i earlier tokens). θ for a workload mix is then full-prompt tokens over modelled seconds,

    θ(n, h) = (n + h) / s(n, h, r)        (tokens per busy instance-second; r from the mean prompt seen so far)

and the *cold* θ of a prompt of x tokens is θ(x, 0): re-prefill of a lost prefix cache is costed at it.

Fit: weighted least squares with exponential forgetting (half-life in samples), pulled toward a prior from offline
profiling by a ridge term worth ``prior_weight`` pseudo-intervals, so the model starts at the profile, follows the
measured intervals as they come, and keeps the profile along directions the samples never excite (e.g. the cached
term before any prefix hit). Weights are 1/s (durations have noise roughly proportional to their length). Coefficients
are kept >= 0 by refitting without any that comes out negative. Samples are what the server measures per prefill
instance: ``(instance_id, new_tokens_computed, cached_tokens, requests, busy_seconds)``, each from an idle instance
until idle again (SPEC.md "Allocation"), a long busy period in slices of about ``MAX_SAMPLE_S``.

Beyond the paper: the continuous model replaces the paper's profile buckets; the cold θ for lost caches is ours.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

FEATURES = ("per_request_s", "per_new_token_s", "per_cached_token_s", "attention_s")
# A busy period longer than this is reported in slices (each from its start, or the previous slice's end, to the end
# of the first batch past this long that finished a request), so θ keeps learning while an instance never idles: a
# saturated prefill instance is exactly when the allocator needs θ at the current mix, and its cache hits can collapse
# then (one instance cannot hold every live trajectory's prefix). Without slices θ stays at the mix of the last lighter
# period (traced in the simulator: one prefill instance held for 4,000 s with θ 9x its real rate). Beyond the paper,
# whose samples are idle-to-idle intervals.
MAX_SAMPLE_S = 10.0


@dataclass(frozen=True)
class ThetaSample:
    """One completed busy interval of one prefill instance."""

    instance_id: str
    new_tokens: int  # prompt tokens computed in the interval (prefix hits excluded)
    cached_tokens: int  # prompt tokens served from the prefix cache
    requests: int  # requests whose prefill completed in the interval
    # Busy instance-seconds. An instance with several attention-DP ranks (one scheduler each) should report the sum
    # of its ranks' busy seconds over the rank count: wall time would count one busy rank as a fully busy instance
    # and make θ the speed of one rank at light load.
    busy_seconds: float

    def __post_init__(self) -> None:
        for name in ("new_tokens", "cached_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) or self.requests < 1:
            raise ValueError(f"requests must be an integer >= 1, got {self.requests!r}")
        if not (isinstance(self.busy_seconds, (int, float)) and math.isfinite(self.busy_seconds)
                and self.busy_seconds > 0):
            raise ValueError(f"busy_seconds must be finite and > 0, got {self.busy_seconds!r}")

    @property
    def prompt_tokens(self) -> float:
        return self.new_tokens + self.cached_tokens


def features(new_tokens: float, cached_tokens: float, requests: float) -> tuple[float, float, float, float]:
    """The model's regressors for an interval (see module docstring)."""
    r = max(requests, 1e-9)
    return (requests, new_tokens, cached_tokens, (new_tokens * cached_tokens + new_tokens * new_tokens / 2) / r)


@dataclass(frozen=True)
class ThetaConfig:
    """Prior coefficients (seconds per unit of each feature) and how fast measurements replace them.

    ``reference_prompt_tokens``: the prompt length the prior was profiled at; it scales the prior's strength and is
    the mean prompt assumed until samples say otherwise."""

    per_request_s: float = 0.0
    per_new_token_s: float = 1.0 / 20_000.0
    per_cached_token_s: float = 0.0
    attention_s: float = 0.0
    reference_prompt_tokens: float = 4096.0
    prior_weight: float = 2.0  # pseudo-intervals the prior is worth; 0 = data only
    half_life_samples: float = 64.0  # a sample's weight halves after this many newer ones
    min_busy_s: float = 0.0  # shorter intervals are dropped (timer noise dominates them)

    def __post_init__(self) -> None:
        for name in FEATURES:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.per_request_s + self.per_new_token_s <= 0:
            raise ValueError("per_request_s + per_new_token_s must be > 0: a prefill cannot take no time")
        if not self.reference_prompt_tokens > 0:
            raise ValueError(f"reference_prompt_tokens must be > 0, got {self.reference_prompt_tokens}")
        if self.prior_weight < 0 or self.half_life_samples <= 0 or self.min_busy_s < 0:
            raise ValueError("prior_weight >= 0, half_life_samples > 0 and min_busy_s >= 0 required")

    @classmethod
    def from_theta(cls, theta: float, prompt_tokens: float = 4096.0, **kw) -> ThetaConfig:
        """A flat prior: ``theta`` full-prompt tokens/s/instance whatever the mix (no overhead, no cache credit)."""
        if not (math.isfinite(theta) and theta > 0):
            raise ValueError(f"theta must be finite and > 0, got {theta}")
        return cls(per_new_token_s=1.0 / theta, reference_prompt_tokens=prompt_tokens, **kw)

    @classmethod
    def from_profile(cls, points: Sequence[tuple[float, float]], **kw) -> ThetaConfig:
        """Prior fitted to profiled cold prefills: (prompt tokens, seconds of one request alone on an instance)."""
        rows = [(features(x, 0.0, 1.0), s) for x, s in points if x > 0 and s > 0]
        if len(rows) < 1:
            raise ValueError("from_profile needs at least one (prompt_tokens > 0, seconds > 0) point")
        # Cold profiles carry no information on the cached term; fit the other three, cached stays 0.
        coef = _nonnegative_solve([[x[0], x[1], x[3]] for x, _ in rows], [s for _, s in rows],
                                  [1.0 / s for _, s in rows], ridge=[0.0] * 3, anchor=[0.0] * 3)
        if coef[0] + coef[1] <= 0:  # one point fitted by attention alone: keep a linear floor
            x, s = points[0]
            coef = [0.0, s / x, 0.0]
        mean_x = sum(x for x, _ in points) / len(points)
        return cls(per_request_s=coef[0], per_new_token_s=coef[1], attention_s=coef[2],
                   reference_prompt_tokens=kw.pop("reference_prompt_tokens", mean_x), **kw)

    @property
    def prior(self) -> tuple[float, ...]:
        return tuple(getattr(self, name) for name in FEATURES)


class ThetaModel:
    """θ(new tokens, cached tokens) per prefill instance, fed by busy-interval samples. Pure: no clock needed."""

    def __init__(self, config: ThetaConfig) -> None:
        self.config = config
        self._decay = 0.5 ** (1.0 / config.half_life_samples)
        k = len(FEATURES)
        self._xtx = [[0.0] * k for _ in range(k)]  # Σ decay^age · w · x xᵀ
        self._xty = [0.0] * k
        self._tokens = self._cached = self._requests = self._weight = 0.0  # decayed sums for the mean mix
        self._coef = list(config.prior)
        self._stale = False
        self.samples = 0
        self.rejected = 0
        self.per_instance: Counter[str] = Counter()
        ref = features(config.reference_prompt_tokens, config.reference_prompt_tokens, 1.0)
        s_ref = max(sum(c * x for c, x in zip(config.prior, ref)), 1e-12)
        # Ridge worth prior_weight reference intervals on each coefficient, in the units of the weighted fit.
        self._ridge = [config.prior_weight * x * x / s_ref for x in ref]

    # ----- measurements -----
    def observe(self, sample: ThetaSample) -> bool:
        """Add one busy interval; False (and counted) when it is too short to trust."""
        if sample.busy_seconds <= self.config.min_busy_s:
            self.rejected += 1
            return False
        x = features(sample.new_tokens, sample.cached_tokens, sample.requests)
        w = 1.0 / sample.busy_seconds
        d = self._decay
        for i, xi in enumerate(x):
            row = self._xtx[i]
            for j, xj in enumerate(x):
                row[j] = d * row[j] + w * xi * xj
            self._xty[i] = d * self._xty[i] + w * xi * sample.busy_seconds
        self._tokens = d * self._tokens + sample.prompt_tokens
        self._cached = d * self._cached + sample.cached_tokens
        self._requests = d * self._requests + sample.requests
        self._weight = d * self._weight + 1.0
        self.samples += 1
        self.per_instance[sample.instance_id] += 1
        self._stale = True  # refitted when next read: samples arrive far more often than θ is asked for
        return True

    # ----- the model -----
    def _fit(self) -> list[float]:
        if self._stale:
            self._coef = _nonnegative_solve(self._xtx, self._xty, None, ridge=self._ridge,
                                            anchor=list(self.config.prior))
            self._stale = False
        return self._coef

    @property
    def coefficients(self) -> dict[str, float]:
        return dict(zip(FEATURES, self._fit()))

    def seconds(self, new_tokens: float, cached_tokens: float = 0.0, requests: float | None = None) -> float:
        """Modelled busy instance-seconds to prefill this work (``requests`` defaults to the mean prompt so far)."""
        if requests is None:
            requests = max((new_tokens + cached_tokens) / self.mean_prompt_tokens(), 1e-9)
        return sum(c * x for c, x in zip(self._fit(), features(new_tokens, cached_tokens, requests)))

    def theta(self, new_tokens: float, cached_tokens: float = 0.0, requests: float | None = None) -> float:
        """θ: full-prompt tokens per busy second per instance for this mix (the mean-prompt mix when both are 0)."""
        if new_tokens < 0 or cached_tokens < 0:
            raise ValueError("new_tokens and cached_tokens must be >= 0")
        if new_tokens + cached_tokens <= 0:
            x = self.mean_prompt_tokens()
            new_tokens, cached_tokens = x * (1 - self.hit_ratio()), x * self.hit_ratio()
        seconds = self.seconds(new_tokens, cached_tokens, requests)
        return (new_tokens + cached_tokens) / seconds if seconds > 0 else math.inf

    def theta_cold(self, prompt_tokens: float | None = None) -> float:
        """θ of prompts with nothing cached (re-prefill after a weight update or a lost prefix cache)."""
        x = self.mean_prompt_tokens() if prompt_tokens is None else prompt_tokens
        return self.theta(x, 0.0, 1.0)

    def theta_mix(self) -> float:
        """θ at the recent mix: mean prompt length and token-weighted prefix-hit ratio of the recent intervals."""
        x, h = self.mean_prompt_tokens(), self.hit_ratio()
        return self.theta(x * (1 - h), x * h, 1.0)

    def refill_seconds(self, cached_tokens: float) -> float:
        """Busy instance-seconds to recompute ``cached_tokens`` of lost prefix cache at cold θ."""
        return cached_tokens / self.theta_cold() if cached_tokens > 0 else 0.0

    def hit_ratio(self) -> float:
        return self._cached / self._tokens if self._tokens > 0 else 0.0

    def mean_prompt_tokens(self) -> float:
        return self._tokens / self._requests if self._requests > 0 else self.config.reference_prompt_tokens

    @property
    def measured(self) -> bool:
        return self.samples > 0

    def snapshot(self) -> dict:
        """JSON-able state for GET /prorsa/decision."""
        return {
            "model": "s = c_req*r + c_new*n + c_cached*h + c_attn*(n*h + n^2/2)/r",
            "coefficients": self.coefficients,
            "prior": dict(zip(FEATURES, self.config.prior)),
            "samples": self.samples,
            "rejected_samples": self.rejected,
            "samples_per_instance": dict(sorted(self.per_instance.items())),
            "mean_prompt_tokens": self.mean_prompt_tokens(),
            "hit_ratio": self.hit_ratio(),
            "theta_mix": self.theta_mix(),
            "theta_cold": self.theta_cold(),
        }


def _nonnegative_solve(xtx: list[list[float]], xty: list[float], weights: list[float] | None, *,
                       ridge: list[float], anchor: list[float]) -> list[float]:
    """argmin Σ w (y - c·x)² + Σ ridge_k (c_k - anchor_k)² with c >= 0.

    With ``weights`` given, ``xtx`` are design rows and ``xty`` targets; otherwise they are the normal-equation sums.
    Coefficients that come out negative are fixed at 0 and the rest refitted (a small active set). The regressors
    span ~12 orders of magnitude (requests vs token pairs), so each is scaled to a unit diagonal before solving."""
    if weights is not None:
        rows, ys = xtx, xty
        k = len(rows[0])
        xtx = [[sum(w * r[i] * r[j] for r, w in zip(rows, weights)) for j in range(k)] for i in range(k)]
        xty = [sum(w * r[i] * y for r, y, w in zip(rows, ys, weights)) for i in range(k)]
    k = len(xty)
    diag = [xtx[i][i] + ridge[i] for i in range(k)]
    scale = [math.sqrt(d) if d > 0 else 0.0 for d in diag]
    active = [i for i in range(k) if scale[i] > 0]  # a term with no data and no prior weight cannot be fitted
    while active:
        a = [[(xtx[i][j] + (ridge[i] if i == j else 0.0)) / (scale[i] * scale[j]) for j in active] for i in active]
        b = [(xty[i] + ridge[i] * anchor[i]) / scale[i] for i in active]
        sol = _solve(a, b)
        if sol is None:  # collinear data and no prior on these terms: drop the last one
            active = active[:-1]
            continue
        sol = [v / scale[i] for i, v in zip(active, sol)]
        if all(v >= 0 for v in sol):
            out = [0.0] * k
            for i, v in zip(active, sol):
                out[i] = v
            return out
        active = [i for i, v in zip(active, sol) if v >= 0]
    return [0.0] * k


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on a unit-diagonal system; None when (nearly) singular."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-10:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x
