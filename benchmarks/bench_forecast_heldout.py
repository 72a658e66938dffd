"""Forecast accuracy over HTTP on a held-out family of workload settings, beside persistence and the floor.

For each setting of ``benchmarks/forecast_settings.json`` (``make_forecast_settings.py``; sglang_prorsa/workload/
family.py): generate the trace (workload/simulator.py), drop the hints the setting's trainer does not send
(workload/hints.py), and replay it into the control plane's HTTP API, as a trainer and an engine would: post the
configuration (``POST /lifecycle/config``, replay.config_for), then window by window post the window's events in
batches (``POST /lifecycle {"events": [...]}``) and at every boundary t_k = k*S ask for the forecast
(``GET /prorsa/forecast?at=t_k``). The last forecast's running WAPE of the served forecast, of each member
(lifecycle, persistence, time series; where the server reports them) and of persistence are read back; the
exact-probability floor (workload/oracle.py, FloorOracle) forecasts the same windows in this process from the full
event stream.

The server: the real control plane as a subprocess on 127.0.0.1, on the trace's clock (``python -m
sglang_prorsa.control_plane --clock trace``: events and ``?at=`` move the clock, every window closes at its scheduled
end, ``POST /lifecycle/reset`` starts a new replay). One server serves every setting, reset before each (a fresh
tracker, predictor and clock; starting a process costs ~5-8 s of imports here, a reset milliseconds);
``--server-per-setting`` starts one per setting instead (the same numbers). No background refresher runs on a trace
clock: replayed ~100x faster than real time it would fire at arbitrary points of the trace, and each forecast moves
state the next one reads (the admission horizon's load estimate). The served WAPEs equal those of the in-process
replay (workload/replay.py) exactly.

Scoring. WAPE = sum |forecast - realised| / sum realised over 10 s windows (SPEC.md "Accuracy"); the served forecast's
ratio to persistence is the server's own (``baseline.ratio``: both on the windows where persistence exists), a
member's is its running WAPE over persistence's. The floor is scored on persistence's windows, with realised values
rebuilt here from the trace (prompt tokens of ``request_arrived`` and of ``prefill_end``); the served forecast and
persistence are also rebuilt here on those windows from the forecasts the GETs returned (``check``, per setting and
in the summary). Persistence and the served prefill forecast equal the server's exactly; the served decode
forecast differs a little, because the GET's answer is the second forecast at t_k (the first opened the window) and
a forecast's admission horizon reads the load estimate the forecast before it left.

    PYTHONSAFEPATH=1 PYTHONPATH=. python benchmarks/bench_forecast_heldout.py [--quick] [--settings FILE]
        [--only ID,...] [--duration S] [--out DIR] [--server-per-setting]

Writes ``heldout.json`` (every setting's seed and parameters, its WAPEs and ratios, the summary, wall times),
``heldout.png`` and ``heldout.md`` under ``--out`` (default ``benchmarks/results/forecast_heldout``; ``--quick``
writes ``heldout_quick.md`` only, ``--only`` ``heldout_only.*``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S
from sglang_prorsa.policy.lifecycle.events import EventKind
from sglang_prorsa.workload import RolloutSimulator, config_for
from sglang_prorsa.workload.family import spec_from_params
from sglang_prorsa.workload.hints import dropped_kinds, engine_view
from sglang_prorsa.workload.oracle import FloorOracle

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ROOT / "benchmarks" / "forecast_settings.json"
OUT = ROOT / "benchmarks" / "results" / "forecast_heldout"
BATCH_EVENTS = 5_000
KINDS = ("prefill", "decode")
MEMBERS = ("lifecycle", "timeseries", "persistence")
FORECASTERS = ("served", "lifecycle", "timeseries", "floor")  # compared with persistence
QUICK_COUNT, QUICK_DURATION_S = 12, 1500.0
log = logging.getLogger("bench_forecast_heldout")


# ----- the server -----
class Server:
    """``python -m sglang_prorsa.control_plane --clock trace`` on 127.0.0.1, ended by its PID."""

    def __init__(self, horizon_s: float) -> None:
        import requests

        from sglang_prorsa.srt.utils.processes import free_port, start

        self.port = free_port()
        started = time.perf_counter()
        args = ["--host", "127.0.0.1", "--port", str(self.port), "--horizon", str(horizon_s), "--clock", "trace"]
        self.proc = start(args, name=f"heldout-{self.port}", port=self.port, env={"PYTHONPATH": str(ROOT)},
                          module="sglang_prorsa.control_plane")
        self.ready_s = self.proc.wait_ready(timeout=300.0)
        self.start_wall_s = time.perf_counter() - started
        self.url = self.proc.url
        self.session = requests.Session()

    def reset(self, horizon_s: float) -> None:
        self.session.post(f"{self.url}/lifecycle/reset", timeout=60).raise_for_status()

    def stop(self) -> None:
        self.session.close()
        self.proc.stop()


# ----- one setting -----
def _fraction(errors: float, total: float) -> float | None:
    return errors / total if total > 0 else None


def _served(fc: dict) -> tuple[float, float, str | None, str | None]:
    """The served forecast (prefill arrivals, decode admissions) and which member served, from a forecast's JSON."""
    served = fc.get("served")
    if served:
        p, d = served["prefill"], served["decode"]
        return float(p["arrival_tokens"]), float(d["admission_tokens"]), p.get("member"), d.get("member")
    return float(fc["prefill_arrival_tokens"]), float(fc["decode_admission_tokens"]), None, None


