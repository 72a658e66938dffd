"""What a role switch costs and what it gains, in GPU-seconds of service (beyond the paper: §4.2 / Appendix C switch
whenever Eq. 1's target moves; we switch only when it pays).

Cost of switching one instance (issue 11: "switch time × the instance's capacity + evicted work + re-prefill of the
prefix cache it loses"):

    downtime   = switch_s × gpus                       the instance serves no role while it switches (Appendix C, ~5 s;
                                                        its own last measured switch when it reported one)
    migration  = move_s × (K_used / C_KV) × gpus        its decode requests stall while their KV is persisted and
                                                        reloaded elsewhere: move_s = K_used · bytes/token ÷ bandwidth,
                                                        weighted by the share of the instance those requests fill
    refill     = reuse · H / θ_cold × m^P              the H prefix-cache tokens it drops that would have been hit
                                                        within the lookahead are prefilled again, cold (θ model,
                                                        theta.py), by some prefill instance of m^P GPUs

Gain of a move (k instances leave role src, j join role dst), over W lookahead windows of S seconds each, with the
demand d_r,w of each role in instances (Eq. 1's a and b, smoothed, plus known bursts) and n_r instances now:

    gain = Σ_w S · [ (min(n_dst + j, d_dst,w) − min(n_dst, d_dst,w))·m_dst − (min(n_src, d_src,w) − min(n_src − k, d_src,w))·m_src ]

i.e. the service the receiving role gets that it needed, minus the service the donor loses that it needed; capacity
beyond demand is worth nothing. ``Demand`` separates work already waiting (a backlog, counted once) from arrivals per
window, and carries unserved work from window to window, so d_r,w depends on n_r (a fluid queue): an instance that
clears a one-time backlog gains that backlog, not the backlog once per window. A switch is worth making when
gain > cost (planner.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_prorsa.policy.role_switch.capacity import InstanceReport, Role


@dataclass(frozen=True)
class CostConfig:
    default_switch_s: float = 5.0  # Appendix C: "around 5 seconds on average"; used until an instance reports its own
    kv_bytes_per_token: float = 0.0  # decode KV size per token; 0 leaves migration out of the cost
    kv_move_gbytes_per_s: float = 0.0  # persist + reload bandwidth for a switched instance's decode KV
    cache_reuse_fraction: float = 1.0  # share of a dropped prefix cache that would have been hit again

    def __post_init__(self) -> None:
        if not (math.isfinite(self.default_switch_s) and self.default_switch_s >= 0):
            raise ValueError(f"default_switch_s must be finite and >= 0, got {self.default_switch_s}")
        if self.kv_bytes_per_token < 0 or self.kv_move_gbytes_per_s < 0:
            raise ValueError("kv_bytes_per_token and kv_move_gbytes_per_s must be >= 0")
        if not 0.0 <= self.cache_reuse_fraction <= 1.0:
            raise ValueError(f"cache_reuse_fraction must be in [0, 1], got {self.cache_reuse_fraction}")


@dataclass(frozen=True)
class SwitchCost:
    """The cost of switching one instance, in GPU-seconds (see module docstring)."""

    instance_id: str
    switch_s: float
    downtime_gpu_s: float
    migration_gpu_s: float
    refill_gpu_s: float

    @property
    def total_gpu_s(self) -> float:
        return self.downtime_gpu_s + self.migration_gpu_s + self.refill_gpu_s

    def to_dict(self) -> dict:
        return {"switch_s": self.switch_s, "downtime_gpu_s": self.downtime_gpu_s,
                "migration_gpu_s": self.migration_gpu_s, "refill_gpu_s": self.refill_gpu_s,
                "total_gpu_s": self.total_gpu_s}


def switch_seconds(report: InstanceReport, config: CostConfig) -> float:
    """How long this instance's switch will take: its last measured switch, else the configured default."""
    measured = report.last_switch_s
    return measured if measured is not None and math.isfinite(measured) and measured >= 0 else config.default_switch_s


