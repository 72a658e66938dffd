"""Predictor benchmarks (issue 3).

1. Forecast refresh time against live trajectories (1k, 10k, 100k) spread over the lifecycle states.
2. Event ingest over HTTP on loopback: single-event POSTs vs batched POSTs (events/s).
3. Forecast accuracy (WAPE) on the synthetic coding-agent-like and general-agent-like workloads, sync and async, with
   and without the online bias correction, next to the paper's 5.40-14.37 % (prefill) / 5.19-13.69 % (decode).

    PYTHONPATH=. python benchmarks/bench_predictor.py [--quick]

Prints a table and writes PNGs under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

from sglang_prorsa.srt.forecast.config import PredictorConfig
from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane
from sglang_prorsa.srt.lifecycle.events import EventKind, LifecycleEvent, SandboxMode
from sglang_prorsa.srt.utils.clock import ManualClock
from sglang_prorsa.workload import RolloutSimulator, config_for, preset, replay_events

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
log = logging.getLogger("bench_predictor")


# ----- 1. refresh time -----
def populated_plane(n_live: int, seed: int = 0) -> tuple[LifecycleControlPlane, float]:
    """A control plane with learned history and ``n_live`` trajectories in a decode-heavy state mix."""
    rng = random.Random(seed)
    clock = ManualClock(0.0)
    cp = LifecycleControlPlane(clock, PredictorConfig(default_prompt_tokens=4000, prefill_instances=tuple("01234567")))
    tasks, tools = ("swe", "web"), ("bash", "edit", "search")
    history = []
    for i in range(2000):  # completed phases: reward, startup and tool statistics
        t, task = rng.uniform(0, 500), rng.choice(tasks)
        tid = f"h{i}"
        history += [LifecycleEvent(tid, EventKind.SANDBOX_START, ts=t, task=task, mode=rng.choice(list(SandboxMode))),
                    LifecycleEvent(tid, EventKind.REQUEST_ARRIVED, ts=t + rng.uniform(1, 30), prompt_tokens=4000),
                    LifecycleEvent(tid, EventKind.PREFILL_END, ts=t + 31), LifecycleEvent(tid, EventKind.DECODE_END, ts=t + 40),
                    LifecycleEvent(tid, EventKind.TOOL_START, ts=t + 40, tool=rng.choice(tools)),
                    LifecycleEvent(tid, EventKind.TOOL_END, ts=t + 40 + rng.expovariate(0.2)),
                    LifecycleEvent(tid, EventKind.REWARD_START, ts=t + 60),
                    LifecycleEvent(tid, EventKind.REWARD_END, ts=t + 60 + rng.uniform(2, 40), accepted=rng.random() < 0.8)]
    cp.ingest(history)
    now = 1000.0
    mix = [("reward", 0.05), ("sandbox", 0.05), ("tool", 0.15), ("ready", 0.05), ("prefill", 0.02), ("decode", 0.68)]
    live = []
    for i in range(n_live):
        state = rng.choices([m for m, _ in mix], weights=[w for _, w in mix])[0]
        tid, t0, task = f"l{i}", now - rng.uniform(0, 30), rng.choice(tasks)
        x = rng.randint(2000, 60000)
        if state == "reward":
            live.append(LifecycleEvent(tid, EventKind.REWARD_START, ts=t0, task=task, group_id=f"g{i // 8}"))
        elif state == "sandbox":
            live.append(LifecycleEvent(tid, EventKind.SANDBOX_START, ts=t0, task=task, mode=SandboxMode.PREWARM))
        elif state == "tool":
            live.append(LifecycleEvent(tid, EventKind.TOOL_START, ts=t0, task=task, tool=rng.choice(tools), turn=rng.randint(0, 20)))
        else:
            live.append(LifecycleEvent(tid, EventKind.REQUEST_ARRIVED, ts=t0, task=task, prompt_tokens=x, instance=str(i % 8)))
            if state in ("prefill", "decode"):
                live.append(LifecycleEvent(tid, EventKind.PREFILL_START, ts=t0, instance=str(i % 8)))
            if state == "decode":
                live.append(LifecycleEvent(tid, EventKind.PREFILL_END, ts=t0 + 0.5))
    for k in range(0, len(live), 10_000):
        cp.ingest(live[k:k + 10_000])
    assert cp.tracker.live_count == n_live, cp.tracker.live_count
    return cp, now


def bench_refresh(sizes: list[int]) -> list[dict]:
    rows = []
    for n in sizes:
        cp, now = populated_plane(n)
        repeats = 3 if n >= 100_000 else 10
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            cp.predictor.forecast(now)
            times.append(time.perf_counter() - start)
        rows.append({"live": n, "median_ms": 1e3 * statistics.median(times), "max_ms": 1e3 * max(times)})
        log.info("refresh: %7d live -> median %.1f ms", n, rows[-1]["median_ms"])
    return rows


# ----- 2. HTTP ingest -----
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_ingest(single: int, batches: int, batch_size: int) -> dict:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "sglang_prorsa.control_plane", "--host", "127.0.0.1", "--port",
                             str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("control plane did not start")
                time.sleep(0.1)
        session = requests.Session()
        start = time.perf_counter()
        for i in range(single):  # sampled + aborted pairs keep the live set small
            kind = "sampled" if i % 2 == 0 else "aborted"
            r = session.post(f"{url}/lifecycle", json={"trajectory_id": f"s{i // 2}", "event": kind}, timeout=10)
            r.raise_for_status()
        single_rate = single / (time.perf_counter() - start)
        log.info("ingest: single %.0f events/s", single_rate)
        start = time.perf_counter()
        for b in range(batches):
            events = []
            for k in range(batch_size // 2):
                tid = f"b{b}-{k}"
                events += [{"trajectory_id": tid, "event": "request_arrived", "prompt_tokens": 4096},
                           {"trajectory_id": tid, "event": "aborted"}]
            session.post(f"{url}/lifecycle", json={"events": events}, timeout=30).raise_for_status()
        batched_rate = batches * batch_size / (time.perf_counter() - start)
        log.info("ingest: batched (%d/batch) %.0f events/s", batch_size, batched_rate)
        return {"single_events_s": single_rate, "batched_events_s": batched_rate, "batch_size": batch_size}
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


# ----- 3. WAPE -----
def bench_wape(duration_s: float, seeds: list[int]) -> list[dict]:
    rows = []
    for name in ("coding_agent", "general_agent"):
        for mode in ("sync", "async"):
            spec = preset(name, mode)
            for bias in (True, False):
                pre, dec, windows = [], [], None
                for seed in seeds:
                    clock = ManualClock(0.0)
                    cp = LifecycleControlPlane(clock, dataclasses.replace(config_for(spec), bias_enabled=bias))
                    report = replay_events(RolloutSimulator(spec, seed, duration_s).events(), cp, clock,
                                           name=spec.name, seed=seed, end_s=duration_s)
                    pre.append(report.wape.prefill)
                    dec.append(report.wape.decode)
                    if seed == seeds[0]:
                        windows = report.windows
                row = {"setting": f"{name}/{mode}", "bias": bias, "prefill": statistics.mean(pre),
                       "decode": statistics.mean(dec), "windows": windows}
                rows.append(row)
                log.info("wape: %-22s bias=%-5s prefill %.2f%% decode %.2f%%", row["setting"], bias,
                         100 * row["prefill"], 100 * row["decode"])
    return rows


def plot(refresh: list[dict], wape: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog([r["live"] for r in refresh], [r["median_ms"] for r in refresh], "o-")
    ax.set_xlabel("live trajectories")
    ax.set_ylabel("forecast refresh (ms, median)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    paths.append(RESULTS / "predictor_refresh_time.png")
    fig.savefig(paths[-1], dpi=120)

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    row = next(r for r in wape if r["setting"] == "coding_agent/async" and r["bias"])
    wins = row["windows"]
    t = [w.start for w in wins]
    axes[0].plot(t, [w.realised_arrivals for w in wins], label="realised prefill arrivals")
    axes[0].plot(t, [w.forecast_arrivals for w in wins], label="forecast (bias-corrected)", alpha=0.8)
    axes[0].plot(t, [w.raw_arrivals for w in wins], label="forecast (raw)", alpha=0.5)
    axes[1].plot(t, [w.realised_decode for w in wins], label="realised decode admissions")
    axes[1].plot(t, [w.forecast_decode for w in wins], label="forecast (bias-corrected)", alpha=0.8)
    for ax in axes:
        ax.set_ylabel("prompt tokens / 10 s")
        ax.legend(fontsize=8)
    axes[1].set_xlabel("simulated time (s), coding_agent/async")
    fig.tight_layout()
    paths.append(RESULTS / "predictor_forecast_vs_realised.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close("all")
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts (smoke run)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    refresh = bench_refresh(sizes)
    ingest = bench_ingest(single=200 if args.quick else 2_000, batches=2 if args.quick else 20, batch_size=1_000)
    wape = bench_wape(duration_s=600 if args.quick else 3600, seeds=[1] if args.quick else [1, 2, 3])
    paths = plot(refresh, wape)

    print("\nForecast refresh time (WorkloadPredictor.forecast)")
    print(f"{'live':>8} {'median ms':>10} {'max ms':>8}")
    for r in refresh:
        print(f"{r['live']:>8} {r['median_ms']:>10.1f} {r['max_ms']:>8.1f}")
    print("\nHTTP ingest on loopback (POST /lifecycle)")
    print(f"  single event per request : {ingest['single_events_s']:>9.0f} events/s")
    print(f"  batched ({ingest['batch_size']} per request) : {ingest['batched_events_s']:>9.0f} events/s")
    print("\nWAPE over 10 s windows (paper: prefill 5.40-14.37 %, decode 5.19-13.69 %)")
    print(f"{'setting':<22} {'bias corr.':>10} {'prefill':>9} {'decode':>9}")
    for r in wape:
        print(f"{r['setting']:<22} {'on' if r['bias'] else 'off':>10} {100 * r['prefill']:>8.2f}% {100 * r['decode']:>8.2f}%")
    print("\nplots:", ", ".join(str(p.relative_to(ROOT)) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