def run_setting(server: Server, params: dict, duration_s: float, horizon_s: float) -> dict:
    spec = spec_from_params(params)
    seed = params["seed"]
    session, url = server.session, server.url
    started = time.perf_counter()
    server.reset(horizon_s)
    session.post(f"{url}/lifecycle/config", json=config_for(spec, horizon_s).to_dict(), timeout=60).raise_for_status()
    oracle = FloorOracle(spec, seed, horizon_s)
    drop = dropped_kinds(params["hints"])
    strip = EventKind.SAMPLED in drop
    sim = RolloutSimulator(spec, seed, duration_s)

    batch: list[dict] = []
    posted = rejected_posts = 0
    prompt_of: dict[str, int] = {}
    realised = [0.0, 0.0]
    windows: list[dict] = []  # one per boundary: what was forecast for the window it opens, and realised of the last
    timing = {"post_s": 0.0, "forecast_s": 0.0, "floor_s": 0.0}
    last_fc: dict = {}

    def flush() -> None:
        nonlocal batch, posted, rejected_posts
        if not batch:
            return
        t0 = time.perf_counter()
        r = session.post(f"{url}/lifecycle", data=orjson.dumps({"events": batch}), timeout=120,
                         headers={"Content-Type": "application/json"})
        r.raise_for_status()
        answer = r.json()
        posted += answer["received"]
        rejected_posts += answer["rejected"]
        timing["post_s"] += time.perf_counter() - t0
        batch = []

    def boundary(t: float) -> None:
        nonlocal last_fc
        flush()
        t0 = time.perf_counter()
        floor = oracle.forecast(t)
        t1 = time.perf_counter()
        r = session.get(f"{url}/prorsa/forecast", params={"at": repr(t)}, timeout=120)
        r.raise_for_status()
        fc = last_fc = r.json()
        timing["floor_s"] += t1 - t0
        timing["forecast_s"] += time.perf_counter() - t1
        if windows:
            windows[-1]["realised"] = tuple(realised)
        served_p, served_d, member_p, member_d = _served(fc)
        windows.append({"t": t, "served": (served_p, served_d), "member": (member_p, member_d), "floor": floor})
        realised[0] = realised[1] = 0.0

    next_tick = 0.0
    events = 0
    for event in sim.events():
        while event.ts >= next_tick:
            boundary(next_tick)
            next_tick += horizon_s
        events += 1
        oracle.observe(event)
        kind = event.kind
        if kind is EventKind.REQUEST_ARRIVED:
            prompt_of[event.trajectory_id] = event.prompt_tokens or 0
            realised[0] += event.prompt_tokens or 0
        elif kind is EventKind.PREFILL_END:
            realised[1] += prompt_of.get(event.trajectory_id, 0)
        elif kind is EventKind.REWARD_END:
            prompt_of.pop(event.trajectory_id, None)
        if kind in drop:
            continue
        batch.append((engine_view(event) if strip else event).to_dict())
        if len(batch) >= BATCH_EVENTS:
            flush()
    while duration_s >= next_tick:
        boundary(next_tick)
        next_tick += horizon_s
    closed = [w for w in windows if "realised" in w]
    return {"id": params["id"], "duration_s": duration_s, "horizon_s": horizon_s, "events": events,
            "events_posted": posted, "rejected_on_post": rejected_posts,
            "launched": sim.launched, "kv_waits": sim.kv_waits, "wall_s": time.perf_counter() - started,
            "timing_s": timing, "floor_valid": floor_validity(params), **score(closed, last_fc, floor_validity(params))}


