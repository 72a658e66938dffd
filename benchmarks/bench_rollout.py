"""Real multi-turn agentic rollouts on real servers: colocated vs static PD vs adaptive PD, one workload, one seed.

Each mode is launched in turn on the same number of instances with the same flags otherwise
(``launch_server --pd-adaptive --prorsa-instances N`` / ``--pd-static P:D`` / ``--pd-colocated N``), or an already
running server is driven with ``--url`` (``make serve`` plus this command shows forecasts, decisions and switches live).
The trainer side is the SDK (``sglang_prorsa.client``): GRPO groups of agentic episodes, each turn a real greedy
generation whose context grows with the tool's output; tools run as real subprocesses (``sh -c 'sleep D; echo ids'``)
or timed waits, with durations, result sizes, sandbox starts (prewarm / cold), agent overheads and rewards drawn from
``sglang_prorsa.workload.presets`` and scaled (``--time-scale``, ``--token-scale``); the whole workload, token ids
included, is a function of ``--seed``. Step policies: synchronous (``--staleness 0``) or asynchronous with staleness k
(step s may start rolling out once step s-k-1 has trained). Between steps a training gap and, where the server supports
it, a weight update from disk (alternating the embedded tiny model and a second one made with another seed; a 404 is
reported and the updates skipped).

Per mode: rollout step times (ratio to colocated), trajectory completion p50/p99, generated tokens/s, CPU-idle share
(1 - busy seconds from the instances' /prorsa/metrics over wall x instances), switches, the live forecast's WAPE,
prefix-cache hit rate (cached prompt tokens reported by the engine / prompt tokens sent), requests lost (must be 0) and
whether the greedy outputs equal colocated's (compared per (trajectory, turn) while both ran on the same weights).

    python benchmarks/bench_rollout.py --quick --json /tmp/rollout.json
    python benchmarks/bench_rollout.py --url http://127.0.0.1:30000        # drive `make serve`

Honest reading: on a 2-core CPU machine every mode's instances share the same two cores, so PD cannot add compute
and the CPU engine's per-request overheads dominate a tiny model; what the run shows is that the three modes serve the
same trainer unchanged, lose nothing, agree on greedy outputs, and how often and when the adaptive loop switches. How
much faster a step gets on GPUs, where instances own their devices, is the simulator's question.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from sglang_prorsa.client import (
    AsyncProrsaClient,
    HintConfig,
    ProrsaClientError,
    ProrsaConnectionError,
    ProrsaHTTPError,
)
from sglang_prorsa.srt.utils import processes
from sglang_prorsa.workload.generator import WorkloadGenerator
from sglang_prorsa.workload.presets import TASKS
from sglang_prorsa.workload.scaling import PlanScale

MODES = ("adaptive", "static", "colocated", "single")
MODE_FLAG = {"adaptive": "--pd-adaptive", "static": "--pd-static", "colocated": "--pd-colocated"}
# /prorsa/info "mode" of servers whose engines report request transitions themselves (a front's instances, or a single
# server with its own control plane): the client then sends only the trainer's hints.
FRONT_MODES = {"adaptive", "static", "colocated", "single"}
TOKEN_LO, TOKEN_HI = 10, 1000  # token ids drawn for prompts and tool output: clear of the tiny vocab's specials


# ----- the workload: a pure function of the seed ---------------------------------------------------------------

@dataclass(frozen=True)
class Turn:
    output_tokens: int
    tool: str | None
    tool_s: float
    tool_ids: tuple[int, ...]
    overhead_s: float


@dataclass(frozen=True)
class Episode:
    trajectory_id: str
    group_id: str
    step: int
    task: str
    prompt_ids: tuple[int, ...]
    sandbox: str | None
    dispatch_s: float
    startup_s: float
    first_request_s: float  # sandbox ready -> the first request (the agent's set-up)
    turns: tuple[Turn, ...]
    reward_s: float
    accepted: bool


def plan_scale(args: argparse.Namespace) -> PlanScale:
    """The scaling of the preset's plans: shared with the simulator's prediction of this run (``--sim-predict``)."""
    return PlanScale(time_scale=args.time_scale, token_scale=args.token_scale, max_wait_s=args.max_wait_s,
                     min_prompt=args.min_prompt, max_prompt=args.max_prompt, min_new=args.min_new,
                     max_new=args.max_new, max_tool_tokens=args.max_tool_tokens, max_turns=args.max_turns)


def build_workload(args: argparse.Namespace) -> list[list[list[Episode]]]:
    """steps -> groups -> members: the preset's plans scaled by ``plan_scale``; a group shares its first member's
    prompt; token ids seeded."""
    gen = WorkloadGenerator(TASKS[args.preset], args.seed)
    scale = plan_scale(args)
    steps = []
    for s in range(args.steps):
        groups = []
        for g in range(args.groups):
            gid = f"s{s}g{g}"
            first = (s * args.groups + g) * args.group_size
            plans = scale.apply_group([gen.plan(first + m, gid) for m in range(args.group_size)])
            rng = random.Random(f"{args.seed}/prompt/{gid}")
            prompt = tuple(rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(plans[0].first_prompt_tokens))
            members = []
            for m, plan in enumerate(plans):
                tid = f"{gid}m{m}"
                turns = []
                for k, tp in enumerate(plan.turns):
                    trng = random.Random(f"{args.seed}/tool/{tid}/{k}")
                    turns.append(Turn(output_tokens=tp.output_tokens, tool=tp.tool, tool_s=tp.tool_s,
                                      tool_ids=tuple(trng.randrange(TOKEN_LO, TOKEN_HI)
                                                     for _ in range(tp.tool_result_tokens)),
                                      overhead_s=tp.agent_overhead_s))
                members.append(Episode(
                    trajectory_id=tid, group_id=gid, step=s, task=plan.task, prompt_ids=prompt,
                    sandbox=None if plan.sandbox_mode is None else plan.sandbox_mode.value,
                    dispatch_s=plan.dispatch_s, startup_s=plan.startup_s, first_request_s=plan.first_request_s,
                    turns=tuple(turns), reward_s=plan.reward_s, accepted=bool(plan.accepted)))
            groups.append(members)
        steps.append(groups)
    return steps


# ----- one mode's run --------------------------------------------------------------------------------------------

@dataclass
class RunRecord:
    """Everything measured client-side during one mode's run."""

    t0: float = field(default_factory=time.time)
    # Prefixes the ids on the wire: a long-running server remembers finished trajectory ids, so a second run against
    # it must not reuse them. Records stay keyed by the workload's own ids, which every mode shares.
    nonce: str = field(default_factory=lambda: f"r{random.SystemRandom().randrange(16**6):06x}")
    requests: dict[tuple[str, int], dict] = field(default_factory=dict)  # (trajectory, turn) -> record
    trajectories: dict[str, tuple[float, float | None]] = field(default_factory=dict)  # start, end (None: failed)
    lost: list[str] = field(default_factory=list)
    sent: int = 0
    step_done: dict[int, float] = field(default_factory=dict)
    step_consumed: dict[int, float] = field(default_factory=dict)  # when the trainer took the step (in order)
    step_launch: dict[int, float] = field(default_factory=dict)
    weight_updates: list[str] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    episode_errors: list[str] = field(default_factory=list)  # failures outside generation (tools)


