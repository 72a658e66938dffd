"""Busy-switch time against running requests and context length, split into quiesce / persist / rebuild.

Starts an adaptive front over three real SGLang instances on this machine (1 prefill, 2 decode, file KV store),
fills one decode instance with N running requests of a given context length, switches it to prefill mid-generation
and records the instance's own timings, the bytes persisted and the store bandwidth. The baseline, measured in the same
run, is SGLang's own idle flip (``/pd_role_switch`` on an empty instance), which moves no requests.

    python benchmarks/bench_switch.py [--requests 4 16 32] [--contexts 128 512 1024] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import requests
from tqdm import tqdm

from sglang_prorsa.srt.utils import processes
from sglang_prorsa.testing.front_client import arrange, instances, switch, switch_under_load


def switch_report(url: str, instance: str, role: str) -> dict:
    r = switch(url, instance, role)
    r.raise_for_status()
    return r.json()


def one_point(url: str, n: int, ctx: int, seed: int) -> dict:
    arrange(url, prefill=1)
    target = next(i for i in instances(url) if i["role"] == "decode")
    prompts = [[10 + (seed * 97 + i) % 800] + [(seed + i * 37 + j * 11) % 900 + 20 for j in range(ctx - 1)]
               for i in range(2 * n)]  # the front spreads them over the two decode instances

    def body(p: list[int]) -> dict:
        return {"input_ids": p, "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}

    response, answers, before = switch_under_load(
        url, lambda p: requests.post(url + "/generate", json=body(p), timeout=900), prompts, target, "prefill",
        ready=lambda st: st["running"] >= n, timeout_s=600)
    response.raise_for_status()
    report, running = response.json(), before["running"]
    ok = sum(a.status_code == 200 for a in answers)
    for a in answers:
        if a.status_code != 200:
            print(f"  request failed ({a.status_code}): {a.text[:400]}", flush=True)
    t = report["timings"]
    persist_s = max(t["persist_s"], 1e-9)
    return {"requests": n, "context": ctx, "running_at_switch": running, "migrated": report["taken"],
            "quiesce_s": t["quiesce_s"], "persist_s": t["persist_s"], "rebuild_s": t["rebuild_s"],
            "instance_total_s": t["total_s"], "front_total_s": t["controller_total_s"],
            "persisted_mb": report["persisted_bytes"] / 1e6,
            "store_gb_s": report["persisted_bytes"] / persist_s / 1e9, "answered": ok, "sent": 2 * n}


def idle_flip_baseline(url: str, repeats: int = 3) -> float:
    """SGLang's own idle flip of an empty instance, there and back (median of one direction)."""
    arrange(url, prefill=1)
    times = []
    for _ in range(repeats):
        target = next(i for i in instances(url) if i["role"] == "decode")
        times.append(switch_report(url, target["instance"], "prefill")["timings"]["rebuild_s"])
        arrange(url, prefill=1)
    return statistics.median(times)


def plot(rows: list[dict], baseline: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['requests']}×{r['context']}" for r in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    bottom = [0.0] * len(rows)
    for key, color in (("quiesce_s", "#8da0cb"), ("persist_s", "#fc8d62"), ("rebuild_s", "#66c2a5")):
        vals = [r[key] for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=key[:-2], color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(baseline, color="k", ls="--", lw=1, label=f"idle flip (SGLang) {baseline:.2f} s")
    ax.set_xlabel("running requests × context tokens")
    ax.set_ylabel("seconds")
    ax.set_title("busy switch time on one instance (CPU, tiny model)")
    ax.tick_params(axis="x", rotation=45)
    ax.legend()
    ax2.plot([r["persisted_mb"] for r in rows], [r["store_gb_s"] for r in rows], "o")
    ax2.set_xlabel("KV persisted per switch (MB)")
    ax2.set_ylabel("persist bandwidth (GB/s)")
    ax2.set_xscale("log")
    ax2.set_title("export + file store bandwidth")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[4, 16, 32])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--log-level", default="warning", help="the instances' SGLang log level (info to debug failures)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = processes.free_port()
    work = Path(tempfile.mkdtemp(prefix="prorsa-bench-switch-"))
    front = processes.start(
        ["--pd-adaptive", "--prorsa-instances", "3", "--prorsa-manual-switch", "--prorsa-kv-store-path",
         str(work / "store"), "--prorsa-log-dir", str(work), "--host", "127.0.0.1", "--port", str(port),
         "--max-total-tokens", "200000", "--log-level", args.log_level], name="front", port=port, log_dir=work)
    try:
        print(f"starting the front and 3 instances (logs in {work}) ...", flush=True)
        front.wait_ready(timeout=900)
        baseline = idle_flip_baseline(front.url)
        rows = []
        grid = [(n, c) for c in args.contexts for n in args.requests]
        for k, (n, c) in enumerate(tqdm(grid, desc="switch points")):
            rows.append(one_point(front.url, n, c, seed=k))
    finally:
        front.stop(grace_s=20)
    hdr = (f"{'req':>4} {'ctx':>5} {'run':>4} {'migr':>4} {'quiesce':>8} {'persist':>8} {'rebuild':>8} "
           f"{'total':>7} {'front':>7} {'MB':>7} {'GB/s':>6} {'x idle':>7} {'ok':>6}")
    print(hdr)
    for r in rows:
        print(f"{r['requests']:>4} {r['context']:>5} {r['running_at_switch']:>4} {r['migrated']:>4} "
              f"{r['quiesce_s']:>8.3f} {r['persist_s']:>8.3f} {r['rebuild_s']:>8.3f} {r['instance_total_s']:>7.3f} "
              f"{r['front_total_s']:>7.3f} {r['persisted_mb']:>7.1f} {r['store_gb_s']:>6.2f} "
              f"{r['instance_total_s'] / baseline:>7.2f} {r['answered']:>3}/{r['sent']}")
    print(f"baseline: SGLang idle flip (rebuild only) median {baseline:.3f} s")
    (args.out / "switch_time.json").write_text(json.dumps({"idle_flip_s": baseline, "rows": rows}, indent=2))
    plot(rows, baseline, args.out / "switch_time.png")
    print(f"wrote {args.out / 'switch_time.json'} and {args.out / 'switch_time.png'}")


if __name__ == "__main__":
    main()
