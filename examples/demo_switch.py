"""See it switch: a two-minute agentic workload whose prefill:decode mix shifts, against `make serve`.

    make serve      # terminal 1: the adaptive front + 3 engine instances (1 prefill, 2 decode)
    make demo       # terminal 2: this script (python examples/demo_switch.py --url http://127.0.0.1:30000)

Agentic episodes (lifecycle hints on POST /lifecycle, greedy POST /generate carrying X-Trajectory-Id) in three phases:

  1. decode-heavy:  12 "long-answer" agents (a short question, 600 tokens of reasoning, no tool) keep both decode
     instances busy;
  2. prefill-heavy: 180 "tool-loop" agents join, in GRPO groups of 15 sharing a prompt: each starts a sandbox, then
     every turn sends its whole context (~800 tokens plus tool outputs) for a 4-token answer: nearly all prefill;
  3. decode-heavy again: the tool-loop agents finish their episodes and stop.

It prints the forecast (W^P: prefill tokens expected within the horizon; K^D: decode KV tokens), every control decision
(demand in instances, Eq. 1's target, why it holds) and every switch. When the tool-loop sandboxes start, the forecast
counts their first prompts before any of them is sent (a surge: announced prompts far above the recent arrivals, so
the lifecycle forecast is served, not the window series that cannot have seen them); the controller's prefill demand
passes one instance, Eq. 1 asks for 2 prefill : 1 decode, and it switches a *busy* decode instance to prefill: the
requests decoding on it are taken off and resumed elsewhere from their KV, and every caller still gets one complete
answer. At the end: a summary, a role-timeline PNG and the raw timeline as JSON.

Before it starts it puts the server back to 1 prefill : 2 decode (if an earlier run left 2 : 1) and empties the prefix
caches (POST /flush_cache): the controller counts cached KV on decode instances as decode demand. Exit status 0 when a
busy switch happened and every request was answered with all its tokens; 1 otherwise; 2 when no adaptive front
answers at --url. HTTP only (httpx); nothing of the server is imported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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
    """An episode: a sandbox start (`sandbox_s`, if any), a prompt shared by a GRPO group of `group` agents, then
    `turns` x (a greedy answer, a tool that runs `tool_s` and appends its output to the context)."""

    name: str
    prompt_tokens: tuple[int, int]
    answer_tokens: int
    tool_tokens: tuple[int, int]
    tool_s: tuple[float, float]
    turns: int
    group: int = 1
    sandbox_s: tuple[float, float] | None = None


LONG_ANSWER = AgentKind("long-answer", (32, 64), 600, (0, 0), (0.0, 0.0), 1)  # decode-heavy: a question, reasoning
TOOL_LOOP = AgentKind("tool-loop", (700, 900), 4, (20, 40), (6.0, 9.0), 3, group=15, sandbox_s=(4.0, 7.0))
PHASES = (("decode-heavy", 0.2, {LONG_ANSWER: 12}),  # (name, share of --duration-s, agents running)
          ("prefill-heavy", 0.4, {LONG_ANSWER: 12, TOOL_LOOP: 180}),
          ("decode-heavy again", 0.4, {LONG_ANSWER: 12}))
LEAD_S = 2.5  # the prefill-heavy phase starts this long before a control tick (Run.align)
HOLDS = {"no_role_short": "no role is short", "target_met": "Eq. 1's target is met",
         "no_eligible_instance": "no instance may move yet (dwell time)", "paused": "generation is paused",
         "donor_at_minimum": "the donor role is at its minimum", "within_hysteresis_band": "within the hysteresis band",
         "cost_exceeds_gain": "a switch would not pay for itself"}


@dataclass
class Run:
    duration_s: float
    seed: int
    interval_s: float = 10.0  # between control decisions
    delay_s: float | None = None  # phases 2 and 3 start this much later than their share says (see align)
    t0: float = field(default_factory=time.time)
    sent: int = 0
    answered: int = 0  # HTTP 200 with exactly the tokens asked for
    lost: list[str] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    switches: list[dict] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=lambda: {LONG_ANSWER.name: 0, TOOL_LOOP.name: 0})

    def now(self) -> float:
        return time.time() - self.t0

    def bounds(self) -> list[tuple[str, float, float, dict]]:
        out, start = [], 0.0
        for i, (name, share, agents) in enumerate(PHASES):
            end = start + share * self.duration_s + ((self.delay_s or 0.0) if i == 0 else 0.0)
            out.append((name, start, end, agents))
            start = end
        return out

    def end(self) -> float:
        return self.bounds()[-1][2]

    def phase(self) -> tuple[str, dict]:
        return next(((n, a) for n, _, end, a in self.bounds() if self.now() < end), ("finishing", {}))

    def align(self, decision_time: float) -> None:
        """Start the prefill-heavy phase LEAD_S before a control tick (they come every interval_s after the last):
        the decision that answers it then sees the forecast at its peak, instead of up to 10 s later."""
        if self.delay_s is None:
            nominal, last = PHASES[0][1] * self.duration_s, decision_time - self.t0
            tick = last + self.interval_s * math.ceil((nominal + LEAD_S - last) / self.interval_s)
            self.delay_s = tick - LEAD_S - nominal

    def say(self, msg: str) -> None:
        print(f"[{self.now():5.1f}s] {msg}", flush=True)


class Hints:
    """Lifecycle hints, posted in batches every 0.1 s (as the trainer SDK does); a generation waits until the hints
    queued before it are posted, so the server sees each trajectory's events in order."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client, self.queue, self.added, self.posted = client, [], 0, 0
        self.progress = asyncio.Condition()
        self.errors: list[str] = []

    def add(self, tid: str, event: str, turn: int, **fields) -> None:
        self.queue.append({"trajectory_id": tid, "event": event, "ts": time.time(), "task": "demo", "turn": turn,
                           **fields})
        self.added += 1

    async def sent(self) -> None:
        target = self.added
        async with self.progress:
            await self.progress.wait_for(lambda: self.posted >= target)

    async def post_forever(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            batch, self.queue = self.queue, []
            if batch:
                try:
                    r = await self.client.post("/lifecycle", json={"events": batch})
                    if r.status_code != 200:
                        self.errors.append(f"POST /lifecycle: HTTP {r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.errors.append(f"POST /lifecycle: {type(e).__name__} {e}")
            async with self.progress:
                self.posted += len(batch)
                self.progress.notify_all()


async def episode(client: httpx.AsyncClient, hints: Hints, run: Run, kind: AgentKind, slot: int, n: int,
                  nonce: str) -> None:
    tid, group = f"demo-{nonce}-{kind.name}-{slot}-{n}", f"{kind.name}-{slot // kind.group}-{n}"
    prompt_rng, rng = random.Random(f"{run.seed}/{group}"), random.Random(f"{run.seed}/{kind.name}/{slot}/{n}")
    context = [prompt_rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(prompt_rng.randint(*kind.prompt_tokens))]
    hints.add(tid, "sampled", 0, prompt_tokens=len(context), group_id=f"demo-{nonce}-{group}")
    if kind.sandbox_s:  # the forecast counts the first prompt as arriving once the sandbox is up
        hints.add(tid, "sandbox_start", 0, mode="prewarm")
        await asyncio.sleep(rng.uniform(*kind.sandbox_s))
        hints.add(tid, "sandbox_ready", 0, prompt_tokens=len(context))
    for turn in range(kind.turns):
        await hints.sent()
        record = {"trajectory": tid, "kind": kind.name, "turn": turn, "prompt": len(context), "send": run.now()}
        run.sent += 1
        run.in_flight[kind.name] += 1
        try:
            r = await client.post("/generate", headers={"X-Trajectory-Id": tid}, json={
                "input_ids": context,
                "sampling_params": {"max_new_tokens": kind.answer_tokens, "temperature": 0, "ignore_eos": True}})
            record["status"] = r.status_code
            out = r.json().get("output_ids") if r.status_code == 200 else None
            problem = (f"HTTP {r.status_code} {r.text[:150]}" if out is None
                       else f"{len(out)} of {kind.answer_tokens} tokens" if len(out) != kind.answer_tokens else None)
        except (httpx.HTTPError, ValueError) as e:
            out, problem = None, f"{type(e).__name__} {e}"[:200]
        finally:
            run.in_flight[kind.name] -= 1
        run.requests.append({**record, "done": round(run.now(), 3), "problem": problem})
        if problem:
            run.lost.append(f"{tid} turn {turn}: {problem}")
            hints.add(tid, "aborted", turn + 1)
            return
        run.answered += 1
        context += out
        if turn + 1 < kind.turns:
            hints.add(tid, "tool_start", turn + 1, tool="bash")
            await asyncio.sleep(rng.uniform(*kind.tool_s))
            context += [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(rng.randint(*kind.tool_tokens))]
            hints.add(tid, "tool_end", turn + 1, prompt_tokens=len(context))  # the next prompt's length
    hints.add(tid, "reward_start", kind.turns)
    hints.add(tid, "reward_end", kind.turns, accepted=True)


async def agent(client: httpx.AsyncClient, hints: Hints, run: Run, kind: AgentKind, slot: int, nonce: str) -> None:
    """Episodes back to back while the current phase runs at least slot + 1 agents of this kind."""
    n = 0
    while run.now() < run.end():
        if slot >= run.phase()[1].get(kind, 0):
            await asyncio.sleep(0.5)
            continue
        await episode(client, hints, run, kind, slot, n, nonce)
        n += 1


def plural(n: float, word: str) -> str:
    return f"{n:.0f} {word}{'' if n == 1 else 's'}"


async def resume_counts(client: httpx.AsyncClient) -> dict[str, float]:
    """Requests continued elsewhere after being taken off a switching instance, summed over the instances."""
    text, out = (await client.get("/metrics")).text, {"resumed": 0.0, "restarted": 0.0}
    for name, value in re.findall(r"^prorsa_(resumed|restarted)_total\{[^}]*\}\s+(\S+)$", text, re.M):
        out[name] += float(value)
    return out


async def watch(client: httpx.AsyncClient, run: Run, stop: asyncio.Event, base: dict[str, float]) -> None:
    """Once a second: the forecast, the last decision and the instances; print what changed."""
    last_t, last_status, seen, last_line = None, {}, None, -10.0
    while not stop.is_set():
        try:
            fc, dec, inst = [(await r).json() for r in [asyncio.ensure_future(client.get(p, timeout=10)) for p in
                                                        ("/prorsa/forecast", "/prorsa/decision", "/prorsa/instances")]]
        except (httpx.HTTPError, ValueError) as e:
            run.say(f"poll failed ({type(e).__name__}); trying again")
            await asyncio.sleep(1)
            continue
        d = dec.get("decision") or {}
        roles = {i["instance"]: i["role"] for i in inst["instances"]}
        status = {i["instance"]: i["status"] for i in inst["instances"]}
        sample = {"t": round(run.now(), 2), "phase": run.phase()[0], "roles": roles, "status": status,
                  "W_P": fc.get("prefill_tokens") or 0, "K_D": fc.get("decode_kv_tokens") or 0,
                  "served": (fc.get("served") or {}).get("prefill") or {},
                  "in_flight": dict(run.in_flight)}
        run.timeline.append(sample)
        if d and d["time_s"] != last_t and d["time_s"] >= run.t0:  # a decision made since the demo started
            last_t, plan = d["time_s"], d["plan"]["switches"]
            run.decisions.append({"t": round(d["time_s"] - run.t0, 2), "W_P": d["inputs"]["W_P"],
                                  "theta_P": d["inputs"]["theta_P"],
                                  "K_D_now": d["inputs"]["K_D_now"], "K_D_forecast": d["inputs"]["K_D_forecast"],
                                  **{k: d[k] for k in ("demand", "target", "plan", "hold_reason")}})
            verdict = ("SWITCH " + ", ".join(f"instance {s['instance']} {s['from']} -> {s['to']}" for s in plan)
                       if plan else "hold: " + HOLDS.get(d["hold_reason"], str(d["hold_reason"])))
            inputs, target, demand = d["inputs"], d["target"], d["demand"]
            run.say(f"controller: prefill demand {demand['prefill']:.2f} instances (W^P {inputs['W_P']:,.0f} tok"
                    f" / {inputs['S']:g} s / theta^P {inputs['theta_P']:,.0f} tok/s), decode {demand['decode']:.2f}"
                    f" -> target {target['prefill']}P:{target['decode']}D; {verdict}")
        for iid, st in status.items():
            if last_status and st != last_status.get(iid):
                run.say(f"instance {iid}: {last_status.get(iid)} -> {st}")
        last_status = status
        if seen is None:  # switches before the demo started (an earlier run) are not counted
            seen = len(inst["switches"])
        for sw in inst["switches"][seen:]:
            got = await resume_counts(client)
            began = sw["time"] - sw["timings"].get("controller_total_s", 0.0)  # "time" is when it ended
            sw = {**sw, "t": round(began - run.t0, 2), "resumed_so_far": got["resumed"] - base["resumed"],
                  "restarted_so_far": got["restarted"] - base["restarted"]}
            run.switches.append(sw)
            moved = (f"{plural(sw['taken'], 'request')} taken off it and continued elsewhere" if sw["taken"]
                     else "nothing was running on it")
            run.say(f"SWITCHED instance {sw['instance']} {sw['old_role']} -> {sw['new_role']} in "
                    f"{sw['timings'].get('controller_total_s', 0):.1f} s: {moved} ({sw['resumed_so_far']:.0f} resumed "
                    "from their KV so far)")
        seen = len(inst["switches"])
        if sample["t"] - last_line >= 5:
            last_line = sample["t"]
            n_p = sum(r == "prefill" for r in roles.values())
            served = sample["served"]
            run.say(f"{sample['phase']:<18} roles {n_p}P:{len(roles) - n_p}D  forecast W^P {sample['W_P']:>7,.0f} tok"
                    f" ({served.get('member', '?')}, {served.get('regime', '?')})  K^D {sample['K_D']:>7,.0f} tok"
                    f"  requests in flight {sum(run.in_flight.values()):>3}, answered {run.answered}/{run.sent}")
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def prepare(client: httpx.AsyncClient, run: Run) -> None:
    """Start from what a fresh `make serve` has: 1 prefill instance and empty KV caches (an earlier run leaves a
    switched instance behind, and decode instances whose cached KV the controller counts as held)."""
    inst = (await client.get("/prorsa/instances")).json()["instances"]
    for i in [i for i in inst if i["role"] == "prefill"][1:]:
        print(f"instance {i['instance']} is prefill after an earlier run: POST /prorsa/switch back to decode")
        r = await client.post("/prorsa/switch", json={"instance": i["instance"], "new_role": "decode"})
        if r.status_code != 200:
            print(f"  not switched back (HTTP {r.status_code}: {r.text[:200]}); going on")
    r = await client.post("/flush_cache", params={"timeout": 30})
    print(f"POST /flush_cache (start from empty prefix caches): HTTP {r.status_code}", flush=True)
    dec = (await client.get("/prorsa/decision")).json()
    theta, pool = dec["theta_p"]["theta_mix"], ((dec.get("decision") or {}).get("inputs") or {}).get("C_D_KV")
    if pool and pool / (dec["horizon_s"] * theta) < 1.3:
        print(f"note: this server has learned theta^P = {theta:,.0f} tok/s from earlier loads: one prefill instance "
              f"covers {dec['horizon_s'] * theta:,.0f} prompt tokens per horizon, about what fills a decode instance's "
              f"KV pool ({pool:,.0f}), so Eq. 1 may keep 1 prefill : 2 decode; a freshly started `make serve` shows "
              "the switch", flush=True)


def plot(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl, dec = run.timeline, run.decisions
    ts, dts = [s["t"] for s in tl], [d["t"] for d in dec]
    colour = {"prefill": "#fc8d62", "decode": "#66c2a5"}
    fig, (ax_r, ax_f, ax_c) = plt.subplots(3, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [1, 1, 1]})
    ids = sorted({i for s in tl for i in s["roles"]})
    for k, iid in enumerate(ids):
        for s, t_next in zip(tl, ts[1:] + [ts[-1] + 1]):
            moving = s["status"].get(iid) in ("draining", "switching")
            ax_r.broken_barh([(s["t"], t_next - s["t"])], (k - 0.4, 0.8),
                             color="#888888" if moving else colour.get(s["roles"].get(iid), "white"))
    ax_r.set_yticks(range(len(ids)), [f"instance {i}" for i in ids])
    ax_r.set_title("roles: orange prefill, green decode, grey switching (its requests taken off, continued elsewhere)",
                   fontsize=10)
    ax_f.plot(ts, [s["W_P"] for s in tl], color=colour["prefill"], label="forecast W^P: prefill tokens in the horizon")
    ax_f.plot(ts, [s["K_D"] for s in tl], color=colour["decode"], ls="--", label="forecast K^D: decode KV tokens")
    ax_f.plot(dts, [d["K_D_now"] for d in dec], color=colour["decode"], ls=":", marker=".",
              label="decode KV held now (K^D_t, at each decision)")
    ax_f.set_ylabel("tokens")
    ax_f.legend(fontsize=8, loc="upper right")
    ax_c.step(dts, [d["demand"]["prefill"] for d in dec], where="post", color=colour["prefill"],
              label="prefill demand a (instances)")
    ax_c.step(dts, [d["demand"]["decode"] for d in dec], where="post", color=colour["decode"],
              label="decode demand b (instances)")
    ax_c.step(dts, [d["target"]["prefill"] for d in dec], where="post", color="k", ls="--",
              label="Eq. 1 target: prefill instances")
    cap = 4.0  # a first estimate of theta^P can make the demand spike: clip it, and print its value
    ax_c.set_ylim(-0.1, cap)
    for d in dec:
        if d["demand"]["prefill"] > cap:
            ax_c.text(d["t"] + 0.5, cap * 0.93, f"a = {d['demand']['prefill']:.1f}", fontsize=8,
                      color=colour["prefill"])
    ax_c.set_ylabel("controller decisions")
    ax_c.set_xlabel("seconds since the demo started")
    ax_c.legend(fontsize=8, loc="upper right")
    for (name, start, end, _), shade in zip(run.bounds(), ("#eef5ff", "#fff1e6", "#eef5ff")):
        for ax in (ax_r, ax_f, ax_c):
            ax.axvspan(start, end, color=shade, zorder=-1)
        ax_c.text(start + 1, 0.02, name, transform=ax_c.get_xaxis_transform(), fontsize=8)
    for sw in run.switches:
        for ax in (ax_r, ax_f, ax_c):
            ax.axvline(sw["t"], color="k", ls=":", lw=1)
        k = ids.index(sw["instance"]) if sw["instance"] in ids else 0
        ax_r.broken_barh([(sw["t"], max(sw["timings"].get("controller_total_s", 0), 0.5))], (k - 0.4, 0.8),
                         color="#888888")
        moved = f"{plural(sw['taken'], 'request')} taken off" if sw["taken"] else "idle"
        ax_r.text(sw["t"] + 1, k + 0.42, f"{sw['old_role']} -> {sw['new_role']}: {moved}", fontsize=8, va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def wait_ready(client: httpx.AsyncClient, args: argparse.Namespace) -> dict | None:
    """GET /prorsa/info once the front answers and every instance is active (`make serve` takes 1-3 minutes)."""
    deadline, said = time.time() + args.wait_s, False
    while time.time() < deadline:
        try:
            info = (await client.get("/prorsa/info")).json()
            states = [i["status"] for i in (await client.get("/prorsa/instances")).json()["instances"]]
            if states and all(st == "active" for st in states):
                return info
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if not said:
            print(f"waiting for the server at {args.url} (`make serve`) to be ready ...", flush=True)
            said = True
        await asyncio.sleep(2)
    return None


async def main_async(args: argparse.Namespace) -> int:
    limits = httpx.Limits(max_connections=400, keepalive_expiry=1.0)  # idle < the server's 5 s keep-alive
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), timeout=httpx.Timeout(300, connect=10),
                                 limits=limits) as client:
        info = await wait_ready(client, args)
        if info is None:
            print(f"no sglang-prorsa front with all instances active at {args.url} after {args.wait_s:g} s; start "
                  "one with `make serve` (same PORT)")
            return 2
        if info.get("mode") != "adaptive" or not info.get("auto_switch"):
            print(f"{args.url} is not an adaptive front (mode {info.get('mode')!r}); start one with `make serve`")
            return 2
        run = Run(args.duration_s, args.seed, info["control_interval_s"])
        await prepare(client, run)
        base = await resume_counts(client)
        run.t0 = time.time()
        last = ((await client.get("/prorsa/decision")).json().get("decision") or {}).get("time_s")
        run.align(last if last is not None else run.t0)
        run.say(f"{args.url}: horizon S {info['horizon_s']:g} s, a control decision every {run.interval_s:g} s; "
                + ", ".join(f"{n} {start:.0f}-{end:.0f} s" for n, start, end, _ in run.bounds()))
        nonce = f"{random.SystemRandom().randrange(16 ** 6):06x}"  # trajectory ids never seen by this server
        stop, hints = asyncio.Event(), Hints(client)
        watcher, poster = asyncio.create_task(watch(client, run, stop, base)), asyncio.create_task(hints.post_forever())
        agents = [asyncio.create_task(agent(client, hints, run, kind, slot, nonce)) for kind in (LONG_ANSWER, TOOL_LOOP)
                  for slot in range(max(p[2].get(kind, 0) for p in PHASES))]
        done, pending = await asyncio.wait(agents, timeout=args.duration_s + run.interval_s + args.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            run.lost.append(f"{len(pending)} episodes still running {args.drain_s:g} s after the end: cancelled")
        errors = [repr(t.exception())[:300] for t in done if t.exception() is not None] + hints.errors[:5]
        await asyncio.sleep(1.5)  # a last poll, and the last hints
        stop.set()
        await watcher
        poster.cancel()
        final = await resume_counts(client)
    wall, busy = run.now(), [s for s in run.switches if s["taken"] > 0]
    resumed, restarted = final["resumed"] - base["resumed"], final["restarted"] - base["restarted"]
    lost = run.sent - run.answered  # sent, and not answered 200 with every token asked for
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"switches": len(run.switches), "busy_switches": len(busy), "taken_off": sum(s["taken"] for s in busy),
               "resumed": resumed, "restarted": restarted, "requests": run.sent, "answered": run.answered,
               "lost": lost, "lost_detail": run.lost[:10], "errors": errors, "wall_s": round(wall, 1)}
    (out / "timeline.json").write_text(json.dumps({
        "url": args.url, "seed": args.seed, "duration_s": args.duration_s, "summary": summary,
        "phases": [[n, t0, t1, {k.name: c for k, c in a.items()}] for n, t0, t1, a in run.bounds()],
        "switches": run.switches,
        "decisions": run.decisions, "timeline": run.timeline, "requests": run.requests}) + "\n")
    plot(run, out / "roles.png")
    print("\n== summary ==")
    for s in run.switches:
        busy_or_not = f"busy, {plural(s['taken'], 'request')} taken off" if s["taken"] else "idle"
        print(f"  t={s['t']:5.1f} s  instance {s['instance']} {s['old_role']} -> {s['new_role']} ({busy_or_not}); the "
              f"switch took {s['timings'].get('controller_total_s', 0):.1f} s")
    print(f"  busy switches        {len(busy)} of {len(run.switches)} (decided by the controller from the forecast)")
    print(f"  requests continued   {resumed:.0f} resumed mid-answer from their KV, {restarted:.0f} restarted from "
          f"the queue, on another instance")
    print(f"  requests             {run.sent} sent, {run.answered} answered with every token, {lost} lost")
    print(f"  wall time            {wall:.0f} s")
    print(f"  role timeline        {out / 'roles.png'}")
    print(f"  raw timeline         {out / 'timeline.json'}  (every poll, decision, switch and request)")
    print("  look at: the 'controller:' line where the prefill demand passes 1 instance and the target turns\n"
          "  2P:1D (the forecast counts the tool-loop prompts while their sandboxes start, before any is sent: the\n"
          "  forecast lines say 'lifecycle, surge', the member served and its regime; docs/forecast.md), the\n"
          "  SWITCHED line after it (requests taken off a busy decode instance, resumed elsewhere), and in roles.png\n"
          "  the instance that turns from green to orange as W^P jumps.")
    if lost or errors:
        print("FAILED: " + "; ".join((run.lost + errors)[:5]))
        return 1
    if not busy:
        print("FAILED: no busy switch happened" + (" (only idle ones)" if run.switches else "") + ": the 'controller:'"
              " lines say why it held. Eq. 1 asks for 2P:1D only while prefill demand exceeds decode demand; on a"
              " server that already ran long agentic loads theta^P may be high enough to prevent it: restart `make"
              " serve` and run again.")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="the adaptive front (`make serve`)")
    ap.add_argument("--duration-s", type=float, default=90.0, help="seconds of workload; episodes in flight then end")
    ap.add_argument("--drain-s", type=float, default=60.0, help="at most this long for them to end")
    ap.add_argument("--out", default="demo-out", help="folder for roles.png and timeline.json")
    ap.add_argument("--seed", type=int, default=0, help="token ids and tool durations")
    ap.add_argument("--wait-s", type=float, default=600.0, help="how long to wait for the server to be ready")
    return asyncio.run(main_async(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