async def run_tool(turn: Turn, how: str) -> list[int]:
    """The tool's output ids, after the tool's duration: a real subprocess, or a timed wait."""
    if how == "wait" or not turn.tool_ids:
        await asyncio.sleep(turn.tool_s)
        return list(turn.tool_ids)
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", f"sleep {turn.tool_s:.3f}; echo {' '.join(map(str, turn.tool_ids))}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    out, _ = await proc.communicate()
    ids = [int(x) for x in out.split()]
    if ids != list(turn.tool_ids):
        raise RuntimeError(f"tool {turn.tool} printed {len(ids)} ids, expected {len(turn.tool_ids)}")
    return ids


async def run_episode(client: AsyncProrsaClient, ep: Episode, rec: RunRecord, args: argparse.Namespace) -> None:
    rec.trajectories[ep.trajectory_id] = (time.time(), None)
    try:
        async with client.trajectory(task=ep.task, trajectory_id=f"{rec.nonce}-{ep.trajectory_id}",
                                     group_id=f"{rec.nonce}-{ep.group_id}", prompt_tokens=len(ep.prompt_ids)) as t:
            await asyncio.sleep(ep.dispatch_s)
            if ep.sandbox is not None:
                with t.sandbox(ep.sandbox):
                    await asyncio.sleep(ep.startup_s)
                await asyncio.sleep(ep.first_request_s)
            context = list(ep.prompt_ids)
            for k, turn in enumerate(ep.turns):
                sent_at = time.time()
                rec.sent += 1
                try:
                    g = await t.generate(context, sampling_params={"max_new_tokens": turn.output_tokens,
                                                                   "temperature": 0, "ignore_eos": True})
                except ProrsaClientError as exc:
                    rec.lost.append(f"{ep.trajectory_id} turn {k}: {exc}"[:400])
                    raise
                if len(g.output_ids) != turn.output_tokens:
                    rec.lost.append(f"{ep.trajectory_id} turn {k}: {len(g.output_ids)} of {turn.output_tokens} tokens")
                    raise RuntimeError("short answer")
                rec.requests[(ep.trajectory_id, k)] = {
                    "send": sent_at, "done": time.time(), "prompt": len(context), "cached": g.cached_tokens,
                    "output": len(g.output_ids), "ids": g.output_ids, "version": g.weight_version}
                context += g.output_ids
                if turn.tool is not None:
                    with t.tool(turn.tool) as call:
                        try:
                            tool_ids = await run_tool(turn, args.tool_exec)
                        except (OSError, RuntimeError) as exc:
                            rec.episode_errors.append(f"{ep.trajectory_id} turn {k}: {exc}"[:300])
                            raise RuntimeError("tool failed") from exc
                        call.result_tokens = len(tool_ids)
                    context += tool_ids
                    await asyncio.sleep(turn.overhead_s)
            with t.reward() as r:
                await asyncio.sleep(ep.reward_s)
                r.accepted = ep.accepted
        rec.trajectories[ep.trajectory_id] = (rec.trajectories[ep.trajectory_id][0], time.time())
    except (ProrsaClientError, RuntimeError):
        pass  # counted in rec.lost; the trajectory was reported aborted


async def update_weights(client: AsyncProrsaClient, ckpt: str, version: str, rec: RunRecord) -> bool:
    """One weight update from disk; False (and no more attempts) when the server has no such route."""
    try:
        res = await client.update_weights_from_disk(ckpt, weight_version=version)
    except ProrsaHTTPError as exc:
        rec.weight_updates.append(f"unsupported (HTTP {exc.status})" if exc.status in (404, 405)
                                  else f"failed: {exc.message[:200]}")
        return exc.status not in (404, 405)
    except ProrsaClientError as exc:
        rec.weight_updates.append(f"failed: {exc}"[:200])
        return True
    ok = not isinstance(res, dict) or res.get("success", True)
    rec.weight_updates.append(f"{version}: {'ok' if ok else res.get('message', res)}")
    return True


async def drive(url: str, workload: list[list[list[Episode]]], args: argparse.Namespace, label: str,
                report_requests: bool, alive: Callable[[], bool] | None = None) -> tuple[RunRecord, dict]:
    """Run every step under the staleness-k policy; returns the record and the SDK's hint counters. ``alive``: the
    launched server's liveness, checked while polling, so a crashed server ends the run at once."""
    rec = RunRecord()
    hints = HintConfig(report_requests=report_requests, order_timeout_s=args.hint_order_s)
    async with AsyncProrsaClient(url, hints=hints, timeout_s=args.request_timeout_s) as client:
        stop = asyncio.Event()
        monitor = asyncio.create_task(watch(client, rec, args, stop, label, alive))
        trainer = asyncio.create_task(train(client, workload, args, rec, label))
        await asyncio.wait({monitor, trainer}, return_when=asyncio.FIRST_COMPLETED)
        if not trainer.done():  # the monitor ended first: the server is gone
            trainer.cancel()
            await asyncio.gather(trainer, return_exceptions=True)
            monitor.result()
        stop.set()
        await monitor
        trainer.result()
        await client.flush_hints(10)
        stats = client.hint_stats.to_dict()
    return rec, stats


