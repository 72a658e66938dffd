"""Effective prefill speed θ^P of §4.2: full-prompt tokens per busy instance-second, per workload profile.

Superseded for the controller by theta.py (one continuous model instead of profile buckets, whose edges made θ^P jump
~9x; issue 11). Kept because the adaptive front still measures busy intervals with it; RoleSwitchController accepts
either.

θ^P converts the prefill forecast Ŵ^P into instances in Eq. 1, so it counts tokens the way Ŵ^P does: full prompt
lengths, cached prefix included. Prefix-cache hits show up as shorter service time, not as fewer tokens.

Measurement (SPEC.md "Allocation"). A *busy interval* of one prefill instance runs from the start of service on an
idle instance until its prefill work drains (no request left in service). For a completed, uninterrupted interval:

    tokens  = Σ full prompt lengths of the requests that completed in it, each request once
    seconds = end − start of the interval on that instance

Overlapping requests therefore share the instance's elapsed time instead of each being charged its own latency, and
idle gaps between intervals are never in the denominator. An interval in which a request was aborted or the instance
was interrupted (role switch, failure) is thrown away whole: its tokens and its time would no longer cover the same
requests. θ^P for a profile is the ratio of sums over that profile's most recent intervals; with none it is the
profiled value, and old intervals stay until newer ones push them out, so an idle instance never drives θ^P to zero.

A profile is (prompt-length bucket, prefix-cache-hit bucket) of the interval's completed requests, because the paper
updates θ^P only from intervals "with comparable prompt-length distributions and average prefix-cache hit ratios".
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from sglang_prorsa.policy.clock import Clock


@dataclass(frozen=True, order=True)
class WorkloadProfile:
    prompt_bucket: int  # index into ThroughputConfig.prompt_bucket_edges (0 = shortest)
    cache_hit_bucket: int  # index into ThroughputConfig.cache_hit_bucket_edges (0 = fewest hits)


@dataclass(frozen=True)
class ThroughputConfig:
    profiled_theta: float  # tokens/s/instance from offline profiling; fallback for any profile without its own entry
    profiled_by_profile: Mapping[WorkloadProfile, float] = field(default_factory=dict)
    # Mean full prompt length of an interval: bucket i covers [edges[i-1], edges[i]).
    prompt_bucket_edges: tuple[int, ...] = (2048, 8192, 32768, 131072)
    # Token-weighted prefix-cache hit ratio of an interval, same convention.
    cache_hit_bucket_edges: tuple[float, ...] = (0.25, 0.5, 0.75)
    window_intervals: int = 16  # recent intervals per profile in the ratio of sums
    min_interval_s: float = 0.0  # shorter intervals are dropped (timer noise dominates them)

    def __post_init__(self) -> None:
        if self.profiled_theta <= 0 or any(v <= 0 for v in self.profiled_by_profile.values()):
            raise ValueError("profiled prefill speeds must be positive")
        if self.window_intervals < 1:
            raise ValueError("window_intervals must be at least 1")
        for edges in (self.prompt_bucket_edges, self.cache_hit_bucket_edges):
            if list(edges) != sorted(edges):
                raise ValueError(f"bucket edges must be sorted, got {edges}")


@dataclass
class _BusyInterval:
    start_s: float
    in_service: dict[str, tuple[int, int]] = field(default_factory=dict)  # request id -> (prompt, cached) tokens
    done_requests: int = 0
    done_prompt_tokens: int = 0
    done_cached_tokens: int = 0
    interrupted: bool = False


@dataclass(frozen=True)
class IntervalSample:
    tokens: int
    seconds: float


class ThroughputEstimator:
    """θ^P per workload profile, fed by request start/finish events of prefill instances; time comes from ``clock``."""

    def __init__(self, config: ThroughputConfig, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._open: dict[str, _BusyInterval] = {}  # instance id -> its current busy interval
        self._samples: dict[WorkloadProfile, deque[IntervalSample]] = {}
        self.discarded_intervals = 0

    def profile_of(self, prompt_tokens: float, cached_tokens: float = 0.0, requests: int = 1) -> WorkloadProfile:
        """Profile of ``requests`` requests with ``prompt_tokens`` full-prompt tokens in all, ``cached_tokens`` hits."""
        mean_prompt = prompt_tokens / max(requests, 1)
        hit_ratio = cached_tokens / prompt_tokens if prompt_tokens > 0 else 0.0
        return WorkloadProfile(
            prompt_bucket=bisect.bisect_right(self.config.prompt_bucket_edges, mean_prompt),
            cache_hit_bucket=bisect.bisect_right(self.config.cache_hit_bucket_edges, hit_ratio),
        )

    # ---- events from prefill instances ------------------------------------------------------------------------

    def start(self, instance_id: str, request_id: str, prompt_tokens: int, cached_tokens: int = 0) -> None:
        """Request admitted to prefill service on ``instance_id``; opens a busy interval if the instance was idle."""
        if not 0 <= cached_tokens <= prompt_tokens:
            raise ValueError(f"cached_tokens={cached_tokens} must be within [0, prompt_tokens={prompt_tokens}]")
        interval = self._open.get(instance_id)
        if interval is None:
            interval = self._open[instance_id] = _BusyInterval(start_s=self._clock.now())
        interval.in_service[request_id] = (prompt_tokens, cached_tokens)

    def finish(self, instance_id: str, request_id: str) -> None:
        """Prefill of ``request_id`` completed; closes the interval when the instance has nothing left in service."""
        interval = self._open.get(instance_id)
        if interval is None or request_id not in interval.in_service:
            return  # started before an interruption, or never seen: its time is not in any interval we keep
        prompt, cached = interval.in_service.pop(request_id)
        interval.done_requests += 1
        interval.done_prompt_tokens += prompt
        interval.done_cached_tokens += cached
        if not interval.in_service:
            self._close(instance_id)

    def abort(self, instance_id: str, request_id: str) -> None:
        """Request cancelled mid-prefill (e.g. cancel-and-resend of a switch): the interval no longer counts."""
        interval = self._open.get(instance_id)
        if interval is None or request_id not in interval.in_service:
            return
        del interval.in_service[request_id]
        interval.interrupted = True
        if not interval.in_service:
            self._close(instance_id)

    def interrupt(self, instance_id: str) -> None:
        """The instance stops prefilling (role switch, failure): discard its open interval now."""
        if instance_id in self._open:
            self._open[instance_id].interrupted = True
            self._close(instance_id)

    # ---- estimate --------------------------------------------------------------------------------------------

    def estimate(self, profile: WorkloadProfile) -> float:
        """θ^P for ``profile``: ratio of sums over its recent completed intervals, else the profiled speed."""
        samples = self._samples.get(profile)
        if samples:
            return sum(s.tokens for s in samples) / sum(s.seconds for s in samples)
        return self.config.profiled_by_profile.get(profile, self.config.profiled_theta)

    def is_measured(self, profile: WorkloadProfile) -> bool:
        return bool(self._samples.get(profile))

    def snapshot(self) -> dict:
        """JSON-able view for the server's observability endpoint."""
        return {
            "profiles": {
                f"{p.prompt_bucket}/{p.cache_hit_bucket}": {"theta_p": self.estimate(p), "intervals": len(s)}
                for p, s in sorted(self._samples.items())
            },
            "open_intervals": len(self._open),
            "discarded_intervals": self.discarded_intervals,
        }

    def _close(self, instance_id: str) -> None:
        interval = self._open.pop(instance_id)
        seconds = self._clock.now() - interval.start_s
        if interval.interrupted or interval.done_requests == 0 or seconds <= self.config.min_interval_s:
            self.discarded_intervals += 1
            return
        profile = self.profile_of(interval.done_prompt_tokens, interval.done_cached_tokens, interval.done_requests)
        window = self._samples.setdefault(profile, deque(maxlen=self.config.window_intervals))
        window.append(IntervalSample(tokens=interval.done_prompt_tokens, seconds=seconds))