def floor_validity(params: dict) -> dict[str, bool]:
    """Where FloorOracle's engine model holds. It takes decode as never capacity-bound (a finished prefill is admitted
    at once), prefill service at its mean, and ignores queueing behind future arrivals (its docstring: small at the
    presets' low utilisation): with a bounded decode KV cache both its arrival and its admission probabilities miss
    the wait for KV; with a busy or saturated prefill its admissions miss the queues (its decode numbers there were
    seen above the served forecast's, and above persistence's)."""
    unbounded = params["decode_kv_tokens"] is None
    return {"prefill": unbounded, "decode": unbounded and params["prefill_load"] in ("idle", "light")}


def score(closed: list[dict], fc: dict, floor_valid: dict[str, bool]) -> dict:
    """WAPEs from the last forecast (the server's running ones) and, on persistence's windows, the floor and the
    served forecast / persistence rebuilt here."""
    scored = closed[1:]  # persistence needs a previous window
    rebuilt: dict = {}
    for i, kind in enumerate(KINDS):
        real = [w["realised"][i] for w in scored]
        total = sum(real)
        prev = [w["realised"][i] for w in closed[:-1]]
        err = lambda forecasts: _fraction(sum(abs(f - r) for f, r in zip(forecasts, real)), total)  # noqa: E731
        rebuilt[kind] = {
            "served": err([w["served"][i] for w in scored]),
            "persistence": err(prev),
            "floor": err([w["floor"][i] for w in scored]),
            "realised_mean": total / len(real) if real else None,
        }
    for kind in KINDS:  # the oracle's model of the engine: where it does not hold, its numbers are no floor
        rebuilt[kind]["floor_raw"] = rebuilt[kind]["floor"]
        if not floor_valid[kind]:
            rebuilt[kind]["floor"] = None
    wape, base = fc.get("wape") or {}, fc.get("baseline") or {}
    members = fc.get("members") or {}
    server: dict = {}
    for kind in KINDS:
        row = {"served": wape.get(kind), "served_on_persistence_windows": (base.get("forecast_wape") or {}).get(kind),
               "persistence": (base.get("wape") or {}).get(kind), "ratio": (base.get("ratio") or {}).get(kind)}
        row["members"] = {m: {k: info.get(k) for k in ("wape", "recent_wape", "weight")}
                          for m, info in (members.get(kind) or {}).items() if m in MEMBERS and info}
        server[kind] = row
    served_by = {kind: {} for kind in KINDS}
    for w in closed:
        for i, kind in enumerate(KINDS):
            name = w["member"][i] or "lifecycle (no served field)"
            served_by[kind][name] = served_by[kind].get(name, 0) + 1
    out: dict = {"windows": len(closed), "scored_windows": len(scored), "server": server, "rebuilt": rebuilt,
                 "served_by": served_by, "live_at_end": fc.get("live_trajectories"),
                 "rejected_events": fc.get("rejected_events"),
                 "fields": {"served": "served" in fc, "members": "members" in fc}}  # dropped from the file (meta)
    out["wape"], out["ratio"] = headline(server, rebuilt)
    return out


def headline(server: dict, rebuilt: dict) -> tuple[dict, dict]:
    """Per kind: the WAPE of each forecaster (server's running ones; the floor on persistence's windows) and its ratio
    to persistence."""
    wape, ratio = {}, {}
    for kind in KINDS:
        s, r = server[kind], rebuilt[kind]
        persistence = s["persistence"]
        w = {"served": s["served"], "persistence": persistence, "floor": r["floor"]}
        for m in ("lifecycle", "timeseries"):
            w[m] = (s["members"].get(m) or {}).get("wape")
        wape[kind] = w
        div = lambda x: None if x is None or not persistence else x / persistence  # noqa: E731
        ratio[kind] = {"served": s["ratio"] if s["ratio"] is not None else div(s["served"]),
                       "lifecycle": div(w["lifecycle"]), "timeseries": div(w["timeseries"]),
                       "floor": None if r["floor"] is None or not r["persistence"] else r["floor"] / r["persistence"]}
    return wape, ratio


