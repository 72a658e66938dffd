"""Our front against sglang-router 0.3.2 over the same prefill+decode instances, in one run.

Starts sglang-router in PD mode and a front (``--pd-static 1:1 --prorsa-router``) whose controller puts the same two
instances into the router's pools, so both relays route to the very same servers. For each (concurrency, new tokens)
point, closed-loop clients send the same distinct greedy prompts through each relay in turn (order alternated across
repeats; prefix caches flushed before every run) and the table gives requests/s and p50/p99 latency, plus the
front:router throughput ratio of each repeat with its spread. Target: >= 0.9x the router's throughput.

    python benchmarks/bench_front.py [--concurrency 16 32] [--new-tokens 1 32] [--requests 160] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import requests
from tqdm import tqdm

from sglang_prorsa.srt.utils import processes

ENGINE_FLAGS = ["--chunked-prefill-size", "256", "--max-total-tokens", "65536", "--log-level", "warning"]


def start(log_dir: Path) -> tuple[processes.ServerProcess, processes.ServerProcess]:
    rport, fport = processes.free_port(), processes.free_port()
    router = processes.start(["--pd-disaggregation", "--host", processes.LOOPBACK, "--port", str(rport),
                              "--policy", "round_robin", "--log-level", "warn", "--prometheus-port",
                              str(processes.free_port()), "--prometheus-host", processes.LOOPBACK],
                             name="sglang-router", port=rport, log_dir=log_dir, module="sglang_router.launch_router")
    router.wait_ready(timeout=120, path="/workers")
    front = processes.start(["--pd-static", "1:1", "--prorsa-router", router.url, "--prorsa-log-dir",
                             str(log_dir / "instances"), "--host", processes.LOOPBACK, "--port", str(fport),
                             *ENGINE_FLAGS], name="front", port=fport, log_dir=log_dir)
    front.wait_ready(timeout=900)
    deadline = time.monotonic() + 120
    while len(requests.get(router.url + "/workers", timeout=10).json()["workers"]) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("the front did not fill the router's pools")
        time.sleep(0.5)
    return router, front


def prompts(n: int, length: int = 48) -> list[list[int]]:
    return [[5 + i % 900] + [(i * 31 + j * 7) % 900 + 20 for j in range(length - 1)] for i in range(n)]


async def load(url: str, bodies: list[bytes], concurrency: int) -> dict:
    latencies: list[float] = []
    failures = 0
    queue = list(reversed(bodies))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal failures
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                async with session.post(url + "/generate", data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    failures += r.status != 200
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    latencies.sort()
    return {"req_s": len(bodies) / wall, "p50_s": latencies[len(latencies) // 2],
            "p99_s": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], "failed": failures,
            "wall_s": wall}


def flush(front: processes.ServerProcess) -> None:
    for inst in requests.get(front.url + "/prorsa/instances", timeout=10).json()["instances"]:
        requests.post(inst["url"] + "/flush_cache", timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-front-"))
    router, front = start(log_dir)
    rows, ratios = [], {}
    try:
        points = [(c, n) for c in args.concurrency for n in args.new_tokens]
        bar = tqdm(total=len(points) * args.repeats * 2, desc="runs")
        for c, n in points:
            bodies = [json.dumps({"input_ids": p, "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                                      "ignore_eos": True}}).encode()
                      for p in prompts(args.requests)]
            asyncio.run(load(front.url, bodies[:8], 4))  # warm both paths' connections
            asyncio.run(load(router.url, bodies[:8], 4))
            for rep in range(args.repeats):
                order = [("front", front.url), ("router", router.url)]
                results = {}
                for name, url in (order if rep % 2 == 0 else order[::-1]):
                    flush(front)
                    results[name] = asyncio.run(load(url, bodies, c))
                    rows.append({"concurrency": c, "new_tokens": n, "repeat": rep, "relay": name, **results[name]})
                    bar.update()
                ratios.setdefault((c, n), []).append(results["front"]["req_s"] / results["router"]["req_s"])
        bar.close()
    finally:
        front.stop()
        router.stop()
    summary = []
    print(f"\n{'conc':>5} {'new':>4} {'front req/s':>12} {'router req/s':>13} {'front p50/p99 s':>17} "
          f"{'router p50/p99 s':>17} {'ratio (min-max)':>18}")
    for (c, n), rs in ratios.items():
        f = [r for r in rows if (r["concurrency"], r["new_tokens"], r["relay"]) == (c, n, "front")]
        g = [r for r in rows if (r["concurrency"], r["new_tokens"], r["relay"]) == (c, n, "router")]

        def med(xs: list[dict], k: str) -> float:
            return statistics.median(x[k] for x in xs)

        summary.append({"concurrency": c, "new_tokens": n, "front_req_s": med(f, "req_s"),
                        "router_req_s": med(g, "req_s"), "front_p50_s": med(f, "p50_s"), "front_p99_s": med(f, "p99_s"),
                        "router_p50_s": med(g, "p50_s"), "router_p99_s": med(g, "p99_s"),
                        "ratio_median": statistics.median(rs), "ratio_min": min(rs), "ratio_max": max(rs)})
        s = summary[-1]
        print(f"{c:>5} {n:>4} {s['front_req_s']:>12.1f} {s['router_req_s']:>13.1f} "
              f"{s['front_p50_s']:>8.3f}/{s['front_p99_s']:<8.3f} {s['router_p50_s']:>8.3f}/{s['router_p99_s']:<8.3f} "
              f"{s['ratio_median']:>6.2f} ({s['ratio_min']:.2f}-{s['ratio_max']:.2f})")
    failed = sum(r["failed"] for r in rows)
    print(f"failed requests: {failed}")
    (args.out / "front_vs_router.json").write_text(json.dumps({"runs": rows, "summary": summary}, indent=1))
    plot(summary, args.out / "front_vs_router.png")


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"c={s['concurrency']}\nnew={s['new_tokens']}" for s in summary]
    x = range(len(summary))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar([i - 0.2 for i in x], [s["front_req_s"] for s in summary], 0.4, label="our front")
    a.bar([i + 0.2 for i in x], [s["router_req_s"] for s in summary], 0.4, label="sglang-router 0.3.2")
    a.set_xticks(list(x), labels)
    a.set_ylabel("requests/s (median of repeats)")
    a.legend()
    b.errorbar(list(x), [s["ratio_median"] for s in summary],
               yerr=[[s["ratio_median"] - s["ratio_min"] for s in summary],
                     [s["ratio_max"] - s["ratio_median"] for s in summary]], fmt="o", capsize=4)
    b.axhline(0.9, ls="--", c="gray", label="target 0.9")
    b.set_xticks(list(x), labels)
    b.set_ylabel("front / router throughput")
    b.legend()
    fig.suptitle("Same 1 prefill + 1 decode instances behind each relay (CPU, tiny model)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
