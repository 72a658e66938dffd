"""The floor: a forecaster with exact arrival probabilities, i.e. the error that random timing alone causes.

For the synthetic workload we know the truth a real predictor has to learn. This oracle watches the same event
stream as the control plane and, at each window start, forecasts with

* the plan of every live trajectory (structure and sizes: whether the current turn calls a tool, which one, the next
  request's exact prompt length; sampled ahead by the generator, so known here and nowhere else), and
* the *true* distributions of every duration (dispatch, sandbox startup by mode, first request, decode = output
  length x TPOT x noise, tools, agent overhead, reward), conditioned on the time already spent in the current phase,

but not the realised durations. Its probabilities are computed on a fine grid (S/256) from 200,000 draws of each
distribution with the same chain tables as the predictor (grid.py), which are exact up to the grid. Whatever error
it still makes comes from the randomness of timing: no forecaster with the same information can do better on
average. The decode side is approximate: prefill service is taken at its mean and queueing behind future arrivals is
ignored (the presets run the prefill instances at low utilisation, where that is small).

Policies covered: group replenishment and replace-on-reward (async), fixed rate, synchronous steps (the next step
launches exactly ``train_gap_s`` after the last reward; its plans are known).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sglang_prorsa.policy.forecast.grid import GridCurve, chain_table
from sglang_prorsa.policy.forecast.sampler import InjectionPolicy
from sglang_prorsa.policy.lifecycle.events import EventKind, LifecycleEvent, SandboxMode
from sglang_prorsa.workload.generator import TrajectoryPlan, WorkloadGenerator
from sglang_prorsa.workload.presets import WorkloadSpec
from sglang_prorsa.workload.simulator import HINT_DELAY_S

POOL = 200_000
MC = 2_000


@dataclass
class _Live:
    plan: TrajectoryPlan
    state: EventKind  # the last event
    since: float
    turn: int = 0
    instance: int = -1


class FloorOracle:
    def __init__(self, spec: WorkloadSpec, seed: int, horizon_s: float, samples: int = POOL) -> None:
        self.spec, self.S = spec, float(horizon_s)
        self.dt = horizon_s / 256.0
        self.gen = WorkloadGenerator(spec.task, seed)
        self.live: dict[str, _Live] = {}
        self.next_index = 0
        self.step_ended_at: float | None = None
        self._rng = np.random.default_rng(987_654 + seed)
        task, eng, rng, n = spec.task, spec.engine, self._rng, samples
        jitter = lambda sigma: np.exp(sigma * rng.standard_normal(n)) if sigma > 0 else np.ones(n)  # noqa: E731
        self.pool = {
            "dispatch": task.dispatch_s.sample_many(rng, n),
            "prewarm": task.prewarm_start_s.sample_many(rng, n),
            "cold": task.cold_start_s.sample_many(rng, n),
            "first": task.first_request_s.sample_many(rng, n),
            "overhead": task.agent_overhead_s.sample_many(rng, n),
            "reward": task.reward_s.sample_many(rng, n),
            "decode": np.maximum(1, np.round(task.output_tokens.sample_many(rng, n))) * eng.decode_s_per_token
            * jitter(eng.decode_noise_sigma),
        }
        for tool in task.tools:
            self.pool["tool:" + tool.name] = tool.duration_s.sample_many(rng, n)
        self.pool["hint"] = np.full(n, HINT_DELAY_S)
        self._sorted = {k: np.sort(v) for k, v in self.pool.items()}
        self.x_first = float(np.mean(np.maximum(1, np.round(task.first_prompt_tokens.sample_many(rng, n)))))
        self._jitter_mean = math.exp(eng.prefill_noise_sigma ** 2 / 2)
        self._tables: dict = {}
        self._cdfs: dict = {}
        self._sums: dict = {}
        self._curves: dict = {}
        self._mixture = self._launch(None)

    # ----- distributions -----
    def _sum(self, *names: str) -> np.ndarray:
        out = self._sums.get(names)
        if out is None:
            out = np.zeros(self.pool["hint"].size)
            for i, name in enumerate(names):
                out = out + np.roll(self.pool[name], 7919 * i)  # independent pairings of the same draws
            self._sums[names] = out
        return out

    def _launch(self, mode: SandboxMode | None) -> np.ndarray:
        if not self.spec.task.uses_sandbox:
            return self.pool["dispatch"]
        if mode is None:  # a sample not planned yet: the prewarm / cold mixture
            pick = self._rng.random(self.pool["hint"].size) < self.spec.task.prewarm_hit_rate
            return self._sum("dispatch", "first") + np.where(pick, self.pool["prewarm"], np.roll(self.pool["cold"], 3))
        return self._sum("dispatch", mode.value, "first")

    def _cdf(self, key: tuple, draws: np.ndarray) -> np.ndarray:
        if key not in self._cdfs:
            self._cdfs[key] = GridCurve.from_durations(draws, [], self.dt).cdf_from_start(int(round(self.S / self.dt)) + 2)
        return self._cdfs[key]

    def _q(self, key: tuple, first: np.ndarray, then: np.ndarray | None, elapsed: float, h: float) -> float:
        """P(first - e + then < h | first > e) from the true draws (then: None for nothing after)."""
        h = round(h / self.dt) * self.dt
        tkey = key + (h,)
        if tkey not in self._tables:
            curve = self._curves.get(key)
            if curve is None:
                curve = self._curves[key] = GridCurve.from_durations(first, [], self.dt)
            cdf = None if then is None else self._cdf(key + ("then",), then)
            self._tables[tkey] = chain_table(curve, h, cdf)
        return float(self._tables[tkey].lookup(np.array([elapsed]))[0])

    def _after(self, key: tuple, draws: np.ndarray, room: float) -> float:
        """P(draws < room)."""
        if room <= 0:
            return 0.0
        cdf = self._cdf(key, draws)
        k = int(math.ceil(room / self.dt)) - 1
        return float(cdf[min(k, cdf.size - 1)])

    def _g(self, x: float) -> float:
        return self.spec.engine.profile()(x) * self._jitter_mean

    # ----- events -----
    def observe(self, event: LifecycleEvent) -> None:
        kind, tid, ts = event.kind, event.trajectory_id, float(event.ts)
        if kind is EventKind.SAMPLED:
            index = int(tid.rsplit("-", 1)[1])
            self.next_index = max(self.next_index, index + 1)
            self.live[tid] = _Live(self.gen.plan(index, event.group_id), kind, ts)
            return
        live = self.live.get(tid)
        if live is None:
            return
        if kind is EventKind.REWARD_END or kind is EventKind.ABORTED:
            del self.live[tid]
            if not self.live:
                self.step_ended_at = ts
            return
        live.state, live.since = kind, ts
        if kind is EventKind.REQUEST_ARRIVED:
            live.turn = event.turn or 0
            live.instance = int(event.instance) if event.instance is not None else -1

    # ----- the forecast -----
    def forecast(self, now: float) -> tuple[float, float]:
        """(prefill arrival tokens, decode admission tokens) expected in [now, now + S)."""
        S = self.S
        finish = self._prefill_finishes(now)
        sizes = [lv.plan.prompt_tokens_at(min(lv.turn + 1, len(lv.plan.turns) - 1)) for lv in self.live.values()]
        g_typ = self._g(float(np.mean(sizes)) if sizes else self.x_first)
        h_dec = max(0.0, S - g_typ)
        arrivals = admitted = 0.0
        for tid, lv in self.live.items():
            plan, e = lv.plan, max(0.0, now - lv.since)
            q_s, q_d, x = self._arrival(lv, plan, e, finish.get(tid), now, h_dec)
            arrivals += q_s * x
            admitted += q_d * x
            if tid in finish and finish[tid] < now + S:
                admitted += plan.prompt_tokens_at(lv.turn)
        new_s, new_d = self._new_samples(now, h_dec)
        return arrivals + new_s, admitted + new_d

    def _arrival(self, lv: _Live, plan: TrajectoryPlan, e: float, fin: float | None, now: float,
                 h_dec: float) -> tuple[float, float, float]:
        k, S = lv.state, self.S
        mode = plan.sandbox_mode
        if k is EventKind.SAMPLED:
            then = None if mode is None else self._sum(mode.value, "first")
            key = ("sampled", mode)
            return (self._q(key, self.pool["dispatch"], then, e, S), self._q(key, self.pool["dispatch"], then, e, h_dec),
                    plan.first_prompt_tokens)
        if k is EventKind.SANDBOX_START:
            key = ("start", mode)
            first = self.pool[mode.value]
            return (self._q(key, first, self.pool["first"], e, S), self._q(key, first, self.pool["first"], e, h_dec),
                    plan.first_prompt_tokens)
        if k is EventKind.SANDBOX_READY:
            return (self._q(("ready",), self.pool["first"], None, e, S),
                    self._q(("ready",), self.pool["first"], None, e, h_dec), plan.first_prompt_tokens)
        turn = lv.turn
        step = plan.turns[turn] if turn < len(plan.turns) else None
        if step is None or step.tool is None or k is EventKind.REWARD_START:
            return 0.0, 0.0, 0.0  # the last turn: reward next (new samples are counted separately)
        tool = "tool:" + step.tool
        x = plan.prompt_tokens_at(turn + 1)
        if k is EventKind.TOOL_START:
            key = ("tool", tool)
            return (self._q(key, self.pool[tool], self.pool["overhead"], e, S),
                    self._q(key, self.pool[tool], self.pool["overhead"], e, h_dec), x)
        if k is EventKind.TOOL_END:
            return (self._q(("overhead",), self.pool["overhead"], None, e, S),
                    self._q(("overhead",), self.pool["overhead"], None, e, h_dec), x)
        if k is EventKind.DECODE_END:
            key = ("decoded", tool)
            first = self._sum("hint", tool)
            return (self._q(key, first, self.pool["overhead"], e, S), self._q(key, first, self.pool["overhead"], e, h_dec), x)
        rest = self._sum("hint", tool, "overhead")
        if k is EventKind.PREFILL_END:
            key = ("decode", tool)
            return (self._q(key, self.pool["decode"], rest, e, S), self._q(key, self.pool["decode"], rest, e, h_dec), x)
        # queued or prefilling: its own prefill first (finish estimated), then a whole turn
        delay = (fin if fin is not None else now) - now
        draws = self._sum("decode", "hint", tool, "overhead")
        key = ("again", tool)
        return self._after(key, draws, S - delay), self._after(key, draws, h_dec - delay), x

    def _prefill_finishes(self, now: float) -> dict[str, float]:
        """Expected prefill end of each queued / prefilling request: FIFO per instance at mean service time."""
        free: dict[int, float] = {}
        waiting = []
        for tid, lv in self.live.items():
            x = lv.plan.prompt_tokens_at(lv.turn) if lv.turn < len(lv.plan.turns) else 0
            if lv.state is EventKind.PREFILL_START:
                end = max(now, lv.since + self._g(x))
                free[lv.instance] = max(free.get(lv.instance, now), end)
                waiting.append((tid, None, end))
            elif lv.state is EventKind.REQUEST_ARRIVED:
                waiting.append((tid, lv, lv.since))
        out = {}
        for tid, lv, t in sorted(waiting, key=lambda w: w[2]):
            if lv is None:
                out[tid] = t
                continue
            start = max(now, free.get(lv.instance, now))
            out[tid] = free[lv.instance] = start + self._g(lv.plan.prompt_tokens_at(lv.turn))
        return out

    def _remaining_to_reward_end(self, lv: _Live, now: float) -> np.ndarray | None:
        """Draws of the time until this trajectory's reward ends, if it can end within the horizon."""
        e = max(0.0, now - lv.since)
        if lv.state is EventKind.REWARD_START:
            return self._conditional("reward", e)
        last = lv.turn >= len(lv.plan.turns) - 1
        if not last:
            return None
        reward = self._rng.choice(self.pool["reward"], MC)
        if lv.state is EventKind.PREFILL_END:
            return self._conditional("decode", e) + HINT_DELAY_S + reward
        if lv.state is EventKind.DECODE_END:
            return np.maximum(HINT_DELAY_S - e, 0.0) + reward
        return None

    @staticmethod
    def _may_finish(lv: _Live) -> bool:
        return lv.state is EventKind.REWARD_START or (
            lv.turn >= len(lv.plan.turns) - 1 and lv.state in (EventKind.PREFILL_END, EventKind.DECODE_END))

    def _conditional(self, name: str, e: float) -> np.ndarray:
        pool = self._sorted[name]
        j = int(np.searchsorted(pool, e, side="right"))
        if j >= pool.size:
            return np.zeros(MC)
        return pool[self._rng.integers(j, pool.size, MC)] - e

    def _new_samples(self, now: float, h_dec: float) -> tuple[float, float]:
        """Samples not launched yet whose first request arrives within the horizon."""
        rollout, S = self.spec.rollout, self.S
        if rollout.mode == "sync":
            if self.live or self.step_ended_at is None:
                return 0.0, 0.0
            launch_at = self.step_ended_at + rollout.train_gap_s
            arr = dec = 0.0
            for i in range(self.next_index, self.next_index + rollout.concurrency):
                plan = self.gen.plan(i)
                draws = self._launch(plan.sandbox_mode)
                key = ("launch", plan.sandbox_mode)
                x = plan.first_prompt_tokens
                arr += x * self._after(key, draws, now + S - launch_at)
                dec += x * self._after(key, draws, now + h_dec - launch_at)
            return arr, dec
        policy = rollout.injection.policy
        launch = self._mixture
        if policy is InjectionPolicy.FIXED_RATE:
            rate = rollout.injection.rate_per_s
            out = []
            for h in (S, h_dec):
                n = int(round(h / self.dt))
                cdf = self._cdf(("launch", None), launch)
                out.append(rate * self.dt * float(cdf[:n].sum()) * self.x_first)
            return out[0], out[1]
        groups: dict[str, list[_Live]] = {}
        for lv in self.live.values():
            groups.setdefault(lv.plan.group_id or lv.plan.trajectory_id, []).append(lv)
        arr = dec = 0.0
        l_draws = self._rng.choice(launch, MC)
        for members in groups.values():
            if policy is InjectionPolicy.GROUP:
                if not all(self._may_finish(m) for m in members):
                    continue
                parts = [self._remaining_to_reward_end(m, now) for m in members]
                if any(p is None for p in parts):
                    continue
                done = np.max(np.vstack(parts), axis=0)
                size = rollout.injection.group_size
                arr += size * self.x_first * float(np.mean(done + l_draws < S))
                dec += size * self.x_first * float(np.mean(done + l_draws < h_dec))
            elif policy is InjectionPolicy.REPLACE_ON_REWARD:
                for m in members:
                    part = self._remaining_to_reward_end(m, now)
                    if part is None or not m.plan.accepted:
                        continue
                    arr += self.x_first * float(np.mean(part + l_draws < S))
                    dec += self.x_first * float(np.mean(part + l_draws < h_dec))
        return arr, dec