# ----- summary and output -----
def summarise(rows: list[dict]) -> dict:
    out: dict = {"settings": len(rows)}
    for kind in KINDS:
        for name in FORECASTERS:
            vals = [r["ratio"][kind][name] for r in rows if r["ratio"][kind][name] is not None]
            if not vals:
                continue
            out[f"{kind}_{name}_ratio"] = {"max": max(vals), "median": statistics.median(vals), "min": min(vals),
                                           "above_1": sum(v > 1.0 for v in vals), "above_0.8": sum(v > 0.8 for v in vals),
                                           "n": len(vals)}
    either = [r for r in rows if any((r["ratio"][k]["served"] or 0) > 1.0 for k in KINDS)]
    out["served_above_1_either"] = len(either)
    out["served_above_1_ids"] = [r["id"] for r in either]
    for kind in KINDS:
        for name, theirs in (("served", "served_on_persistence_windows"), ("persistence", "persistence")):
            devs = [abs(r["rebuilt"][kind][name] - r["server"][kind][theirs]) for r in rows
                    if r["rebuilt"][kind][name] is not None and r["server"][kind][theirs] is not None]
            out[f"check_{kind}_{name}_max_abs_diff"] = max(devs) if devs else None
    return out


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}"


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def describe(p: dict) -> str:
    sandbox = "none" if p["cold_fraction"] is None else f"{p['cold_fraction']:.0%} cold"
    kv = p["decode_kv"]
    return (f"{p['base'].split('_')[0]} {p['mode']} {p['live']}x{p['group_size']} {p['tool_shape']}x{p['tool_scale']:.2g} "
            f"turns {p['turns']} sb {sandbox} hints {p['hints']} prefill {p['prefill_load']} kv {kv}")


