"""See it switch: a two-minute workload whose prefill:decode mix shifts, against `make serve`.

    make serve      # terminal 1: the adaptive front + 3 engine instances (1 prefill, 2 decode)
    make demo       # terminal 2: this script (or: python examples/demo_switch.py --url http://127.0.0.1:30000)

Agentic episodes (lifecycle hints on POST /lifecycle, greedy POST /generate with the X-Trajectory-Id header) run in
three phases:

  1. decode-heavy:  "long-answer" agents: short prompts, long answers, small tool outputs;
  2. prefill-heavy: many "long-context" agents join: each reads a long document (thousands of tokens) and a long
     tool log, answering in a few tokens; the long-answer agents keep both decode instances busy;
  3. decode-heavy:  the long-context agents stop; the episodes in flight finish.

While it runs it prints the forecast (W^P: prefill tokens expected within the horizon, K^D: decode KV tokens), each
control decision (prefill and decode demand in instances, Eq. 1's target, why it holds) and each switch: in phase 2
the prefill instance falls behind, the forecast's prefill demand passes one instance, and the controller moves a
*busy* decode instance to prefill; the requests running on it are taken off and continued elsewhere from their KV, so
every caller still gets one complete answer. At the end it writes a role-timeline PNG and the raw timeline as JSON.

Exit status: 0 when at least one switch happened and every request was answered with all its tokens; 1 otherwise;
2 when the server is not an adaptive front. Talks HTTP only (httpx); imports nothing of the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

TOKEN_LO, TOKEN_HI = 10, 1000  # token ids clear of the embedded tiny model's special tokens (vocabulary 1024)


@dataclass(frozen=True)
class AgentKind:
    """One kind of agent: every episode is a prompt, then `turns` x (answer, tool run, tool output appended)."""

    name: str
    first_prompt: tuple[int, int]  # token range of the first prompt
    answer_tokens: int
    tool_tokens: tuple[int, int]  # token range of each tool output
    tool_s: tuple[float, float]  # tool duration range (seconds)
    turns: int


LONG_ANSWER = AgentKind("long-answer", (150, 300), 900, (20, 60), (0.5, 1.5), 3)  # decode-heavy
LONG_CONTEXT = AgentKind("long-context", (2200, 3000), 8, (600, 900), (0.3, 1.0), 2)  # prefill-heavy
# (phase name, share of --duration-s, agents of each kind running in it)
PHASES = (("decode-heavy", 0.25, {LONG_ANSWER: 6}),
          ("prefill-heavy", 0.45, {LONG_ANSWER: 6, LONG_CONTEXT: 36}),
          ("decode-heavy again", 0.30, {LONG_ANSWER: 6}))
HOLD_REASONS = {"no_role_short": "no role is short", "target_met": "Eq. 1's target is met",
                "no_eligible_instance": "no instance may move yet (dwell time)",
                "donor_at_minimum": "the other role is at its minimum",
                "within_hysteresis_band": "within the hysteresis band", "cost_exceeds_gain": "a switch would not pay",
                "paused": "generation is paused"}


@dataclass
class Run:
    url: str
    seed: int
    duration_s: float
    t0: float = field(default_factory=time.time)
    sent: int = 0
    answered: int = 0
    lost: list[str] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    switches: list[dict] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=lambda: {LONG_ANSWER.name: 0, LONG_CONTEXT.name: 0})

    def now(self) -> float:
        return time.time() - self.t0

    def phase(self) -> tuple[str, dict]:
        end = 0.0
        for name, share, agents in PHASES:
            end += share * self.duration_s
            if self.now() < end:
                return name, agents
        return "draining", {}

    def say(self, msg: str) -> None:
        print(f"[{self.now():6.1f}s] {msg}", flush=True)


async def hint(client: httpx.AsyncClient, tid: str, event: str, **fields) -> None:
    body = {"trajectory_id": tid, "event": event, "ts": time.time(), "task": "demo", **fields}
    r = await client.post("/lifecycle", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"POST /lifecycle {event} answered {r.status_code}: {r.text[:200]}")


async def episode(client: httpx.AsyncClient, run: Run, kind: AgentKind, tid: str) -> None:
    """One agentic episode: sampled, then per turn a greedy generation and a tool whose output grows the context."""
    rng = random.Random(f"{run.seed}/{tid}")
    context = [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(rng.randint(*kind.first_prompt))]
    await hint(client, tid, "sampled", prompt_tokens=len(context), turn=0)
    for turn in range(kind.turns):
        record = {"trajectory": tid, "kind": kind.name, "turn": turn, "prompt": len(context), "send": run.now()}
        run.sent += 1
        run.in_flight[kind.name] += 1
        try:
            r = await client.post("/generate", headers={"X-Trajectory-Id": tid}, json={
                "input_ids": context, "sampling_params": {"max_new_tokens": kind.answer_tokens, "temperature": 0,
                                                          "ignore_eos": True}})
            out = r.json().get("output_ids") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            r, out = None, None
            record["error"] = f"{type(e).__name__}: {e}"[:200]
        finally:
            run.in_flight[kind.name] -= 1
        record.update(done=run.now(), status=getattr(r, "status_code", None), output=len(out or []))
        run.requests.append(record)
        if out is None or len(out) != kind.answer_tokens:
            why = record.get("error") or (f"HTTP {r.status_code}: {r.text[:150]}" if r.status_code != 200
                                          else f"{len(out or [])} of {kind.answer_tokens} tokens")
            run.lost.append(f"{tid} turn {turn}: {why}")
            await hint(client, tid, "aborted", turn=turn + 1)
            return
        run.answered += 1
        context += out
        if turn + 1 < kind.turns:
            await hint(client, tid, "tool_start", tool="bash", turn=turn + 1)
            await asyncio.sleep(rng.uniform(*kind.tool_s))
            context += [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(rng.randint(*kind.tool_tokens))]
            await hint(client, tid, "tool_end", prompt_tokens=len(context), turn=turn + 1)
    await hint(client, tid, "reward_start", turn=kind.turns)
    await hint(client, tid, "reward_end", accepted=True, turn=kind.turns)


async def agent(client: httpx.AsyncClient, run: Run, kind: AgentKind, slot: int, nonce: str) -> None:
    """One agent slot: runs episodes back to back while the current phase wants this many agents of its kind."""
    n = 0
    while run.now() < run.duration_s:
        if slot >= run.phase()[1].get(kind, 0):
            await asyncio.sleep(0.5)
            continue
        await episode(client, run, kind, f"demo-{nonce}-{kind.name}-{slot}-{n}")
        n += 1


def resume_counters(metrics_text: str) -> dict[str, float]:
    """Requests continued elsewhere after a switch, summed over the instances (GET /metrics)."""
    out = {"resumed": 0.0, "restarted": 0.0, "resume_failed": 0.0}
    for name, value in re.findall(r"^prorsa_(resumed|restarted|resume_failed)_total\{[^}]*\}\s+(\S+)$",
                                  metrics_text, re.M):
        out[name] += float(value)
    return out


async def counters(client: httpx.AsyncClient) -> dict[str, float]:
    return resume_counters((await client.get("/metrics")).text)


async def watch(client: httpx.AsyncClient, run: Run, stop: asyncio.Event, base: dict[str, float]) -> None:
    """Poll the forecast, the decision and the instances once a second; print what changed."""
    last_decision, last_status, seen_switches, last_line = None, {}, None, -10.0
    while not stop.is_set():
        try:
            fc, dec, inst = await asyncio.gather(*(client.get(p, timeout=10) for p in
                                                   ("/prorsa/forecast", "/prorsa/decision", "/prorsa/instances")))
            fc, dec, inst = fc.json(), dec.json(), inst.json()
        except (httpx.HTTPError, ValueError) as e:
            run.say(f"poll failed ({type(e).__name__}); trying again")
            await asyncio.sleep(1.0)
            continue
        d = dec.get("decision") or {}
        roles = {i["instance"]: i["role"] for i in inst["instances"]}
        status = {i["instance"]: i["status"] for i in inst["instances"]}
        phase = run.phase()[0]
        sample = {"t": round(run.now(), 2), "phase": phase, "roles": roles, "status": status,
                  "W_P": fc.get("prefill_tokens"), "K_D": fc.get("decode_kv_tokens"),
                  "in_flight": dict(run.in_flight), "decision_t": d.get("time_s")}
        if d:
            sample.update(a=d["demand"]["prefill"], b=d["demand"]["decode"], target=d["target"],
                          theta_P=d["inputs"]["theta_P"], hold=d.get("hold_reason"))
        run.timeline.append(sample)
        if seen_switches is None:  # switches before the demo (an earlier run, the reset) are not counted
            seen_switches = len(inst["switches"])
        if d and d.get("time_s") != last_decision:
            last_decision = d["time_s"]
            run.decisions.append({"t": sample["t"], **{k: d[k] for k in ("target", "demand", "plan", "hold_reason")},
                                  "theta_P": d["inputs"]["theta_P"], "W_P": d["inputs"]["W_P"]})
            plan = d["plan"]["switches"]
            verdict = ("switch " + ", ".join(f"instance {s['instance']} {s['from']} -> {s['to']}" for s in plan)
                       if plan else "hold: " + HOLD_REASONS.get(d.get("hold_reason"), str(d.get("hold_reason"))))
            run.say(f"controller: prefill demand {d['demand']['prefill']:.2f} instances (W^P {d['inputs']['W_P']:,.0f}"
                    f" tok / {d['inputs']['S']:g} s / theta^P {d['inputs']['theta_P']:,.0f} tok/s), decode demand "
                    f"{d['demand']['decode']:.2f} -> target {d['target']['prefill']}P:{d['target']['decode']}D; "
                    f"{verdict}")
        for iid, st in status.items():
            if last_status and st != last_status.get(iid):
                run.say(f"instance {iid}: {last_status.get(iid)} -> {st}" + (
                    " (out of the pools; its running requests are taken off and continued elsewhere)"
                    if st == "draining" else ""))
        last_status = status
        for sw in inst["switches"][seen_switches:]:
            got = await counters(client)
            sw = {**sw, "t": round(sw["time"] - run.t0, 2), "resumed_total": got["resumed"] - base["resumed"],
                  "restarted_total": got["restarted"] - base["restarted"]}
            run.switches.append(sw)
            run.say(f"SWITCH instance {sw['instance']} {sw['old_role']} -> {sw['new_role']} in "
                    f"{sw['timings'].get('controller_total_s', 0):.1f} s, busy: {sw['taken']} requests taken off; "
                    f"continued elsewhere so far: {sw['resumed_total']:.0f} resumed from their KV, "
                    f"{sw['restarted_total']:.0f} re-queued")
        seen_switches = len(inst["switches"])
        if sample["t"] - last_line >= 5:
            last_line = sample["t"]
            n_p = sum(r == "prefill" for r in roles.values())
            run.say(f"{phase:<18} roles {n_p}P:{len(roles) - n_p}D  forecast W^P {sample['W_P'] or 0:>9,.0f} tok  "
                    f"K^D {sample['K_D'] or 0:>7,.0f} tok  in flight {sum(run.in_flight.values()):>2}  "
                    f"answered {run.answered}/{run.sent}")
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def reset_roles(client: httpx.AsyncClient, run: Run) -> None:
    """An earlier run left 2 prefill : 1 decode: switch one prefill instance back so the demo starts from 1:2."""
    inst = (await client.get("/prorsa/instances")).json()["instances"]
    prefill = [i for i in inst if i["role"] == "prefill"]
    for i in prefill[1:]:
        run.say(f"instance {i['instance']} is prefill (left by an earlier run): switching it back to decode with "
                f"POST /prorsa/switch so the demo starts from 1P:{len(inst) - 1}D (not counted)")
        r = await client.post("/prorsa/switch", json={"instance": i["instance"], "new_role": "decode"})
        if r.status_code != 200:
            run.say(f"could not switch it back ({r.status_code}: {r.text[:200]}); going on")


def plot(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = run.timeline
    ts = [s["t"] for s in tl]
    fig, (ax_r, ax_f, ax_c, ax_q) = plt.subplots(4, 1, figsize=(11, 10), sharex=True,
                                                 gridspec_kw={"height_ratios": [1.2, 1, 1, 0.8]})
    ids = sorted({i for s in tl for i in s["roles"]})
    colours = {"prefill": "#fc8d62", "decode": "#66c2a5"}
    for k, iid in enumerate(ids):
        for s, t_next in zip(tl, ts[1:] + [ts[-1] + 1]):
            busy = s["status"].get(iid) in ("draining", "switching")
            ax_r.broken_barh([(s["t"], t_next - s["t"])], (k - 0.4, 0.8),
                             color="#bbbbbb" if busy else colours.get(s["roles"].get(iid), "white"))
    ax_r.set_yticks(range(len(ids)), [f"instance {i}" for i in ids])
    ax_r.set_title("roles: orange prefill, green decode, grey switching (requests taken off and continued elsewhere)")
    ax_f.plot(ts, [s["W_P"] or 0 for s in tl], color=colours["prefill"], label="forecast W^P: prefill tokens in the "
                                                                             "horizon (backlog + expected arrivals)")
    ax_f.set_ylabel("prefill tokens")
    ax_k = ax_f.twinx()
    ax_k.plot(ts, [s["K_D"] or 0 for s in tl], color=colours["decode"], label="forecast K^D: decode KV tokens")
    ax_k.set_ylabel("decode KV tokens")
    ax_f.legend(loc="upper left", fontsize=8)
    ax_k.legend(loc="upper right", fontsize=8)
    dec = run.decisions
    dts = [d["t"] for d in dec]
    ax_c.step(dts, [d["demand"]["prefill"] for d in dec], where="post", color=colours["prefill"],
              label="prefill demand a (instances)")
    ax_c.step(dts, [d["demand"]["decode"] for d in dec], where="post", color=colours["decode"],
              label="decode demand b (instances)")
    ax_c.step(dts, [d["target"]["prefill"] for d in dec], where="post", color="k", ls="--",
              label="Eq. 1 target: prefill instances")
    ax_c.step(ts, [sum(r == "prefill" for r in s["roles"].values()) for s in tl], where="post", color="k", lw=0.8,
              alpha=0.5, label="prefill instances")
    ax_c.set_ylabel("controller (every tick)")
    ax_c.legend(fontsize=8, loc="upper left")
    for kind in (LONG_ANSWER, LONG_CONTEXT):
        ax_q.plot(ts, [s["in_flight"][kind.name] for s in tl], label=f"{kind.name} requests in flight")
    ax_q.set_ylabel("client")
    ax_q.set_xlabel("seconds since the demo started")
    ax_q.legend(fontsize=8, loc="upper left")
    start = 0.0
    for (name, share, _), shade in zip(PHASES, ("#eef5ff", "#fff1e6", "#eef5ff")):
        for ax in (ax_r, ax_f, ax_c, ax_q):
            ax.axvspan(start, start + share * run.duration_s, color=shade, zorder=-1)
        ax_q.text(start + 1, 0.95, name, transform=ax_q.get_xaxis_transform(), fontsize=8, va="top")
        start += share * run.duration_s
    for sw in run.switches:
        for ax in (ax_r, ax_f, ax_c, ax_q):
            ax.axvline(sw["t"], color="k", ls=":", lw=1)
        ax_r.annotate(f"{sw['old_role']} -> {sw['new_role']}, {sw['taken']} taken off ", (sw["t"], len(ids) - 0.5),
                      fontsize=8, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def main_async(args: argparse.Namespace) -> int:
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), timeout=httpx.Timeout(300.0, connect=10.0),
                                 limits=httpx.Limits(max_connections=200, max_keepalive_connections=100)) as client:
        try:
            info = (await client.get("/prorsa/info")).json()
        except (httpx.HTTPError, ValueError) as e:
            print(f"cannot reach an sglang-prorsa front at {args.url} ({e}); start one with `make serve`")
            return 2
        if info.get("mode") != "adaptive" or not info.get("auto_switch"):
            print(f"{args.url} is not an adaptive front (mode {info.get('mode')!r}); start one with `make serve`")
            return 2
        run = Run(args.url, args.seed, args.duration_s)
        await reset_roles(client, run)
        base = await counters(client)
        run.t0 = time.time()
        run.say(f"driving {args.url} for {args.duration_s:g} s (horizon S = {info['horizon_s']:g} s, a control "
                f"decision every {info['control_interval_s']:g} s); phases: "
                + ", ".join(f"{n} {s * args.duration_s:.0f} s" for n, s, _ in PHASES))
        nonce = f"{random.SystemRandom().randrange(16 ** 6):06x}"  # trajectory ids are new on a long-lived server
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(client, run, stop, base))
        agents = [asyncio.create_task(agent(client, run, kind, slot, nonce))
                  for kind in (LONG_ANSWER, LONG_CONTEXT) for slot in range(max(p[2].get(kind, 0) for p in PHASES))]
        done, pending = await asyncio.wait(agents, timeout=args.duration_s + args.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        errors = [t.exception() for t in done if t.exception() is not None]
        if pending:
            run.lost.append(f"{len(pending)} episodes still running {args.drain_s:g} s after the end: cancelled")
        await asyncio.sleep(1.5)  # one more poll: a switch that just ended
        stop.set()
        await watcher
        final = await counters(client)
    wall = run.now()
    moved = run.switches
    resumed, restarted = final["resumed"] - base["resumed"], final["restarted"] - base["restarted"]
    lost = run.sent - run.answered  # every request sent and not answered 200 with all its tokens
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"switches": len(moved), "taken_off": sum(s["taken"] for s in moved), "resumed": resumed,
               "restarted": restarted, "resume_failed": final["resume_failed"] - base["resume_failed"],
               "requests": run.sent, "answered": run.answered, "lost": lost, "lost_detail": run.lost[:10],
               "wall_s": round(wall, 1), "errors": [repr(e)[:300] for e in errors]}
    (out / "timeline.json").write_text(json.dumps({"url": args.url, "seed": args.seed, "duration_s": args.duration_s,
                                                   "phases": [[n, s] for n, s, _ in PHASES], "summary": summary,
                                                   "switches": run.switches, "decisions": run.decisions,
                                                   "timeline": run.timeline, "requests": run.requests}) + "\n")
    plot(run, out / "roles.png")
    print("\n== what happened ==")
    for s in moved:
        print(f"  t={s['t']:.0f}s  instance {s['instance']}: {s['old_role']} -> {s['new_role']} while busy, "
              f"{s['taken']} requests taken off, switch {s['timings'].get('controller_total_s', 0):.1f} s")
    print(f"  busy switches:         {len(moved)}  (decided by the controller from the forecast)")
    print(f"  requests continued:    {resumed:.0f} resumed from their KV mid-answer, {restarted:.0f} re-queued")
    print(f"  requests:              {run.sent} sent, {run.answered} answered with every token, {lost} lost")
    print(f"  wall time:             {wall:.0f} s")
    print(f"  role timeline (PNG):   {out / 'roles.png'}")
    print(f"  raw timeline (JSON):   {out / 'timeline.json'}")
    print("  look at: the PNG's top row (a decode instance turns prefill in the prefill-heavy phase), the forecast's "
          "W^P rising with the long contexts, and the controller's prefill demand crossing 1 instance just before.")
    if lost or errors:
        print("FAILED: " + "; ".join(run.lost[:5] + summary["errors"][:3]))
        return 1
    if not moved:
        print("FAILED: no switch happened. The controller's last reasons are in the 'controller:' lines above; on a "
              "busier machine try a longer run (--duration-s 150).")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="the adaptive front (`make serve`)")
    ap.add_argument("--duration-s", type=float, default=100.0, help="seconds of workload (then in-flight episodes end)")
    ap.add_argument("--drain-s", type=float, default=60.0, help="how long in-flight episodes may take after that")
    ap.add_argument("--out", default="demo-out", help="folder for roles.png and timeline.json")
    ap.add_argument("--seed", type=int, default=0, help="the workload's token ids and durations")
    return asyncio.run(main_async(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
