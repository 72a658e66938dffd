"""Example trace: forecast → Eq. 1 target → planned switches across a prefill-heavy → decode-heavy phase change.

A 16-instance cluster (m^P = m^D = 1, G = 16) is replayed on a ManualClock for 600 s. True demand, in instance
units, is prefill-heavy until 240 s (a = 10, b = 4), moves linearly until 330 s and is decode-heavy after
(a = 3, b = 11). Every S = 10 s the forecaster reports the true demand of the next horizon times independent
log-normal noise (σ = 0.12, i.e. WAPE ≈ 10 %, inside the paper's 5–14 % range), converted to the raw numbers of Eq. 1
(Ŵ^P, K^D_t, K̂^D with θ^P and C^D_KV). A switch takes the instance offline for 5 s (the paper's average).

Both runs see identical forecasts; one uses the paper's planner as written (no guard), the other the default guarded
planner (need-based, absolute hysteresis band, dwell of several switch costs, cost vs gain; planner.py). Reported per
run: switches; flaps (switches that undo a switch of the opposite direction made less than 60 s before, on any
instance); instance-seconds offline for switching; and the demand-coverage deficit Σ_t max(0, demand − active
instances) per role, integrated over 1 s steps; their sum is the instance-seconds of demand left unserved, one way
or the other. The comparison is repeated over 20 noise seeds, also with each of the guard's conditions turned off in
turn.

    python benchmarks/trace_allocation.py [--seeds 20]
Writes benchmarks/results/allocation_trace.png.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.role_switch.allocator import AllocationInputs
from sglang_prorsa.policy.role_switch.capacity import InstanceReport, InstanceStatus, Role
from sglang_prorsa.policy.role_switch.controller import ControllerConfig, RoleSwitchController
from sglang_prorsa.policy.role_switch.planner import PlannerConfig
from sglang_prorsa.policy.role_switch.theta import ThetaConfig, ThetaModel

RESULTS = Path(__file__).resolve().parent / "results"
INSTANCES, HORIZON_S, SWITCH_S, DURATION_S = 16, 10.0, 5.0, 600
THETA_P, KV_CAPACITY = 8_000.0, 400_000.0  # tok/s per prefill instance, KV tokens per decode instance
NOISE_SIGMA = 0.12


def true_demand(t: float) -> tuple[float, float]:
    """(a, b) in instance units at time t: prefill-heavy, a 90 s ramp from 240 s, then decode-heavy."""
    w = min(1.0, max(0.0, (t - 240.0) / 90.0))
    return 10.0 + w * (3.0 - 10.0), 4.0 + w * (11.0 - 4.0)


def forecasts(seed: int) -> dict[int, tuple[float, float]]:
    """Noisy forecast of the mean demand over [t, t+S) for each decision time t."""
    rng = random.Random(seed)
    out = {}
    for t in range(0, DURATION_S, int(HORIZON_S)):
        a = statistics.fmean(true_demand(t + k)[0] for k in range(int(HORIZON_S)))
        b = statistics.fmean(true_demand(t + k)[1] for k in range(int(HORIZON_S)))
        out[t] = (a * rng.lognormvariate(0, NOISE_SIGMA), b * rng.lognormvariate(0, NOISE_SIGMA))
    return out


@dataclass
class Instance:
    role: Role
    busy_until: float = 0.0  # switching until then
    role_since: float | None = None


@dataclass
class Run:
    switches: int = 0
    flaps: int = 0
    switch_instance_s: float = 0.0
    deficit: dict[Role, float] = field(default_factory=lambda: {Role.PREFILL: 0.0, Role.DECODE: 0.0})
    active_prefill: list[int] = field(default_factory=list)  # per second
    cumulative_switches: list[int] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)


def simulate(planner: PlannerConfig, seed: int) -> Run:
    clock = ManualClock()
    config = ControllerConfig(horizon_s=HORIZON_S, planner=planner)
    controller = RoleSwitchController(config, ThetaModel(ThetaConfig.from_theta(THETA_P)), clock)
    loads = random.Random(seed + 1)  # per-instance load, only used to pick the least loaded
    cluster = {f"i{k:02d}": Instance(Role.PREFILL if k < 11 else Role.DECODE) for k in range(INSTANCES)}
    last_switch: dict[tuple[Role, Role], float] = {}  # (from, to) -> time of the latest such switch
    run, forecast = Run(), forecasts(seed)

    for t in range(DURATION_S):
        clock.set(float(t))
        if t in forecast:
            a_hat, b_hat = forecast[t]
            reports = [
                InstanceReport(
                    iid, inst.role, InstanceStatus.SWITCHING if t < inst.busy_until else InstanceStatus.ACTIVE,
                    queued_prompt_tokens=loads.randint(0, 40_000), decode_kv_used=loads.randint(0, 300_000),
                    role_since=inst.role_since,
                )
                for iid, inst in cluster.items()
            ]
            inputs = AllocationInputs(
                prefill_tokens_forecast=a_hat * HORIZON_S * THETA_P, horizon_s=HORIZON_S, theta_p=THETA_P,
                decode_kv_now=0.6 * b_hat * KV_CAPACITY, decode_kv_forecast=0.4 * b_hat * KV_CAPACITY,
                decode_kv_capacity=KV_CAPACITY, gpu_budget=INSTANCES,
            )
            decision = controller.decide(inputs, reports)
            for switch in decision.plan.switches:
                inst = cluster[switch.instance_id]
                inst.role, inst.busy_until, inst.role_since = switch.dst, t + SWITCH_S, float(t)
                # A flap undoes a switch of the opposite direction made less than 60 s ago, on any instance.
                if t - last_switch.get((switch.dst, switch.src), -1e9) < 60.0:
                    run.flaps += 1
                last_switch[(switch.src, switch.dst)] = t
                run.switches += 1
                run.switch_instance_s += SWITCH_S
            logged = controller.last_decision()
            run.rows.append({
                "t": t, "a_hat": a_hat, "b_hat": b_hat, "delta": logged["delta"], "target": logged["target"],
                "switches": len(decision.plan.switches), "held": decision.plan.held_by_hysteresis,
                "dwell": decision.plan.blocked_by_dwell,
            })
        active = {r: sum(1 for i in cluster.values() if i.role is r and t >= i.busy_until) for r in Role}
        for role, demand in zip((Role.PREFILL, Role.DECODE), true_demand(t)):
            run.deficit[role] += max(0.0, demand - active[role])
        run.active_prefill.append(active[Role.PREFILL])
        run.cumulative_switches.append(run.switches)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    policies = {"no guard": PlannerConfig.unguarded(), "guard": PlannerConfig()}

    runs = {name: simulate(cfg, seed=0) for name, cfg in policies.items()}
    print(f"{'t':>4} {'a_hat':>6} {'b_hat':>6} {'delta':>6} {'target P:D':>10} | "
          f"{'no guard':>8} | {'guard':>14}")
    for plain, guarded in zip(runs["no guard"].rows, runs["guard"].rows):
        note = "held" if guarded["held"] else (f"dwell-{guarded['dwell']}" if guarded["dwell"] else "")
        delta = "-" if plain["delta"] is None else f"{plain['delta']:.2f}"
        print(f"{plain['t']:>4} {plain['a_hat']:>6.2f} {plain['b_hat']:>6.2f} {delta:>6} "
              f"{plain['target']['prefill']:>5}:{plain['target']['decode']:<4} | "
              f"{plain['switches']:>8} | {guarded['switches']:>4} {note:>9}")

    def summary(run: Run) -> str:
        d = run.deficit
        return (f"switches={run.switches:3d} flaps={run.flaps:3d} offline={run.switch_instance_s:5.0f} inst-s "
                f"deficit P={d[Role.PREFILL]:6.1f} D={d[Role.DECODE]:6.1f} total={sum(d.values()):6.1f} inst-s")

    print("\nseed 0:")
    for name, run in runs.items():
        print(f"  {name:>8}: {summary(run)}")

    print(f"\nover {args.seeds} seeds (mean ± stdev):")
    variants = {
        **policies,
        "no need test": PlannerConfig(need_based=False),
        "no cost test": PlannerConfig(cost_aware=False),
        "no band": PlannerConfig(hysteresis=0.0),
        "no dwell": PlannerConfig(min_dwell_s=0.0, dwell_switch_costs=0.0),
    }
    for name, cfg in variants.items():
        many = [simulate(cfg, seed) for seed in range(args.seeds)]
        stats = {
            "switches": [r.switches for r in many],
            "flaps": [r.flaps for r in many],
            "deficit": [sum(r.deficit.values()) for r in many],
            "offline": [r.switch_instance_s for r in many],
            "deficit+offline": [sum(r.deficit.values()) + r.switch_instance_s for r in many],
        }
        print("  " + f"{name:>15}: " + "  ".join(
            f"{k}={statistics.fmean(v):6.1f}±{statistics.stdev(v):4.1f}" for k, v in stats.items()))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = list(range(DURATION_S))
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(seconds, [true_demand(t)[0] for t in seconds], label="prefill demand a (true)")
    axes[0].plot(seconds, [true_demand(t)[1] for t in seconds], label="decode demand b (true)")
    decision_t = [r["t"] for r in runs["guard"].rows]
    axes[0].plot(decision_t, [r["a_hat"] for r in runs["guard"].rows], ".", label="a forecast")
    axes[0].plot(decision_t, [r["b_hat"] for r in runs["guard"].rows], ".", label="b forecast")
    axes[0].set_ylabel("instances")
    axes[0].legend(fontsize=8, ncol=2)
    axes[1].step(decision_t, [r["target"]["prefill"] for r in runs["guard"].rows], where="post",
                 color="k", alpha=0.4, label="Eq. 1 target n^P")
    for name, run in runs.items():
        axes[1].plot(seconds, run.active_prefill, label=f"active prefill, {name}")
    axes[1].set_ylabel("prefill instances")
    axes[1].legend(fontsize=8)
    for name, run in runs.items():
        axes[2].plot(seconds, run.cumulative_switches, label=name)
    axes[2].set_ylabel("cumulative switches")
    axes[2].set_xlabel("time (s)")
    axes[2].legend(fontsize=8)
    fig.suptitle("Prefill-heavy → decode-heavy: Eq. 1 target and planned switches (seed 0)")
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "allocation_trace.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