def table(rows: list[dict], params: dict[str, dict]) -> str:
    head = ("| id | setting | prefill WAPE % served / lifecycle / timeseries / persistence / floor | ratio served "
            "(floor) | decode WAPE % served / lifecycle / timeseries / persistence / floor | ratio served (floor) |\n"
            "| --- | --- | --- | --- | --- | --- |\n")
    lines = []
    for r in rows:
        cells = []
        for kind in KINDS:
            w, q = r["wape"][kind], r["ratio"][kind]
            raw = r["rebuilt"][kind]["floor_raw"]
            floor = _pct(w["floor"]) if w["floor"] is not None or raw is None else f"[{_pct(raw)}]"
            cells.append(" / ".join([*(_pct(w[n]) for n in ("served", "lifecycle", "timeseries", "persistence")), floor]))
            cells.append(f"{_x(q['served'])} ({_x(q['floor'])})")
        lines.append(f"| {r['id']} | {describe(params[r['id']])} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def summary_text(summary: dict, meta: dict) -> str:
    lines = [f"settings: {summary['settings']}; wall time {meta['wall_s']:.0f} s ({meta['wall_s'] / 60:.1f} min; server "
             f"start {meta['server_start_s']:.1f} s); fields in the forecast: served {meta['fields']['served']}, "
             f"members {meta['fields']['members']}"]
    for kind in KINDS:
        for name in FORECASTERS:
            s = summary.get(f"{kind}_{name}_ratio")
            if s:
                lines.append(f"{kind:<7} {name:<10} / persistence: median {s['median']:.2f}, max {s['max']:.2f}, min "
                             f"{s['min']:.2f}; above 1.0: {s['above_1']}/{s['n']}, above 0.8: {s['above_0.8']}/{s['n']}")
    lines.append(f"settings where served > persistence (prefill or decode): {summary['served_above_1_either']} "
                 f"{summary['served_above_1_ids']}")
    lines.append("check (WAPE rebuilt here from the trace and the GETs vs the server's, on persistence's windows), "
                 "max |diff|: " + ", ".join(f"{kind} {name} {summary[f'check_{kind}_{name}_max_abs_diff'] or 0:.4f}"
                                            for kind in KINDS for name in ("served", "persistence")))
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    style = {"served": ("o", "C0"), "lifecycle": ("s", "C1"), "timeseries": ("^", "C2"), "floor": ("x", "k")}
    for ax, kind in zip(axes, KINDS):
        order = sorted(rows, key=lambda r: (r["ratio"][kind]["served"] is None, r["ratio"][kind]["served"] or 0))
        x = range(len(order))
        for name in FORECASTERS:
            ys = [r["ratio"][kind][name] for r in order]
            if all(y is None for y in ys):
                continue
            marker, color = style[name]
            ax.plot(x, [math.nan if y is None else y for y in ys], marker=marker, color=color, ls="-" if name ==
                    "served" else "none", lw=0.8, ms=4, label=name, alpha=0.85)
        ax.axhline(1.0, color="red", ls="--", lw=0.8, label="1.0 (persistence)")
        ax.axhline(0.8, color="grey", ls=":", lw=0.8, label="0.8")
        ax.set_xticks(list(x), [r["id"] for r in order], rotation=90, fontsize=5)
        ax.set_title(f"{kind}: WAPE / persistence WAPE (settings sorted by served)")
        ax.set_yscale("log")  # ratios: members far off persistence (x10-x100) would flatten the rest
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("ratio to persistence (log scale)")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=64)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", type=Path, default=SETTINGS)
    parser.add_argument("--only", help="comma-separated setting ids")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_COUNT} settings spread over the family, {QUICK_DURATION_S:.0f} s each")
    parser.add_argument("--duration", type=float, help="simulated seconds per setting (default: each setting's own)")
    parser.add_argument("--horizon", type=float, default=DEFAULT_HORIZON_S)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--server-per-setting", action="store_true", help="a fresh server process for each setting")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    document = json.loads(args.settings.read_text())
    settings = document["settings"]
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {p["id"] for p in settings})
        if unknown:
            parser.error(f"unknown setting ids: {unknown}")
        settings = [p for p in settings if p["id"] in wanted]
    elif args.quick:
        step = len(settings) / QUICK_COUNT
        settings = [settings[int(i * step)] for i in range(QUICK_COUNT)]
    duration = args.duration or (QUICK_DURATION_S if args.quick else None)
    params = {p["id"]: p for p in settings}

    from tqdm import tqdm

    started = time.perf_counter()
    tree = _tree()  # the server imports the forecast code once, when it starts: record what it read
    server = None if args.server_per_setting else Server(args.horizon)
    starts = [server.start_wall_s] if server else []
    rows = []
    try:
        bar = tqdm(settings, unit="setting", file=sys.stderr, dynamic_ncols=True)
        for p in bar:
            bar.set_postfix_str(p["id"])
            own = None
            if server is None:
                own = Server(args.horizon)
                starts.append(own.start_wall_s)
            try:
                row = run_setting(server or own, p, duration or p["duration_s"], args.horizon)
            finally:
                if own is not None:
                    own.stop()
            rows.append(row)
            q = row["ratio"]
            log.info("%s %-95s prefill %s%% / persistence %s%% / floor %s%% (x%s)  decode x%s  %d windows, %d "
                     "events, %.1f s", row["id"], describe(p), _pct(row["wape"]["prefill"]["served"]),
                     _pct(row["wape"]["prefill"]["persistence"]), _pct(row["wape"]["prefill"]["floor"]),
                     _x(q["prefill"]["served"]), _x(q["decode"]["served"]), row["scored_windows"], row["events"],
                     row["wall_s"])
    finally:
        if server is not None:
            server.stop()
    wall = time.perf_counter() - started
    fields = {k: any(r["fields"][k] for r in rows) for k in ("served", "members")}
    meta = {"wall_s": wall, "server": "cli", "server_start_s": sum(starts), "server_starts": len(starts), "fields": fields,
            "settings_file": str(args.settings.relative_to(ROOT) if args.settings.is_relative_to(ROOT) else
                                 args.settings),
            "settings_seed": document.get("seed"), "horizon_s": args.horizon, "quick": args.quick,
            "duration_override_s": duration, "refresher": False,
            "server_per_setting": args.server_per_setting, "python": platform.python_version(),
            "load_average_at_end": os.getloadavg(), "commit": _commit(), **tree}
    summary = summarise(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "heldout_quick" if args.quick else "heldout"
    if args.only:
        stem += "_only"
    text = summary_text(summary, meta)
    outputs = ["md"]
    if not args.quick:  # the quick run is a smoke test: its table is enough (results stay small in git)
        outputs = ["json", "png", "md"]
        exported = [export(row, params[row["id"]]) for row in rows]
        (args.out / f"{stem}.json").write_text(render({"meta": meta, "summary": summary, "results": exported}))
        plot(rows, args.out / f"{stem}.png", f"{len(rows)} held-out settings ({meta['settings_file']}, seed "
             f"{meta['settings_seed']}), served fields: {fields['served']}, members: {fields['members']}")
    changed = meta["uncommitted"] or []
    run = (f"Commit {meta['commit']}" + (" with uncommitted changes under sglang_prorsa/ ("
                                         + ", ".join(c.strip() for c in changed) + ")" if changed else "")
           + f"; server: {meta['server']}; forecast sources sha256 {meta['forecast_sources_sha256']}; background refresher "
           f"{'on' if meta['refresher'] else 'off'}; load average at the end "
           + ", ".join(f"{x:.1f}" for x in meta["load_average_at_end"]) + ".")
    md = (f"# Held-out forecast accuracy over HTTP\n\n`{' '.join(['python', *sys.argv])}`\n\n{run}\n\n"
          f"```\n{text}\n```\n\n"
          f"WAPE in % (floor: exact arrival probabilities, workload/oracle.py; scored on persistence's windows; "
          f"[x]: where the oracle's engine model does not hold (bounded decode KV; decode under a busy or saturated "
          f"prefill), "
          f"not a floor and left out of the summary). Ratios: WAPE / persistence WAPE.\n\n" + table(rows, params))
    (args.out / f"{stem}.md").write_text(md)
    print(table(rows, params))
    print(text)
    print("wrote", ", ".join(str((args.out / f"{stem}.{ext}").relative_to(ROOT) if args.out.is_relative_to(ROOT)
                                 else args.out / f"{stem}.{ext}") for ext in outputs))
    return 0


def export(row: dict, params: dict) -> dict:
    """A setting's line in the JSON: per kind the WAPE of each forecaster (``floor`` null where the oracle's model
    does not hold, ``floor_raw`` its number anyway), the served forecast's ratio to persistence (the server's), the
    members' final weights, which member served how many windows, and ``check`` (WAPE rebuilt here minus the
    server's, served forecast on persistence's windows); then the run's counts and the setting's parameters (those
    that apply: forecast_settings.json has the nulls)."""
    out = {k: row[k] for k in ("id", "duration_s", "scored_windows", "events", "events_posted", "rejected_events",
                               "launched", "kv_waits", "live_at_end", "wall_s")}
    for kind in KINDS:
        server, rebuilt = row["server"][kind], row["rebuilt"][kind]
        members = server["members"]
        theirs = server["served_on_persistence_windows"]
        out[kind] = {**row["wape"][kind], "ratio": row["ratio"][kind]["served"],
                     "weight": {m: v.get("weight") for m, v in members.items()},
                     "served_by": row["served_by"][kind],
                     "check": None if rebuilt["served"] is None or theirs is None else rebuilt["served"] - theirs}
        if out[kind]["floor"] is None:
            out[kind]["floor_raw"] = rebuilt["floor_raw"]
    out["params"] = {k: v for k, v in params.items() if v is not None}  # null: not applicable to the setting
    return out


def _rounded(value, digits: int = 4):
    """Floats to ``digits`` significant digits, recursively (the file stays small; the numbers are measurements)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v, digits) for v in value]
    return value


def render(result: dict) -> str:
    """One line per meta and summary entry and per setting."""
    one = lambda value: json.dumps(_rounded(value), separators=(",", ":"))  # noqa: E731
    parts = [f' "{name}": {{\n' + ",\n".join(f"  {json.dumps(k)}: {one(v)}" for k, v in result[name].items()) + "\n }"
             for name in ("meta", "summary")]
    parts.append(' "results": [\n' + ",\n".join(f"  {one(r)}" for r in result["results"]) + "\n ]")
    text = "{\n" + ",\n".join(parts) + "\n}\n"
    assert json.loads(text)["results"][0]["id"] == result["results"][0]["id"]
    return text


def _tree() -> dict:
    """What the forecast ran on beyond the commit: uncommitted changes under sglang_prorsa/ and a digest of the forecast
    package's sources."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((ROOT / "sglang_prorsa" / "policy" / "forecast").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    try:
        changed = subprocess.run(["git", "status", "--short", "--", "sglang_prorsa"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        changed = None
    return {"uncommitted": changed, "forecast_sources_sha256": digest.hexdigest()[:16]}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