async def train(client: AsyncProrsaClient, workload: list[list[list[Episode]]], args: argparse.Namespace,
                rec: RunRecord, label: str) -> None:
    """Roll out step s once step s-k-1 has trained (k = staleness); after each step a training gap and a weight
    update (alternating two checkpoints; the last update puts the first one back)."""
    ckpts = checkpoints(args)
    trained = asyncio.Condition()
    trained_steps = 0
    bar = tqdm(total=sum(len(g) for step in workload for g in step), desc=f"{label} trajectories", unit="traj",
               leave=False)

    async def step_rollout(s: int) -> None:
        async with trained:
            await trained.wait_for(lambda: trained_steps >= s - args.staleness)
        rec.step_launch[s] = time.time()

        async def one(ep: Episode) -> None:
            await run_episode(client, ep, rec, args)
            bar.update(1)

        await asyncio.gather(*(one(ep) for group in workload[s] for ep in group))
        rec.step_done[s] = time.time()

    rollouts = [asyncio.create_task(step_rollout(s)) for s in range(len(workload))]
    try:
        updates_supported = ckpts is not None
        for s, task in enumerate(rollouts):
            await task
            rec.step_consumed[s] = time.time()
            tqdm.write(f"[{label}] step {s} rolled out in {rec.step_done[s] - rec.step_launch[s]:.1f} s")
            await asyncio.sleep(args.train_s)  # the training step (the trainer's GPUs; the rollout side idles)
            if updates_supported and s < len(rollouts) - 1:
                updates_supported = await update_weights(client, ckpts[(s + 1) % 2], f"step-{s + 1}", rec)
            async with trained:
                trained_steps = s + 1
                trained.notify_all()
        if ckpts is not None and updates_supported and len(rollouts) % 2 == 0:
            await update_weights(client, ckpts[0], "restored", rec)  # leave the server on its first weights
    finally:
        for task in rollouts:
            task.cancel()
        await asyncio.gather(*rollouts, return_exceptions=True)
        bar.close()


