"""Allocation time of Eq. 1 against the GPU budget G = 8 … 4096.

For each G the allocator runs on a fixed set of scenarios (balanced, prefill-heavy, decode-heavy, infeasible, no
demand, m^D = 2) scaled to that G, and its answer is checked against a linear scan over every prefill count (the
O(G) way, done here in exact rationals too). Prints a table and writes benchmarks/results/allocator_time.png.

    python benchmarks/bench_allocator.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from fractions import Fraction
from pathlib import Path

from tqdm import tqdm

from sglang_prorsa.policy.role_switch.allocator import AllocationInputs, AllocatorConfig, allocate

RESULTS = Path(__file__).resolve().parent / "results"
BUDGETS = [8 * 2**k for k in range(10)]  # 8 … 4096


def scenarios(budget: int) -> list[tuple[str, AllocationInputs, AllocatorConfig]]:
    """Demands in instance units a, b scaled to the budget, written as the raw forecast numbers Eq. 1 takes."""

    def make(a: float, b: float) -> AllocationInputs:
        # S = 10 s, θ^P = 7,919.3 tok/s, C^D_KV = 412,517 tokens: awkward floats on purpose, so nothing divides evenly.
        kv = b * 412_517
        return AllocationInputs(a * 10 * 7919.3, 10.0, 7919.3, 0.37 * kv, 0.63 * kv, 412_517.0, budget)

    g, one = budget, AllocatorConfig()
    return [
        ("balanced", make(0.31 * g, 0.29 * g), one),
        ("prefill-heavy", make(0.61 * g, 0.13 * g), one),
        ("decode-heavy", make(0.07 * g, 0.71 * g), one),
        ("infeasible", make(0.9 * g, 0.8 * g), one),
        ("no demand", make(0.0, 0.0), one),
        ("m^D=2", make(0.2 * g, 0.3 * g), AllocatorConfig(gpus_per_prefill=1, gpus_per_decode=2)),
    ]


def linear_scan(inputs: AllocationInputs, config: AllocatorConfig) -> float:
    """Reference optimum: best coverage over every prefill count, O(G/m^P)."""
    a, b = inputs.prefill_demand(), inputs.decode_demand()
    if a == 0 and b == 0:
        return math.inf
    best = Fraction(-1)
    for p in range(config.min_prefill, inputs.gpu_budget // config.gpus_per_prefill + 1):
        d = (inputs.gpu_budget - config.gpus_per_prefill * p) // config.gpus_per_decode
        if d < config.min_decode:
            break
        sides = [Fraction(n) / x for n, x in ((p, a), (d, b)) if x > 0]
        best = max(best, min(sides))
    return float(best)


def time_call(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per scenario and budget")
    parser.add_argument("--scan-repeats", type=int, default=3, help="timed calls of the O(G) reference")
    args = parser.parse_args()

    rows = []
    for budget in tqdm(BUDGETS, desc="budgets"):
        fast, slow = [], []
        for name, inputs, config in scenarios(budget):
            alloc = allocate(inputs, config)
            reference = linear_scan(inputs, config)
            assert math.isclose(alloc.coverage, reference, rel_tol=1e-12) or alloc.coverage == reference, (
                f"G={budget} {name}: allocator coverage {alloc.coverage} != linear scan {reference}"
            )
            fast.append(time_call(lambda: allocate(inputs, config), args.repeats))
            slow.append(time_call(lambda: linear_scan(inputs, config), args.scan_repeats))
        rows.append((budget, statistics.median(fast) * 1e6, max(fast) * 1e6, statistics.median(slow) * 1e6))

    print(f"\n{'G':>6} | {'allocate median us':>18} | {'allocate worst us':>17} | {'linear scan us':>14}")
    print("-" * 66)
    for budget, median_us, worst_us, scan_us in rows:
        print(f"{budget:>6} | {median_us:>18.1f} | {worst_us:>17.1f} | {scan_us:>14.1f}")
    print(f"(median over {len(scenarios(8))} scenarios of the per-call median of {args.repeats} calls; "
          "answers checked equal to the linear scan at every G)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    budgets = [r[0] for r in rows]
    ax.plot(budgets, [r[1] for r in rows], "o-", label="allocate (binary search), median")
    ax.plot(budgets, [r[2] for r in rows], "^:", label="allocate, slowest scenario")
    ax.plot(budgets, [r[3] for r in rows], "s--", label="linear scan reference, median")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPU budget G")
    ax.set_ylabel("time per allocation (µs)")
    ax.set_title("Eq. 1 allocation time vs GPU budget")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = RESULTS / "allocator_time.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
