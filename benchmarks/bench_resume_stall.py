"""Per-request stall of a resumed request (its last token before the move -> its next token from elsewhere), against
context length, beside two baselines measured in the same run: the request's normal time between tokens, and the
time a restart would pay to prefill its whole context again (what a resume from persisted KV saves).

Starts a front over three real instances (1 prefill, 2 decode, file KV store). For each context length, streams a few
greedy requests, switches the busiest decode instance while they run, and reads the stall off the client's own chunk
arrival times. Every answer is checked against an unswitched run.

    python benchmarks/bench_resume_stall.py [--contexts 128 512 1024 2048] [--requests 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests
from tqdm import tqdm

from sglang_prorsa.testing.front_client import arrange, busiest, instance_status, start_manual_front, switch

ENGINE_FLAGS = ["--chunked-prefill-size", "512", "--max-total-tokens", "131072", "--log-level", "warning"]
MAX_NEW = 200


def stream_times(url: str, prompt: list[int], out: dict) -> None:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True},
            "stream": True}
    times, last = [], None
    with requests.post(url + "/generate", json=body, timeout=900, stream=True) as r:
        for line in r.iter_lines():
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                times.append(time.perf_counter())
                last = json.loads(line[5:])
    out["times"], out["last"] = times, last


def prefill_time(url: str, prompt: list[int]) -> float:
    """A restart's cost: the context prefilled from nothing (1 new token), prefix caches flushed first."""
    for inst in requests.get(url + "/prorsa/instances", timeout=10).json()["instances"]:
        requests.post(inst["url"] + "/flush_cache", timeout=30)
    t0 = time.perf_counter()
    r = requests.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}},
                      timeout=900)
    r.raise_for_status()
    return time.perf_counter() - t0


def one_point(url: str, ctx: int, n: int, seed: int) -> dict:
    arrange(url, prefill=1)
    prompts = [[7 + (seed * 13 + i) % 800] + [(seed + i * 37 + j * 11) % 900 + 20 for j in range(ctx - 1)]
               for i in range(n)]
    reference = [requests.post(url + "/generate", timeout=900, json={
        "input_ids": p, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}).json()
        for p in prompts]
    outs = [dict() for _ in prompts]
    threads = [threading.Thread(target=stream_times, args=(url, p, o)) for p, o in zip(prompts, outs)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 600
    while sum(instance_status(i["url"])["running"] for i in requests.get(url + "/prorsa/instances", timeout=10)
              .json()["instances"] if i["role"] == "decode") < n and all(t.is_alive() for t in threads):
        if time.monotonic() > deadline:
            raise TimeoutError("requests never all ran")
        time.sleep(0.05)
    time.sleep(1.0)
    target = busiest(url, "decode")
    t_switch = time.perf_counter()
    report = switch(url, target["instance"], "prefill").json()
    for t in threads:
        t.join()
    stalls, itls, exact = [], [], 0
    for o, ref in zip(outs, reference):
        exact += o["last"]["output_ids"] == ref["output_ids"]
        gaps = [b - a for a, b in zip(o["times"], o["times"][1:])]
        moved = bool(o["last"]["meta_info"].get("prorsa", {}).get("migrations"))
        around = [g for a, g in zip(o["times"], gaps) if a <= t_switch + report["timings"]["controller_total_s"]
                  and a + g >= t_switch]
        if moved and around:
            stalls.append(max(around))
        itls += [g for a, g in zip(o["times"], gaps) if a + g < t_switch - 0.2]
    restart = prefill_time(url, prompts[0] + reference[0]["output_ids"][:MAX_NEW // 2])
    return {"context": ctx, "requests": n, "moved": len(stalls), "exact": exact,
            "stall_s": statistics.median(stalls) if stalls else None, "stall_max_s": max(stalls) if stalls else None,
            "itl_s": statistics.median(itls) if itls else None, "restart_prefill_s": restart,
            "switch_total_s": report["timings"]["controller_total_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 2048])
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-stall-"))
    front = start_manual_front(3, 1, ENGINE_FLAGS, log_dir)
    rows = []
    try:
        front.wait_ready(timeout=900)
        for ctx in tqdm(args.contexts, desc="contexts"):
            for rep in range(args.repeats):
                rows.append(one_point(front.url, ctx, args.requests, seed=ctx + rep))
                r = rows[-1]
                tqdm.write(f"ctx {ctx}: stall {r['stall_s']} s (itl {r['itl_s']} s, restart {r['restart_prefill_s']:.3f}"
                           f" s), moved {r['moved']}, exact {r['exact']}/{r['requests']}")
    finally:
        front.stop()
    print(f"\n{'context':>8} {'stall s (median)':>17} {'normal gap s':>13} {'restart prefill s':>18} "
          f"{'stall/gap':>10} {'stall/restart':>14} {'exact':>6}")
    summary = []
    for ctx in args.contexts:
        pts = [r for r in rows if r["context"] == ctx and r["stall_s"] is not None]
        if not pts:
            continue
        s = {"context": ctx, "stall_s": statistics.median(r["stall_s"] for r in pts),
             "stall_spread_s": [min(r["stall_s"] for r in pts), max(r["stall_max_s"] for r in pts)],
             "itl_s": statistics.median(r["itl_s"] for r in pts),
             "restart_prefill_s": statistics.median(r["restart_prefill_s"] for r in pts),
             "exact": all(r["exact"] == r["requests"] for r in rows if r["context"] == ctx)}
        summary.append(s)
        print(f"{ctx:>8} {s['stall_s']:>17.3f} {s['itl_s']:>13.4f} {s['restart_prefill_s']:>18.3f} "
              f"{s['stall_s'] / s['itl_s']:>10.1f} {s['stall_s'] / s['restart_prefill_s']:>14.2f} {str(s['exact']):>6}")
    (args.out / "resume_stall.json").write_text(json.dumps({"points": rows, "summary": summary}, indent=1))
    plot(summary, args.out / "resume_stall.png")


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["context"] for s in summary]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(x, [s["stall_s"] for s in summary], "o-", label="resume stall (last token -> next token elsewhere)")
    ax.fill_between(x, [s["stall_spread_s"][0] for s in summary], [s["stall_spread_s"][1] for s in summary],
                    alpha=0.2)
    ax.plot(x, [s["restart_prefill_s"] for s in summary], "s--", label="restart: prefill the context again")
    ax.plot(x, [s["itl_s"] for s in summary], "^:", label="normal time between tokens")
    ax.set_xlabel("context tokens at the move")
    ax.set_ylabel("seconds")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.set_title("Resumed request stall vs context (CPU, tiny model)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
