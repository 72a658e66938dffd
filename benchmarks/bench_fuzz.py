"""Fuzz the generation routes with >= 10,000 generated bodies against a live PD deployment (issue 29).

Starts sglang-router 0.3.2 (PD mode) and a ``--pd-adaptive --prorsa-instances 3`` front (one prefill, two decode,
switching only when told, so the pair addressed directly keeps its roles; ``--auto-switch`` lets the controller
switch as a default deployment does) whose controller fills the router's pools. Bodies come from
``sglang_prorsa/testing/generation_fuzz.py`` (built from each route's schema, plus schema-valid but inconsistent
combinations); case i goes to target ``targets[i % len(targets)]``:

    front    the front (``/generate``, ``/v1/completions``, ``/v1/chat/completions``)
    router   sglang-router over the same instances
    pd       a prefill and a decode instance addressed directly, both halves at once with the bootstrap fields SGLang's
             router adds (the prefill instance's host/port, a random room)
    single   a plain colocated instance (started only when named: a fourth SGLang server)

After every answer that is a 5xx or no answer at all (and a few seconds' wait: a scheduler can die after its request
failed), and every ``--check-every`` cases, each instance's PID and scheduler PIDs and the front's restart count are
compared with the last check; a change is a scheduler exit (the front restarts the instance; the run waits for it and
goes on). The registry's epoch alone is not one (it also moves when a slow instance misses status polls). Writes
``fuzz.json`` (counts per target x class and route, latency quantiles, every 5xx and lost answer with the body as sent,
answers slower than 10 s, each scheduler exit with the log's traceback, PIDs before/after, restarts, time; < 200 KB)
and ``fuzz.png`` under ``--out``, also when interrupted; appends each crasher to ``--findings`` as it happens. Stops
early after ``--stop-after`` failures (each lost answer costs ``--timeout``). Exits 1 on any 5xx caused by the input,
lost answer or scheduler exit.

    python benchmarks/bench_fuzz.py [--cases 10000] [--targets front router pd [single]] [--seed 0] [--timeout 60]
        [--stop-after 25] [--auto-switch] [--out benchmarks/results/fuzz] [--findings /tmp/fuzz_findings.md]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from hypothesis import HealthCheck, Phase, given, seed, settings
from tqdm import tqdm

from sglang_prorsa.srt.utils import processes
from sglang_prorsa.testing import generation_fuzz as gf
from sglang_prorsa.testing.front_client import instances, start_manual_front

ENGINE_FLAGS = ["--chunked-prefill-size", "64", "--max-total-tokens", "65536", "--log-level", "warning"]
TARGETS = ("front", "router", "pd", "single")
MAX_LISTED = 150  # failures kept with their bodies in the JSON
BODY_CHARS = 600
ANSWER_CHARS = 400
SLOW_S = 10.0  # an answer slower than this is listed (with its body) even when it is not a failure
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
log = logging.getLogger("bench_fuzz")


# -- the deployment ------------------------------------------------------------------------------------------------

class Deployment:
    def __init__(self, log_dir: Path, auto_switch: bool, with_single: bool) -> None:
        self.log_dir = log_dir
        self.started: list[processes.ServerProcess] = []
        rport = processes.free_port()
        self.router = self._start(processes.start(
            ["--pd-disaggregation", "--host", processes.LOOPBACK, "--port", str(rport), "--policy", "round_robin",
             "--log-level", "warn", "--prometheus-port", str(processes.free_port()), "--prometheus-host",
             processes.LOOPBACK], name="sglang-router", port=rport, log_dir=log_dir,
            module="sglang_router.launch_router", die_with_parent=True))
        self.router.wait_ready(timeout=120, path="/workers")
        if auto_switch:
            fport = processes.free_port()
            self.front = self._start(processes.start(
                ["--pd-adaptive", "--prorsa-instances", "3", "--prorsa-router", self.router.url, "--prorsa-log-dir",
                 str(log_dir / "instances"), "--host", processes.LOOPBACK, "--port", str(fport), *ENGINE_FLAGS],
                name="front", port=fport, log_dir=log_dir, die_with_parent=True))
        else:
            self.front = self._start(start_manual_front(3, 1, ENGINE_FLAGS, log_dir,
                                                        extra=["--prorsa-router", self.router.url]))
        self.single = None
        if with_single:
            sport = processes.free_port()
            self.single = self._start(processes.start(
                ["--host", processes.LOOPBACK, "--port", str(sport), *ENGINE_FLAGS], name="single", port=sport,
                log_dir=log_dir, die_with_parent=True))
        self.front.wait_ready(timeout=900)
        if self.single is not None:
            self.single.wait_ready(timeout=900)
        deadline = time.monotonic() + 120
        while len(requests.get(self.router.url + "/workers", timeout=10).json().get("workers", [])) < 3:
            if time.monotonic() > deadline:
                raise TimeoutError("the front did not fill the router's pools")
            time.sleep(0.5)

    def _start(self, srv: processes.ServerProcess) -> processes.ServerProcess:
        self.started.append(srv)
        return srv

    def stop(self) -> None:
        processes.stop_many(self.started[::-1], grace_s=10)

    def instance_log(self, instance_id: str) -> Path | None:
        logs = sorted((self.log_dir / "instances").glob(f"instance-{instance_id}*.log"),
                      key=lambda p: p.stat().st_mtime)
        return logs[-1] if logs else None


def snapshot(dep: Deployment) -> dict:
    """Every process the fuzz could kill: {name: {pid, epoch, schedulers, role, status}}, and the restart count."""
    listing = requests.get(dep.front.url + "/prorsa/instances", timeout=30).json()
    out = {}
    for i in listing["instances"]:
        pid = i.get("pid")
        out[i["instance"]] = {"pid": pid, "epoch": i.get("epoch"), "role": i["role"], "status": i["status"],
                              "schedulers": sorted(gf.scheduler_pids(pid)) if pid else None}
    if dep.single is not None:
        out["single"] = {"pid": dep.single.pid, "epoch": None, "role": "null", "status": "active" if
                         dep.single.alive() else "dead", "schedulers": sorted(gf.scheduler_pids(dep.single.pid))}
    failures = listing.get("failures")
    return {"processes": out, "restarts": failures.get("restarts") if isinstance(failures, dict) else None}


def exits_between(before: dict, after: dict, keys: tuple[str, ...] = ("pid", "schedulers")) -> list[dict]:
    """The processes whose PID or scheduler PIDs changed: a scheduler exit (and the restart that followed). The
    registry's epoch is not one: it also moves when a slow instance misses status polls and answers again."""
    return [{"name": k, "before": {x: v[x] for x in keys}, "after": {x: after["processes"].get(k, {}).get(x)
                                                                       for x in keys}}
            for k, v in before["processes"].items()
            if any(after["processes"].get(k, {}).get(x) != v[x] for x in keys)]


