"""Profiled prefill time g(x) and decode KV footprint kappa_D(x) (paper B.7).

``g(x)`` is the measured prefill execution time of a prompt of full length x (cached prefix included) on one prefill
instance under the selected configuration. It is given as profiled points and interpolated piecewise-linearly
(extrapolated with the last segment's slope), or as ``base_s + per_token_s * x + per_token2_s * x^2`` when only a
fit is known (the quadratic term models attention cost on long prompts).

``kappa_D(x)`` is the KV-cache footprint (in token slots) a request of prompt length x occupies when admitted to
decode: x rounded up to whole pages, since the paged allocator hands out full pages.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PrefillTimeProfile:
    points: tuple[tuple[float, float], ...] = ()  # (prompt tokens, seconds), sorted by tokens
    base_s: float = 0.01
    per_token_s: float = 1.0 / 20_000.0  # ~20k full-prompt tokens/s per instance when no profile is given
    per_token2_s: float = 0.0
    _xs: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)
    _arrays: tuple = field(default=(), init=False, repr=False, compare=False)  # ``many``'s (xs, seconds), kept

    def __post_init__(self) -> None:
        pts = tuple(sorted((float(x), float(s)) for x, s in self.points))
        if any(x < 0 or s < 0 for x, s in pts):
            raise ValueError("profile points must be non-negative")
        if len({x for x, _ in pts}) != len(pts):
            raise ValueError("profile points need distinct prompt lengths")
        if min(self.base_s, self.per_token_s, self.per_token2_s) < 0:
            raise ValueError("profile coefficients must be non-negative")
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "_xs", tuple(x for x, _ in pts))

    def __call__(self, tokens: float) -> float:
        """g(x) in seconds."""
        x = max(0.0, float(tokens))
        pts = self.points
        if not pts:
            return self.base_s + self.per_token_s * x + self.per_token2_s * x * x
        if len(pts) == 1:  # one measurement: proportional to length through it
            x0, s0 = pts[0]
            return s0 * x / x0 if x0 > 0 else s0
        i = bisect.bisect_right(self._xs, x)
        i = min(max(i, 1), len(pts) - 1)  # segment [i-1, i]; outside the range extend the end segments
        (xa, sa), (xb, sb) = pts[i - 1], pts[i]
        return max(0.0, sa + (sb - sa) * (x - xa) / (xb - xa))

    def many(self, tokens: np.ndarray) -> np.ndarray:
        """g(x) for an array of prompt lengths (the same function as calling it on each)."""
        x = np.maximum(np.asarray(tokens, np.float64), 0.0)
        pts = self.points
        if not pts:
            return self.base_s + self.per_token_s * x + self.per_token2_s * x * x
        if len(pts) == 1:
            x0, s0 = pts[0]
            return s0 * x / x0 if x0 > 0 else np.full_like(x, s0)
        if not self._arrays:
            object.__setattr__(self, "_arrays", (np.array(self._xs), np.array([s for _, s in pts])))
        xs, ss = self._arrays
        i = np.clip(np.searchsorted(xs, x, side="right"), 1, len(pts) - 1)
        xa, xb, sa, sb = xs[i - 1], xs[i], ss[i - 1], ss[i]
        return np.maximum(0.0, sa + (sb - sa) * (x - xa) / (xb - xa))


@dataclass(frozen=True)
class KVFootprint:
    page_size: int = 1

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")

    def __call__(self, tokens: float) -> float:
        """kappa_D(x) in KV token slots."""
        return float(math.ceil(max(0.0, float(tokens)) / self.page_size) * self.page_size)

    def many(self, tokens: np.ndarray, *, overwrite: bool = False) -> np.ndarray:
        """kappa_D of each length; ``overwrite``: ``tokens`` is a float64 array of lengths >= 0 that the caller no
        longer needs, computed in place (no copy)."""
        x = tokens if overwrite else np.maximum(np.asarray(tokens, np.float64), 0.0)
        if self.page_size == 1:  # x / 1 and x * 1 are exact: the same numbers, two passes fewer
            return np.ceil(x, out=x)
        x /= self.page_size
        np.ceil(x, out=x)
        x *= self.page_size
        return x