def checkpoints(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.no_weight_update:
        return None
    from sglang_prorsa.testing.tiny_model import TinyModelSpec, ensure_default_model

    return str(ensure_default_model()), str(ensure_default_model(TinyModelSpec(seed=1)))


async def watch(client: AsyncProrsaClient, rec: RunRecord, args: argparse.Namespace, stop: asyncio.Event,
                label: str, alive: Callable[[], bool] | None) -> None:
    """Poll the forecast and the roles for the timeline; in --url mode also print them as they change."""
    last_print = 0.0
    unanswered = 0
    while not stop.is_set():
        if alive is not None and not alive():
            raise RuntimeError("the server process exited during the run")
        sample: dict[str, Any] = {"t": time.time()}
        try:
            fc = await client.forecast()
            sample.update({k: fc.get(k) for k in ("prefill_tokens", "prefill_arrival_tokens",
                                                  "decode_admission_tokens", "decode_kv_tokens", "horizon_s")})
            unanswered = 0
        except ProrsaConnectionError:
            unanswered += 1
            if unanswered >= 5:
                raise RuntimeError(f"the server stopped answering ({unanswered} polls in a row)") from None
        except ProrsaClientError:
            pass
        try:
            inst = await client.instances()
            sample["roles"] = {str(i.get("instance")): i.get("role") for i in inst.get("instances", [])}
            sample["switches"] = len(inst.get("switches", []))
            decision = (await client.decision()).get("decision") or {}
            target = decision.get("target") or {}
            if "prefill" in target:
                sample["target_prefill"] = target["prefill"]
                sample["target_decode"] = target.get("decode")
        except ProrsaClientError:
            pass
        rec.timeline.append(sample)
        if args.url and sample["t"] - last_print >= args.print_every_s:
            last_print = sample["t"]
            roles = sample.get("roles")
            n_p = sum(r == "prefill" for r in roles.values()) if roles else None
            ratio = f"{n_p}:{len(roles) - n_p}" if roles else "-"
            target = (f"{sample['target_prefill']}:{sample['target_decode']}" if "target_prefill" in sample else "-")
            tqdm.write(f"[{label}] t={sample['t'] - rec.t0:6.1f}s roles P:D={ratio} target {target} "
                       f"W^P={_num(sample.get('prefill_tokens'))} K^D={_num(sample.get('decode_kv_tokens'))} "
                       f"switches={sample.get('switches', '-')}")
        try:
            await asyncio.wait_for(stop.wait(), timeout=args.poll_s)
        except asyncio.TimeoutError:
            pass


def _num(x: Any) -> str:
    return "-" if x is None else f"{float(x):.0f}"


# ----- server-side counters --------------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+([-+eE0-9.naNinf]+)\s*$')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def engine_counters(url: str) -> dict[str, Any]:
    """Busy seconds, prompt tokens computed and switches summed over the instances behind ``url``.

    Instances come from GET /prorsa/instances where the server lists them (a front), else ``url`` is one engine.
    Per instance a counter is read once (keyed by its ``instance`` label, whatever its current role)."""
    import requests

    urls = [url]
    switches = None
    try:
        r = requests.get(url + "/prorsa/instances", timeout=10)
        if r.status_code == 200:
            body = r.json()
            urls = [i["url"] for i in body.get("instances", []) if i.get("url")] or [url]
            switches = len(body.get("switches", []))
    except (requests.RequestException, ValueError):
        pass
    busy: dict[str, float] = {}
    computed: dict[str, float] = {}
    engine_switches: dict[str, float] = {}
    for u in urls:
        try:
            text = requests.get(u + "/prorsa/metrics", timeout=10).text
        except requests.RequestException:
            continue
        for name, labels, value in parse_prometheus(text):
            key = f"{u}#{labels.get('instance', '')}"
            if name in ("prorsa_busy_seconds_total", "prorsa_busy_seconds_open_interval"):
                busy[key] = busy.get(key, 0.0) + value
            elif name == "prorsa_prompt_tokens_computed_total":
                computed[key] = value
            elif name == "prorsa_switches_total":
                engine_switches[key] = value
    return {"instances": len(busy) or len(urls), "busy_s": sum(busy.values()) if busy else None,
            "prompt_tokens_computed": sum(computed.values()) if computed else None,
            "switches": switches if switches is not None else (int(sum(engine_switches.values())) if engine_switches
                                                                 else None)}


def server_reports(url: str) -> dict[str, Any]:
    """The forecast's accuracy and the lifecycle counters at the end of a run (read defensively: fields may grow)."""
    import requests

    out: dict[str, Any] = {}
    try:
        fc = requests.get(url + "/prorsa/forecast", timeout=10).json()
        wape = fc.get("wape") or {}
        out.update(forecast_wape_prefill=wape.get("prefill"), forecast_wape_decode=wape.get("decode"),
                   forecast_windows=wape.get("windows"))
        base = (fc.get("baseline") or {}).get("wape") or {}
        if base:
            out.update(baseline_wape_prefill=base.get("prefill"), baseline_wape_decode=base.get("decode"))
    except (requests.RequestException, ValueError):
        pass
    try:
        st = requests.get(url + "/lifecycle/status", timeout=10).json()
        out.update(lifecycle_events=st.get("events"), lifecycle_rejected_events=st.get("rejected_events"),
                   lifecycle_recent_rejections=(st.get("recent_rejections") or [])[-5:])
    except (requests.RequestException, ValueError):
        pass
    return out


# ----- summary of one mode ---------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))]


def step_times(rec: RunRecord, staleness: int) -> list[float]:
    """Synchronous: each step's rollout time (launch to last trajectory's reward). Asynchronous: the time between
    the trainer taking consecutive steps (the first from the run's start), which includes the training gap, since
    rollouts of later steps overlap it: what an asynchronous trainer waits per step."""
    steps = sorted(rec.step_consumed)
    if staleness == 0:
        return [rec.step_done[s] - rec.step_launch[s] for s in steps]
    out, prev = [], min(rec.step_launch.values())
    for s in steps:
        out.append(rec.step_consumed[s] - prev)
        prev = rec.step_consumed[s]
    return out


def outputs_digest(rec: RunRecord) -> str:
    h = hashlib.sha256()
    for key in sorted(rec.requests):
        h.update(json.dumps([key[0], key[1], rec.requests[key]["ids"]]).encode())
    return h.hexdigest()[:16]


def compare_outputs(rec: RunRecord, ref: RunRecord) -> tuple[int, int]:
    """(compared, differing) over (trajectory, turn): each trajectory's turns are compared from the first while both
    runs served them on the same weights version and every earlier turn matched (a context that differs, or other
    weights, makes later turns incomparable)."""
    compared = differing = 0
    for tid in sorted({k[0] for k in rec.requests} | {k[0] for k in ref.requests}):
        k = 0
        while (tid, k) in rec.requests and (tid, k) in ref.requests:
            a, b = rec.requests[(tid, k)], ref.requests[(tid, k)]
            if a["version"] != b["version"]:
                break
            compared += 1
            if a["ids"] != b["ids"]:
                differing += 1
                break
            k += 1
    return compared, differing


def summarise(mode: str, rec: RunRecord, before: dict, after: dict, wall: float, args: argparse.Namespace,
              extra: dict) -> dict:
    reqs = list(rec.requests.values())
    done = [end - start for start, end in rec.trajectories.values() if end is not None]
    latency = [r["done"] - r["send"] for r in reqs]
    prompt = sum(r["prompt"] for r in reqs)
    generated = sum(r["output"] for r in reqs)
    rollout_wall = (max(rec.step_done.values()) - min(rec.step_launch.values())) if rec.step_done else None
    busy = None
    if before.get("busy_s") is not None and after.get("busy_s") is not None:
        busy = after["busy_s"] - before["busy_s"]
    n_inst = after.get("instances") or 1
    computed = None
    if before.get("prompt_tokens_computed") is not None and after.get("prompt_tokens_computed") is not None:
        computed = after["prompt_tokens_computed"] - before["prompt_tokens_computed"]
    switches = None
    if after.get("switches") is not None:
        switches = after["switches"] - (before.get("switches") or 0)
    st = step_times(rec, args.staleness)
    return {
        "mode": mode, "instances": n_inst, "policy": "sync" if args.staleness == 0 else f"async(k={args.staleness})",
        "seed": args.seed, "preset": args.preset, "step_times_s": [round(x, 3) for x in st],
        "step_time_definition": ("rollout: launch to last reward" if args.staleness == 0
                                 else "interval between the trainer taking consecutive steps (training included)"),
        "step_time_mean_s": round(statistics.mean(st), 3) if st else None,
        "step_time_stdev_s": round(statistics.stdev(st), 3) if len(st) > 1 else None,
        "trajectories": len(rec.trajectories), "trajectories_completed": len(done),
        "trajectory_completion_p50_s": percentile(done, 50), "trajectory_completion_p99_s": percentile(done, 99),
        "request_latency_p50_s": percentile(latency, 50), "request_latency_p99_s": percentile(latency, 99),
        "requests": rec.sent, "answered": len(reqs), "lost": len(rec.lost), "lost_detail": rec.lost[:5],
        "episode_errors": rec.episode_errors[:5],
        "prompt_tokens": prompt, "generated_tokens": generated,
        "tokens_per_s": round(generated / rollout_wall, 2) if rollout_wall else None,
        "cpu_idle_share": (round(max(0.0, 1 - busy / (wall * n_inst)), 4) if busy is not None and wall > 0 else None),
        "busy_s": round(busy, 2) if busy is not None else None, "run_wall_s": round(wall, 2),
        "switches": switches,
        "prefix_cache_hit_rate": round(sum(r["cached"] for r in reqs) / prompt, 4) if prompt else None,
        "prompt_tokens_computed": computed,
        "weight_updates": rec.weight_updates or ["skipped (--no-weight-update)" if args.no_weight_update else "none"],
        "outputs_digest": outputs_digest(rec),
        **extra,
    }


# ----- the simulator's prediction of this run (--sim-predict) ---------------------------------------------------

def sim_fit_samples(url: str, mode: str, args: argparse.Namespace, samples: dict) -> None:
    """``sim fit`` against the same instances, before the workload runs: prefill and decode timings of one colocated
    instance (the others idle), and 1-token requests through the static PD front for the PD overhead."""
    import requests

    from sglang_prorsa.sim.fit import measure, measure_prefill

    lengths = [int(x) for x in args.sim_prompt_lengths.split(",")]
    if mode == "colocated":
        instances = requests.get(url + "/prorsa/instances", timeout=10).json().get("instances", [])
        target = instances[0]["url"] if instances else url
        tqdm.write(f"[{mode}] sim fit: timing {target}")
        samples.update(measure(target, lengths, [int(x) for x in args.sim_batches.split(",")]))
    elif mode == "static":
        tqdm.write(f"[{mode}] sim fit: timing 1-token requests through the PD front {url}")
        samples["pd_prefill"] = measure_prefill(url, lengths, seed=1)


def sim_predict(rows: list[dict], samples: dict, args: argparse.Namespace, out: Path) -> None:
    """Fit the ``--sim-base`` model to the samples, simulate this run's workload (the same scaled plans, seed,
    instances and policy) in every mode that ran, and add the prediction to its row."""
    from sglang_prorsa.sim.config import ClusterConfig, DecodeParams, ModelConfig, PrefillParams, RolloutConfig
    from sglang_prorsa.sim.fit import fit_model
    from sglang_prorsa.sim.runner import simulate

    if len(samples.get("prefill", [])) < 3:
        print("sim predict: no colocated fit samples (the colocated mode did not run); no prediction", flush=True)
        return
    config, lines = fit_model(samples, args.sim_base, "bench_rollout.py --sim-predict, the run's own instances")
    print("sim fit: " + "; ".join(lines), flush=True)
    (out / f"{args.tag}_sim_model.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / f"{args.tag}_sim_samples.json").write_text(json.dumps(samples) + "\n")
    model = ModelConfig.from_dict(config)
    # The same run with (almost) free engines: what the plan's waits alone give, so the table shows what the fitted
    # engine model adds to the prediction.
    waits_only = replace(model, prefill=PrefillParams(1e-4, 0.0, 0.0), decode=DecodeParams(1e-4, 0.0, 0.0),
                         transfer_latency_s=0.0)
    rollout = RolloutConfig(preset=args.preset, staleness=args.staleness, group_size=args.group_size,
                            groups_per_step=args.groups, steps=args.steps, seed=args.seed, train_s=args.train_s,
                            scale=plan_scale(args))
    for row in rows:
        if row.get("error") or row["mode"] not in ("adaptive", "static", "colocated"):
            continue
        p = static_prefill(args) if row["mode"] == "static" else (1 if row["mode"] == "adaptive" else 0)
        cluster = ClusterConfig(gpus=args.instances, mode=row["mode"], prefill_instances=p,
                                horizon_s=args.horizon)
        result, floor = simulate(model, cluster, rollout), simulate(waits_only, cluster, rollout)
        predicted = result.step_times_s
        row["sim_step_times_s"] = [round(x, 3) for x in predicted]
        row["sim_step_time_mean_s"] = round(statistics.fmean(predicted), 3) if predicted else None
        row["sim_waits_only_step_time_mean_s"] = (round(statistics.fmean(floor.step_times_s), 3)
                                                  if floor.step_times_s else None)
        row["sim_trajectory_completion_p50_s"] = result.completion_p50_s
        row["sim_switches"] = result.switches
        measured = row.get("step_time_mean_s")
        row["sim_error"] = (round(row["sim_step_time_mean_s"] / measured - 1, 4)
                            if measured and row["sim_step_time_mean_s"] is not None else None)


def print_prediction(rows: list[dict]) -> None:
    shown = [r for r in rows if r.get("sim_error") is not None]
    if not shown:
        return
    print(f"{'mode':<10} {'measured step (s)':>18} {'simulated (s)':>14} {'error':>8}  within +-20 %  "
          f"{'waits alone (s)':>15}  {'traj p50 measured / simulated (s)':>34}")
    for r in shown:
        print(f"{r['mode']:<10} {r['step_time_mean_s']:>18.2f} {r['sim_step_time_mean_s']:>14.2f} "
              f"{100 * r['sim_error']:>7.1f}%  {'yes' if abs(r['sim_error']) <= 0.2 else 'NO':<13}  "
              f"{_fmt(r.get('sim_waits_only_step_time_mean_s')):>15}  "
              f"{_fmt(r.get('trajectory_completion_p50_s')):>16} / {_fmt(r.get('sim_trajectory_completion_p50_s'))}")


# ----- launching the modes ---------------------------------------------------------------------------------------

def launcher_flags() -> str | None:
    """The launcher's --help text, to skip modes this checkout's launcher does not have without starting them; None
    when it could not be read (then every mode is launched and a missing one fails at start, reported as such)."""
    try:
        out = subprocess.run([sys.executable, "-m", "sglang_prorsa.launch_server", "--help"], capture_output=True,
                             text=True, timeout=300, env=processes.loopback_env())
    except subprocess.TimeoutExpired:
        return None
    text = out.stdout + out.stderr
    return text if MODE_FLAG["adaptive"] in text else None


def static_prefill(args: argparse.Namespace) -> int:
    return args.static_prefill or max(1, args.instances // 2)


def mode_flags(mode: str, args: argparse.Namespace, log_dir: Path) -> list[str]:
    n = args.instances
    flags = {"adaptive": ["--pd-adaptive", "--prorsa-instances", str(n)],
             "static": ["--pd-static", f"{static_prefill(args)}:{n - static_prefill(args)}"],
             "colocated": ["--pd-colocated", str(n)],
             "single": []}[mode]
    if mode != "single":
        flags += ["--prorsa-log-dir", str(log_dir / mode)]
    if args.horizon is not None:
        flags += ["--prorsa-horizon", str(args.horizon)]
    return flags + ["--max-total-tokens", "65536", "--log-level", "warning", *shlex.split(args.server_args)]


async def warm_up(url: str, limit_s: float = 120.0) -> None:
    """One throwaway generation (kernels, first-request paths), retried while the server still refuses."""
    deadline = time.monotonic() + limit_s
    async with AsyncProrsaClient(url, timeout_s=limit_s) as client:
        while True:
            try:
                await client.generate([TOKEN_LO + 1] * 32, max_new_tokens=4, temperature=0, return_logprob=False)
                return
            except ProrsaClientError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)


def run_on(url: str, mode: str, workload, args: argparse.Namespace, extra: dict,
           alive: Callable[[], bool] | None = None, fit_samples: dict | None = None) -> tuple[dict, RunRecord]:
    """``fit_samples``: filled for ``--sim-predict`` after the warm-up, before the workload (sim_fit_samples)."""
    import requests

    try:
        info = requests.get(url + "/prorsa/info", timeout=10).json()
    except (requests.RequestException, ValueError):
        info = {}
    if args.report_requests == "auto":
        report = info.get("mode") not in FRONT_MODES
    else:
        report = args.report_requests == "on"
    asyncio.run(warm_up(url))
    if fit_samples is not None:
        sim_fit_samples(url, mode, args, fit_samples)
    before, reports_before = engine_counters(url), server_reports(url)
    t0 = time.time()
    rec, stats = asyncio.run(drive(url, workload, args, mode, report, alive))
    wall = time.time() - t0
    after, reports = engine_counters(url), server_reports(url)
    # Lifecycle counters are the server's since it started: keep this run's share.
    for key in ("lifecycle_events", "lifecycle_rejected_events"):
        old = reports_before.get(key)
        if isinstance(old, dict) and isinstance(reports.get(key), dict):
            reports[key] = {k: v - old.get(k, 0) for k, v in reports[key].items()}
        elif isinstance(old, (int, float)) and isinstance(reports.get(key), (int, float)):
            reports[key] -= old
    extra = {**extra, **reports, "hints": stats, "client_reports_requests": report, "hint_order_s": args.hint_order_s,
             "server_mode": info.get("mode", "single engine")}
    return summarise(mode, rec, before, after, wall, args, extra), rec


def launch_and_run(mode: str, workload, args: argparse.Namespace, log_dir: Path, help_text: str | None,
                   fit_samples: dict | None = None) -> tuple[dict, RunRecord | None]:
    if mode != "single" and help_text is not None and MODE_FLAG[mode] not in help_text:
        msg = f"this launcher has no {MODE_FLAG[mode]} (mode skipped)"
        tqdm.write(f"[{mode}] {msg}")
        return failed_row(mode, msg), None
    port = processes.free_port()
    argv = mode_flags(mode, args, log_dir) + ["--host", processes.LOOPBACK, "--port", str(port)]
    tqdm.write(f"[{mode}] launch_server {' '.join(argv)}")
    srv = processes.start(argv, name=f"rollout-{mode}-{port}", port=port, log_dir=log_dir, die_with_parent=True)
    try:
        ready = srv.wait_ready(timeout=args.ready_timeout_s)
        tqdm.write(f"[{mode}] ready in {ready:.0f} s")
        row, rec = run_on(srv.url, mode, workload, args, {"launch": " ".join(argv[:-4]), "ready_s": round(ready, 1)},
                          alive=srv.alive, fit_samples=fit_samples)
        return row, rec
    except Exception as exc:  # report the mode as failed and go on with the next one
        tqdm.write(f"[{mode}] failed: {exc}\n{srv.log_tail(30)}")
        return failed_row(mode, f"{type(exc).__name__}: {exc}"[:500]), None
    finally:
        srv.stop(grace_s=20)


def failed_row(mode: str, error: str) -> dict:
    return {"mode": mode, "error": error, "step_times_s": [], "requests": 0, "lost": None, "switches": None,
            "outputs_identical_to_colocated": None}


def add_comparisons(rows: list[dict], recs: dict[str, RunRecord], baseline: str) -> None:
    """Step-time ratio and greedy-output agreement of every mode against ``baseline`` (colocated unless told
    otherwise; the ``*_to_colocated`` fields are filled only when the baseline is colocated)."""
    ref_row = next((r for r in rows if r["mode"] == baseline and not r.get("error")), None)
    ref = recs.get(baseline)
    for row in rows:
        if row.get("error"):
            continue
        row.update(baseline_mode=baseline, step_time_ratio_to_baseline=None, outputs_identical_to_baseline=None,
                   compared_turns=None, differing_turns=None)
        if ref_row is not None and ref is not None and row["mode"] in recs:
            if ref_row.get("step_time_mean_s"):
                row["step_time_ratio_to_baseline"] = round(row["step_time_mean_s"] / ref_row["step_time_mean_s"], 3)
            compared, differing = compare_outputs(recs[row["mode"]], ref)
            row.update(compared_turns=compared, differing_turns=differing,
                       outputs_identical_to_baseline=(differing == 0 and compared > 0))
        coloc = baseline == "colocated"
        row["step_time_ratio_to_colocated"] = row["step_time_ratio_to_baseline"] if coloc else None
        row["outputs_identical_to_colocated"] = row["outputs_identical_to_baseline"] if coloc else None


# ----- output ----------------------------------------------------------------------------------------------------

def _fmt(x: Any, spec: str = ".2f") -> str:
    if x is None:
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def print_table(rows: list[dict]) -> None:
    base = next((r["baseline_mode"] for r in rows if "baseline_mode" in r), "colocated")
    head = ("mode", "step s (mean±sd)", f"×{base}", "traj p50/p99 s", "tok/s", "idle", "switches", "WAPE P/D",
            "cache hit", "requests", "lost", f"same as {base}")
    lines = [head]
    for r in rows:
        if r.get("error"):
            lines.append((r["mode"], "error: " + r["error"].splitlines()[0][:80], *[""] * (len(head) - 2)))
            continue
        lines.append((
            r["mode"], f"{_fmt(r['step_time_mean_s'])}±{_fmt(r['step_time_stdev_s'])}",
            _fmt(r.get("step_time_ratio_to_baseline"), ".3f"),
            f"{_fmt(r['trajectory_completion_p50_s'], '.1f')}/{_fmt(r['trajectory_completion_p99_s'], '.1f')}",
            _fmt(r["tokens_per_s"], ".1f"), _fmt(r["cpu_idle_share"], ".2f"), _fmt(r["switches"], "d"),
            f"{_fmt(r.get('forecast_wape_prefill'))}/{_fmt(r.get('forecast_wape_decode'))}",
            _fmt(r["prefix_cache_hit_rate"], ".2f"), str(r["requests"]), str(r["lost"]),
            _fmt(r.get("outputs_identical_to_baseline"))))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    for i, line in enumerate(lines):
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def plot_step_times(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("step_times_s")]
    if not ok:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    n_steps = max(len(r["step_times_s"]) for r in ok)
    width = 0.8 / len(ok)
    for i, r in enumerate(ok):
        xs = [s + i * width for s in range(len(r["step_times_s"]))]
        ratio = r.get("step_time_ratio_to_baseline")
        label = r["mode"] + (f" (×{ratio:.2f} vs {r['baseline_mode']})" if ratio is not None else "")
        ax.bar(xs, r["step_times_s"], width, label=label)
        if r.get("sim_step_times_s"):  # --sim-predict: the simulator's step times on the same bars
            ax.scatter(xs[: len(r["sim_step_times_s"])], r["sim_step_times_s"], marker="_", s=400, color="black",
                       zorder=3, label="simulated (sim fit on these instances)" if i == 0 else None)
    if any(r.get("sim_step_times_s") for r in ok) and max(max(r["step_times_s"]) for r in ok) > 4 * min(
            min(r["step_times_s"]) for r in ok):
        ax.set_yscale("log")  # one stalled step would flatten every other bar
    ax.set_xticks([s + 0.4 - width / 2 for s in range(n_steps)], [f"step {s}" for s in range(n_steps)])
    ax.set_ylabel("rollout step time (s)")
    ax.set_title(f"{ok[0]['preset']}, {ok[0]['policy']}, {ok[0]['instances']} instances, seed {ok[0]['seed']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def realised(rec: RunRecord, t: float, horizon: float) -> tuple[float, float]:
    """Client-side realised demand over [t, t+S]: prompt tokens of requests sent in it, and the peak KV of requests
    in flight in it (prompt + output tokens)."""
    arrivals = sum(r["prompt"] for r in rec.requests.values() if t <= r["send"] < t + horizon)
    kv = sum(r["prompt"] + r["output"] for r in rec.requests.values() if r["send"] < t + horizon and r["done"] > t)
    return arrivals, kv


def plot_timelines(recs: dict[str, RunRecord], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = {m: r for m, r in recs.items() if any("roles" in s or "prefill_tokens" in s for s in r.timeline)}
    if not shown:
        return False
    fig, axes = plt.subplots(3, len(shown), figsize=(7 * len(shown), 9), squeeze=False, sharex="col")
    for col, (mode, rec) in enumerate(shown.items()):
        tl = rec.timeline
        ts = [s["t"] - rec.t0 for s in tl]
        ax_roles, ax_p, ax_d = axes[0][col], axes[1][col], axes[2][col]
        ids = sorted({i for s in tl for i in (s.get("roles") or {})})
        for k, inst in enumerate(ids):
            for s, t_rel, t_next in zip(tl, ts, ts[1:] + [ts[-1] + 1]):
                role = (s.get("roles") or {}).get(inst)
                if role:
                    ax_roles.broken_barh([(t_rel, t_next - t_rel)], (k - 0.4, 0.8),
                                         color="#fc8d62" if role == "prefill" else "#66c2a5")
        ax_roles.set_yticks(range(len(ids)), [f"inst {i}" for i in ids])
        tgt = [(t_rel, s["target_prefill"]) for t_rel, s in zip(ts, tl) if s.get("target_prefill") is not None]
        if tgt:
            ax_t = ax_roles.twinx()
            ax_t.step([x for x, _ in tgt], [y for _, y in tgt], where="post", color="k", lw=1,
                      label="decision: target prefill instances")
            ax_t.set_ylim(-0.5, max(len(ids), 1) + 0.5)
            ax_t.legend(fontsize=7, loc="upper right")
        if not ids:
            ax_roles.text(0.5, 0.5, "no roles listed (not a PD front)", ha="center", transform=ax_roles.transAxes)
        ax_roles.set_title(f"{mode}: roles (orange prefill, green decode), switches "
                           f"{max([s.get('switches', 0) for s in tl] or [0])}")
        horizon = next((s["horizon_s"] for s in tl if s.get("horizon_s")), 10.0)
        pts = [(t_rel, s) for t_rel, s in zip(ts, tl) if s.get("prefill_tokens") is not None]
        real = [realised(rec, s["t"], horizon) for _, s in pts]
        xs = [p[0] for p in pts]
        ax_p.plot(xs, [s["prefill_tokens"] for _, s in pts], label="forecast W^P (backlog + arrivals)")
        ax_p.plot(xs, [s.get("prefill_arrival_tokens") or 0 for _, s in pts], label="forecast arrivals", ls="--")
        ax_p.plot(xs, [r[0] for r in real], label=f"realised arrivals in next {horizon:g} s (client)", color="k")
        ax_p.set_ylabel("prefill tokens")
        ax_p.legend(fontsize=7)
        ax_d.plot(xs, [s.get("decode_kv_tokens") or 0 for _, s in pts], label="forecast K^D")
        ax_d.plot(xs, [r[1] for r in real], label=f"realised KV in flight over next {horizon:g} s (client)", color="k")
        ax_d.set_ylabel("decode KV tokens")
        ax_d.set_xlabel("seconds since start")
        ax_d.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_rows(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2, default=str) + "\n")


# ----- command line ----------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--modes", default="adaptive,static,colocated",
                    help=f"comma-separated, launched in turn; of {', '.join(MODES)} ('single': one plain engine)")
    ap.add_argument("--url", default=None, help="drive this running server instead of launching modes")
    ap.add_argument("--baseline", default="colocated", choices=MODES,
                    help="mode the ratios and output comparisons refer to")
    ap.add_argument("--label", default=None, help="mode name for --url (default: from /prorsa/info)")
    ap.add_argument("--quick", action="store_true", help="a small run (< 15 min on 2 cores for three modes)")
    ap.add_argument("--json", default=None, help="write the rows here (default: <out>/<tag>.json)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default=None, help="file name prefix (default: rollout or rollout_quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--instances", type=int, default=None, help="instances per mode (default: 3; with 2, adaptive has nothing to switch)")
    ap.add_argument("--static-prefill", type=int, default=None, help="P of --pd-static P:D (default: N // 2)")
    ap.add_argument("--horizon", type=float, default=None,
                    help="--prorsa-horizon for every mode (default: 10 s x --time-scale: the paper's S of 10 s goes "
                         "with the preset's unscaled durations)")
    ap.add_argument("--server-args", default="", help="extra launcher flags for every mode (one string)")
    ap.add_argument("--preset", default="general_agent", choices=sorted(TASKS))
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--groups", type=int, default=None, help="GRPO groups per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=None)
    ap.add_argument("--staleness", type=int, default=0, help="0: synchronous steps; k: asynchronous, staleness k")
    ap.add_argument("--time-scale", type=float, default=None, help="multiplies the preset's durations")
    ap.add_argument("--token-scale", type=float, default=0.1, help="multiplies the preset's token counts")
    ap.add_argument("--max-wait-s", type=float, default=6.0, help="cap on any one scaled duration")
    ap.add_argument("--min-prompt", type=int, default=64)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--min-new", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--max-tool-tokens", type=int, default=256)
    ap.add_argument("--tool-exec", choices=("subprocess", "wait"), default="subprocess")
    ap.add_argument("--train-s", type=float, default=None, help="training gap after each step")
    ap.add_argument("--no-weight-update", action="store_true")
    ap.add_argument("--report-requests", choices=("auto", "on", "off"), default="auto",
                    help="client-side request_arrived/decode_end hints (auto: unless the server is one of our fronts)")
    ap.add_argument("--hint-order-s", type=float, default=0.0,
                    help="HintConfig.order_timeout_s: a turn's request waits at most this long for its earlier hints")
    ap.add_argument("--poll-s", type=float, default=1.0, help="timeline sampling period")
    ap.add_argument("--print-every-s", type=float, default=5.0, help="--url: live status line period")
    ap.add_argument("--ready-timeout-s", type=float, default=900.0)
    ap.add_argument("--request-timeout-s", type=float, default=600.0)
    ap.add_argument("--sim-predict", action="store_true",
                    help="fit the simulator to the run's own instances and report its prediction of every mode")
    ap.add_argument("--sim-base", default="tiny_cpu", help="model config the fit starts from (sim/models/)")
    ap.add_argument("--sim-prompt-lengths", default="64,256,1024,2048", help="--sim-predict: prefill fit lengths")
    ap.add_argument("--sim-batches", default="1,4,8,16", help="--sim-predict: decode fit batch sizes")
    args = ap.parse_args(argv)
    quick = {"instances": 3, "steps": 2, "groups": 2, "max_turns": 3, "time_scale": 0.15, "train_s": 1.0,
             "horizon": None}
    full = {"instances": 3, "steps": 4, "groups": 4, "max_turns": 6, "time_scale": 0.25, "train_s": 2.0,
            "horizon": None}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.horizon is None:
        # The forecast counts at most a trajectory's next request within S (terms.py, as the paper's q_i): with the
        # durations scaled down, an unscaled 10 s horizon would hold several of its turns.
        args.horizon = max(1.0, round(10.0 * args.time_scale, 3))
    args.tag = args.tag or ("rollout_quick" if args.quick else "rollout")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"argument --modes: unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")
    args.mode_list = modes
    for name in ("steps", "groups", "group_size", "max_turns", "instances"):
        if getattr(args, name) < 1:
            ap.error(f"argument --{name.replace('_', '-')}: must be >= 1")
    if args.staleness < 0:
        ap.error("argument --staleness: must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the launched server is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = build_workload(args)
    n_traj = sum(len(g) for s in workload for g in s)
    print(f"workload: {args.preset}, seed {args.seed}: {args.steps} steps x {args.groups} groups x {args.group_size} "
          f"= {n_traj} trajectories, {sum(len(e.turns) for s in workload for g in s for e in g)} generations, "
          f"policy {'sync' if args.staleness == 0 else f'async k={args.staleness}'}, tools: {args.tool_exec}",
          flush=True)
    rows: list[dict] = []
    recs: dict[str, RunRecord] = {}
    json_path = Path(args.json) if args.json else out / f"{args.tag}.json"
    if args.url:
        import requests

        info = requests.get(args.url.rstrip("/") + "/prorsa/info", timeout=10).json()
        label = args.label or (info.get("mode") if info.get("mode") in MODES else "single")
        row, rec = run_on(args.url.rstrip("/"), label, workload, args, {"url": args.url})
        rows.append(row)
        recs[label] = rec
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="prorsa-rollout-"))
        print(f"server logs under {log_dir}", flush=True)
        help_text = launcher_flags()
        if help_text is None:
            print("could not read the launcher's --help; launching every mode", flush=True)
        fit_samples = {} if args.sim_predict else None
        for mode in tqdm(args.mode_list, desc="modes", unit="mode"):
            row, rec = launch_and_run(mode, workload, args, log_dir, help_text, fit_samples)
            rows.append(row)
            if rec is not None:
                recs[mode] = rec
            write_rows(rows, json_path)  # what is done so far survives an interrupted run
        if fit_samples is not None:
            sim_predict(rows, fit_samples, args, out)
    add_comparisons(rows, recs, args.baseline)
    print_table(rows)
    print_prediction(rows)
    write_rows(rows, json_path)
    (out / f"{args.tag}_timeline.json").write_text(json.dumps(
        {m: [{**s, "t": round(s["t"] - r.t0, 3)} for s in r.timeline] for m, r in recs.items()}, default=str) + "\n")
    plot_step_times(rows, out / f"{args.tag}_step_times.png")
    drew = plot_timelines(recs, out / f"{args.tag}_timeline.png")
    print(f"wrote {json_path}, {out / f'{args.tag}_step_times.png'}"
          + (f", {out / f'{args.tag}_timeline.png'}" if drew else ""), flush=True)
    if any(r.get("lost") for r in rows):
        print("REQUESTS LOST: " + "; ".join(f"{r['mode']}: {r['lost']}" for r in rows if r.get("lost")))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