def wait_all_active(dep: Deployment, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if all(i["status"] == "active" for i in instances(dep.front.url)):
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError("instances not all active again")


# -- the run -------------------------------------------------------------------------------------------------------

class Run:
    def __init__(self, dep: Deployment, targets: list[str], timeout_s: float, findings: Path | None,
                 check_every: int, stop_after: int) -> None:
        self.dep, self.targets, self.timeout_s, self.findings = dep, targets, timeout_s, findings
        self.check_every, self.stop_after = check_every, stop_after
        self.stopped_early = False
        self.interrupted: str | None = None
        self.counts: dict[str, Counter] = {t: Counter() for t in targets}
        self.per_route: dict[str, dict[str, Counter]] = {t: defaultdict(Counter) for t in targets}
        self.latency: dict[str, list[float]] = {t: [] for t in targets}
        self.failures: list[dict] = []
        self.slow: list[dict] = []  # answered, but slower than SLOW_S (e.g. a half orphaned until a watchdog)
        self.failures_total = 0
        self.exits: list[dict] = []
        self.epoch_changes: list[dict] = []  # registry epochs that moved with no process change (not failures)
        self.timeline: list[tuple[float, int, int]] = []  # (s, cases done, failures so far)
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="pd-half")
        self.rng = random.Random(0)
        self.n = 0
        self.t0 = time.monotonic()
        self.state = snapshot(dep)
        self.pair = self._pair()
        self.marks = self._log_offsets()  # every instance log's size at the last check that found nothing
        self.failed_since_check: list[int] = []  # cases with a 5xx or lost answer since then

    def _pair(self) -> dict | None:
        insts = [i for i in instances(self.dep.front.url) if i["status"] == "active"]
        p = next((i for i in insts if i["role"] == "prefill"), None)
        d = next((i for i in insts if i["role"] == "decode"), None)
        return {"prefill": p, "decode": d} if p and d else None

    def _log_offsets(self) -> dict[str, int]:
        out = {}
        for name in self.state["processes"]:
            path = self.dep.single.log_path if name == "single" else self.dep.instance_log(name)
            if path is not None and path.exists():
                out[str(path)] = path.stat().st_size
        return out

    def one(self, route: str, body) -> None:
        target = self.targets[self.n % len(self.targets)]
        self.n += 1
        if target == "pd":
            body, outcomes = self._send_pd(route, body)
        else:
            url = {"front": self.dep.front.url, "router": self.dep.router.url,
                   "single": self.dep.single.url if self.dep.single else None}[target]
            if target == "router":
                body = gf.with_model(route, body)  # the router refuses the OpenAI routes without one
            outcomes = {target: gf.send(url, route, body, self.timeout_s)}
        failed = False
        for where, o in outcomes.items():
            cls = gf.classify(o)
            self.counts[target][cls] += 1
            self.per_route[target][route][cls] += 1
            self.latency[target].append(o.elapsed_s)
            if o.elapsed_s > SLOW_S and cls not in (gf.INPUT_5XX, gf.NO_ANSWER) and len(self.slow) < MAX_LISTED:
                self.slow.append({"case": self.n, "target": where, "route": route, "class": cls,
                                  "status": o.status, "elapsed_s": round(o.elapsed_s, 2),
                                  "body": json.dumps(body, allow_nan=True)[:BODY_CHARS],
                                  "answer": (o.error or o.text)[:ANSWER_CHARS]})
            if cls in (gf.INPUT_5XX, gf.NO_ANSWER, gf.LEGIT_5XX):
                failed = failed or cls != gf.LEGIT_5XX
                self._record(target, where, route, body, o, cls)
        if failed:
            self.failed_since_check.append(self.n)
        if failed or self.n % self.check_every == 0:
            self._check(route, target, body, settle=failed)
        if self.failures_total >= self.stop_after:
            self.stopped_early = True
        if self.n % 50 == 0:
            self.timeline.append((time.monotonic() - self.t0, self.n, self.failures_total))

    def _send_pd(self, route: str, body) -> tuple[object, dict[str, gf.Outcome]]:
        """Both halves at once; returns the body as sent (with the bootstrap fields) and both answers."""
        if self.pair is None:
            self.pair = self._pair()
        p, d = self.pair["prefill"], self.pair["decode"]
        body = gf.with_bootstrap(body, p["bootstrap_host"], p["bootstrap_port"], self.rng)
        fp = self.pool.submit(gf.send, p["url"], route, body, self.timeout_s)
        fd = self.pool.submit(gf.send, d["url"], route, body, self.timeout_s)
        return body, {"pd:prefill": fp.result(), "pd:decode": fd.result()}

    def _record(self, target: str, where: str, route: str, body, o: gf.Outcome, cls: str) -> None:
        self.failures_total += 1
        if len(self.failures) < MAX_LISTED:
            self.failures.append({"case": self.n, "target": where, "route": route, "class": cls, "status": o.status,
                                  "elapsed_s": round(o.elapsed_s, 3),
                                  "body": json.dumps(body, allow_nan=True)[:BODY_CHARS],
                                  "answer": (o.error or o.text)[:ANSWER_CHARS],
                                  "stream_errors": json.dumps(o.stream_errors)[:ANSWER_CHARS]})
        log.warning("case %d %s %s: %s", self.n, where, route, o.describe())
        if self.findings is not None and cls != gf.LEGIT_5XX:
            gf.append_finding(self.findings, route=route, target=f"{where} (bench_fuzz)", body=body,
                              what=o.describe())

    def _check(self, route: str, target: str, body, settle: bool) -> None:
        if settle:
            time.sleep(5)  # a scheduler can die seconds after its request failed (e.g. on the client's abort)
        now = snapshot(self.dep)
        gone = exits_between(self.state, now)
        if not gone and now["restarts"] == self.state["restarts"]:
            moved = exits_between(self.state, now, ("epoch",))
            if moved:
                self.epoch_changes.append({"case": self.n, "changed": moved})
                self.state = now
            if not settle:
                self.marks, self.failed_since_check = self._log_offsets(), []
            return
        logs = "\n".join(f"{path}:\n{gf.log_traceback(path, off)}" for path, off in self.marks.items())
        event = {"case": self.n, "target": target, "route": route, "body": json.dumps(body, allow_nan=True)[
            :BODY_CHARS], "failed_cases_since_last_check": self.failed_since_check[-20:], "changed": gone,
                 "restarts": [self.state["restarts"], now["restarts"]], "log": logs[-3000:]}
        self.exits.append(event)
        log.error("scheduler exit at case %d (%s %s): %s", self.n, target, route, gone)
        if self.findings is not None:
            gf.append_finding(self.findings, route=route, target=f"{target} (bench_fuzz)", body=body,
                              what=f"scheduler exit / restart: {gone}; detected at case {self.n}, cases that failed "
                                   f"since the last quiet check: {self.failed_since_check[-20:]} (their bodies are "
                                   f"the entries just above; the body below is case {self.n}'s)",
                              log=logs[-6000:])
        if self.dep.single is not None and not self.dep.single.alive() and "single" in self.targets:
            self.targets = [t for t in self.targets if t != "single"]  # nobody restarts it: go on without it
        wait_all_active(self.dep)
        self.state, self.pair = snapshot(self.dep), self._pair()
        self.marks, self.failed_since_check = self._log_offsets(), []