def switch_cost(report: InstanceReport, config: CostConfig, refill_seconds_per_token: float,
                prefill_gpus: int, reusable_tokens: float | None = None) -> SwitchCost:
    """Cost of switching ``report``'s instance away from its role now.

    ``refill_seconds_per_token``: prefill instance-seconds per cold token (1/θ_cold); ``prefill_gpus``: m^P;
    ``reusable_tokens``: the prefix hits this instance would serve over the lookahead (its share of the arriving
    prompt tokens x the measured hit ratio). A cache holds finished trajectories too; only hits that would have
    happened are lost. None: every cached token counts (an upper bound)."""
    switch_s = switch_seconds(report, config)
    migration = 0.0
    if report.role is Role.DECODE and report.decode_kv_used > 0 and report.decode_kv_capacity > 0:
        if config.kv_bytes_per_token > 0 and config.kv_move_gbytes_per_s > 0:
            move_s = report.decode_kv_used * config.kv_bytes_per_token / (config.kv_move_gbytes_per_s * 1e9)
            share = min(1.0, report.decode_kv_used / report.decode_kv_capacity)
            migration = move_s * share * report.gpus
    lost = report.prefix_cache_tokens if reusable_tokens is None else min(report.prefix_cache_tokens, reusable_tokens)
    refill = config.cache_reuse_fraction * lost * refill_seconds_per_token * prefill_gpus
    return SwitchCost(report.instance_id, switch_s, switch_s * report.gpus, migration, refill)


def served(n: float, demand: float) -> float:
    """Instances' worth of demand that ``n`` instances serve: capacity beyond demand serves nothing."""
    return min(n, demand) if demand > 0 else 0.0


def bottleneck_delta(n_prefill: float, n_decode: float, prefill_demand: float, decode_held: float) -> float:
    """Eq. 1's δ for two stages in series: the lower of prefill's coverage of its demand and decode's of what it
    holds (a stage with nothing to serve does not bound it)."""
    return min(n_prefill / prefill_demand if prefill_demand > 0 else math.inf,
               n_decode / decode_held if decode_held > 0 else math.inf)


@dataclass(frozen=True)
class Demand:
    """A role's demand over the lookahead windows, in instances: what arrives in each window (``rates``) and the
    backlog already waiting at the start. Work a window does not serve carries over to the next (a fluid queue), so
    a backlog counts once, not once per window."""

    rates: tuple[float, ...]
    backlog: float = 0.0

    def __post_init__(self) -> None:
        if not self.rates or any(not r >= 0 for r in self.rates) or not self.backlog >= 0:
            raise ValueError("Demand needs at least one window and non-negative rates and backlog")

    def scaled(self, factor: float) -> Demand:
        return Demand(tuple(r * factor for r in self.rates), self.backlog * factor)

    def windows(self, n: float) -> list[float]:
        """Demand each window sees with ``n`` instances: its arrivals plus what earlier windows left unserved."""
        carry, out = self.backlog, []
        for rate in self.rates:
            d = rate + carry
            out.append(d)
            carry = max(0.0, d - n)
        return out

    def served(self, n: float) -> float:
        """Instance-windows of demand ``n`` instances serve over the lookahead."""
        return sum(served(n, d) for d in self.windows(n)) if n > 0 else 0.0

    def coverage(self, n: float) -> float:
        """The worst window's n / demand (inf when no window has demand)."""
        return min((n / d for d in self.windows(n) if d > 0), default=math.inf)


def move_gain_gpu_s(n_src: int, n_dst: int, remove: int, add: int, src_demand: Sequence[float] | Demand,
                    dst_demand: Sequence[float] | Demand, m_src: int, m_dst: int, window_s: float) -> float:
    """GPU-seconds of needed service gained by moving ``remove`` src instances into ``add`` dst instances, summed over
    the lookahead windows (demands in instances per window, or ``Demand`` with a backlog; see module docstring)."""
    src = src_demand if isinstance(src_demand, Demand) else Demand(tuple(src_demand))
    dst = dst_demand if isinstance(dst_demand, Demand) else Demand(tuple(dst_demand))
    if len(src.rates) != len(dst.rates):
        raise ValueError("src_demand and dst_demand must cover the same windows")
    gained = (dst.served(n_dst + add) - dst.served(n_dst)) * m_dst
    lost = (src.served(n_src) - src.served(n_src - remove)) * m_src
    return window_s * (gained - lost)