def run_cases(run: Run, n_cases: int, seed_value: int, vocab: int) -> None:
    bar = tqdm(total=n_cases, desc="cases", mininterval=5)

    @seed(seed_value)
    @settings(max_examples=n_cases, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.generate,))
    @given(case=gf.cases(vocab=vocab))
    def drive(case):
        if run.stopped_early:
            raise _Stop
        run.one(*case)
        bar.update()

    try:
        drive()
    except (_Stop, ExceptionGroup):  # --stop-after reached
        pass
    bar.close()


class _Stop(Exception):
    pass


# -- report --------------------------------------------------------------------------------------------------------

def _quantiles(xs: list[float]) -> dict:
    if not xs:
        return {}
    xs = sorted(xs)
    return {"p50_s": round(xs[len(xs) // 2], 4), "p99_s": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 4),
            "max_s": round(xs[-1], 3), "mean_s": round(statistics.fmean(xs), 4)}


def _small_json(result: dict, limit: int = 190_000) -> str:
    """The result as JSON under ``limit`` bytes: the longest listing is halved until it fits (counts stay whole)."""
    lists = ("failures_listed", "slow_answers", "scheduler_exits", "epoch_changes_without_exit", "timeline")
    text = json.dumps(result, indent=1)
    while len(text) > limit:
        longest = max(lists, key=lambda k: len(json.dumps(result[k])))
        if len(result[longest]) <= 1:
            break
        result[longest] = result[longest][: len(result[longest]) // 2]
        result.setdefault("truncated", []).append(longest)
        text = json.dumps(result, indent=1)
    return text


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    targets = list(result["counts"])
    bottom = [0] * len(targets)
    colours = {gf.OK: "tab:green", gf.REFUSED: "tab:blue", gf.INPUT_5XX: "tab:red", gf.LEGIT_5XX: "tab:orange",
               gf.NO_ANSWER: "black"}
    for cls in gf.CLASSES:
        vals = [result["counts"][t].get(cls, 0) for t in targets]
        a.bar(targets, vals, bottom=bottom, label=cls, color=colours[cls])
        bottom = [x + y for x, y in zip(bottom, vals)]
    a.set_ylabel("answers")
    a.set_title("answers per target and class")
    a.legend()
    tl = result["timeline"]
    if tl:
        b.plot([x[0] for x in tl], [x[1] for x in tl], label="cases")
        b.plot([x[0] for x in tl], [x[2] for x in tl], label="5xx / lost answers", color="tab:red")
    for e in result["scheduler_exits"]:
        b.axvline(e.get("at_s", 0), color="black", linestyle=":")
    b.set_xlabel("time (s)")
    b.set_title(f"{result['cases']} cases, {result['input_caused_5xx']} input 5xx, "
                f"{len(result['scheduler_exits'])} scheduler exits")
    b.legend()
    fig.suptitle("Generation-route fuzz (issue 29): front, sglang-router, PD pair directly (CPU, tiny model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=["front", "router", "pd"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds for one answer, read fully")
    ap.add_argument("--check-every", type=int, default=100, help="compare PIDs every this many cases too")
    ap.add_argument("--auto-switch", action="store_true", help="let the controller switch roles on its own")
    ap.add_argument("--stop-after", type=int, default=25,
                    help="stop early after this many 5xx / lost answers (each lost answer costs --timeout)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fuzz")
    ap.add_argument("--findings", type=Path, default=Path("/tmp/fuzz_findings.md"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-fuzz-"))
    log.info("starting the deployment (logs in %s)", log_dir)
    t_start = time.monotonic()
    dep = Deployment(log_dir, args.auto_switch, "single" in args.targets)
    try:
        vocab = gf.vocab_size(url=dep.front.url if "front" in args.targets else None)
        gf.schemas(vocab)  # import SGLang's schemas before the clock starts
        run = Run(dep, list(args.targets), args.timeout, args.findings, args.check_every, args.stop_after)
        before = run.state
        log.info("deployment ready in %.0f s; %d cases over %s", time.monotonic() - t_start, args.cases,
                 args.targets)
        try:
            run_cases(run, args.cases, args.seed, vocab)
            run._check("-", "-", None, settle=True)
        except (KeyboardInterrupt, TimeoutError) as e:  # still write what was measured
            log.error("run interrupted at case %d: %r", run.n, e)
            run.interrupted = repr(e)
        after = snapshot(dep)
        valid = {t: gf.send(u, "/generate", {"text": "after the fuzz", "sampling_params": {"max_new_tokens": 2}},
                            args.timeout).status
                 for t, u in (("front", dep.front.url), ("router", dep.router.url))}
        elapsed = time.monotonic() - run.t0
    finally:
        dep.stop()
    for e in run.exits:
        e["at_s"] = next((t for t, n, _ in run.timeline if n >= e["case"]), elapsed)
    input_5xx = sum(c[gf.INPUT_5XX] for c in run.counts.values())
    lost = sum(c[gf.NO_ANSWER] for c in run.counts.values())
    result = {
        "cases": run.n, "targets": args.targets, "seed": args.seed, "timeout_s": args.timeout,
        "auto_switch": args.auto_switch, "max_new_tokens": gf.MAX_NEW, "vocab": vocab,
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "elapsed_s": round(elapsed, 1), "cases_per_s": round(run.n / elapsed, 2) if elapsed else None,
        "counts": {t: dict(c) for t, c in run.counts.items()},
        "per_route": {t: {r: dict(c) for r, c in rs.items()} for t, rs in run.per_route.items()},
        "latency": {t: _quantiles(xs) for t, xs in run.latency.items()},
        "input_caused_5xx": input_5xx, "lost_answers": lost,
        "legitimate_5xx": sum(c[gf.LEGIT_5XX] for c in run.counts.values()),
        "legitimate_5xx_kinds": {f"{s} {c}": why for (s, c), why in gf.LEGITIMATE_5XX.items()},
        "failures_listed": run.failures, "failures_total": run.failures_total,
        "stopped_early": run.stopped_early, "interrupted": run.interrupted,
        "slow_answers": run.slow,
        "scheduler_exits": run.exits,
        "epoch_changes_without_exit": run.epoch_changes[:MAX_LISTED],
        "processes": {"before": before, "after": after},
        "valid_request_after": valid,
        "skipped_fields": gf.SKIPPED,
        "timeline": run.timeline[:: max(1, len(run.timeline) // 200)],
    }
    result["ok"] = (input_5xx == 0 and lost == 0 and not run.exits and not run.stopped_early
                    and run.interrupted is None and all(v == 200 for v in valid.values()))
    (args.out / "fuzz.json").write_text(_small_json(result))
    plot(result, args.out / "fuzz.png")
    print(f"\n{run.n} cases in {elapsed:.0f} s ({result['cases_per_s']}/s) over {args.targets}")
    for t, c in run.counts.items():
        print(f"  {t:>7}: " + ", ".join(f"{k} {c.get(k, 0)}" for k in gf.CLASSES))
    print(f"input-caused 5xx: {input_5xx}, lost answers: {lost}, scheduler exits: {len(run.exits)}, "
          f"answers slower than {SLOW_S:.0f} s: {len(run.slow)}, valid request after: {valid}")
    print(f"wrote {args.out / 'fuzz.json'} and {args.out / 'fuzz.png'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
