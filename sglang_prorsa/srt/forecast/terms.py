"""Predicted prefill arrivals per source, vectorised over the tracker's columns (paper B.2, B.3, B.5; issue 10).

Each live trajectory i contributes q_i * x_i: q_i the probability that its next request joins the ready queue
within the horizon, conditioned on the time e_i it has spent in its current state (censored survival curves,
stores.py / grid.py), x_i that request's estimated full prompt length. Evaluated twice per refresh: over S (the
prefill forecast) and over the admission horizon h* (predicted arrivals whose prefill also ends within S: the
decode forecast, admissions.py).

Per state (what follows the paper and what goes beyond it):

=================  =============================================================================================
sampled            launch delay (sample -> first request), all startup modes. B.2's d_hat as a distribution.
sandbox_starting   sandbox_start -> first request, per (task, mode) -> mode: B.3 Eq. 6-7.
sandbox_ready      sandbox_ready -> first request (beyond: the first cut counted these in full).
tool               tool_start -> next request per (task, tool) -> task (replaces B.5's EMA test r_i < S, which
                   counted a tool that had outlived its mean in every window, and stopped at tool_end).
tool_done          tool_end -> next request (beyond).
decode, decoded    decode-return (beyond the one-step assumption): remaining decode, then decode_end -> next
                   request, times P(this response calls a tool | task, turn).
ready, prefill     the same chain after the request's own prefill (its predicted end from the queue model).
interrupted        abort -> resend (beyond; issue 13).
reward             the sampler (B.2): the reward's remaining time, then the replacement's launch delay; the
                   injection rule decides how many samples a completion launches (f(n) = n scaled by p_hat;
                   group replenishment: a whole group once its last member finishes; fixed rate).
(no step running)  sync launch model (beyond; steps.py).
=================  =============================================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sglang_prorsa.srt.forecast.grid import GridCurve, chain_table, sum_cdf
from sglang_prorsa.srt.forecast.sampler import InjectionPolicy
from sglang_prorsa.srt.forecast.statistics import TURN_BUCKETS, LifecycleStatistics, turn_bucket
from sglang_prorsa.srt.forecast.steps import StepModel
from sglang_prorsa.srt.forecast.stores import DurationStore, Key
from sglang_prorsa.srt.lifecycle.states import STATE_CODES, TrajState
from sglang_prorsa.srt.lifecycle.tracker import Phase, TrajectoryTracker

_TURN_LUT = np.array([turn_bucket(t) for t in range(128)], np.int64)


@dataclass
class SourceSums:
    """Raw (uncorrected) predicted arrivals of one source over S, and over h* with their KV and prefill work."""

    arrivals: float = 0.0  # tokens arriving before t + S
    admitted: float = 0.0  # tokens arriving before t + h* (admitted to decode before t + S)
    count: float = 0.0  # expected requests before t + S
    admitted_count: float = 0.0
    admitted_kv: float = 0.0  # kappa_D of the admitted tokens (set by ``finish``)
    work_s: float = 0.0  # expected prefill seconds of the arrivals before t + S: the next refresh's load (``finish``)

    def add(self, q_s: np.ndarray, q_h: np.ndarray, x: np.ndarray) -> None:
        # elementwise products, not np.dot: BLAS threads cost more than they save on a busy machine
        self.arrivals += float((q_s * x).sum())
        self.admitted += float((q_h * x).sum())
        self.count += float(q_s.sum())
        self.admitted_count += float(q_h.sum())

    def add_new(self, n_arrivals: float, n_admitted: float, x: float) -> None:
        self.arrivals += n_arrivals * x
        self.count += n_arrivals
        self.admitted += n_admitted * x
        self.admitted_count += n_admitted

    def finish(self, prefill_time, page_size: int) -> None:
        """Work and KV from the totals (fractional requests): g at the mean predicted length, and kappa_D's page
        rounding as half a page per request on average (predicted lengths are estimates anyway)."""
        self.work_s = self.count * float(prefill_time(np.array([self.arrivals / self.count]))[0]) if self.count else 0.0
        self.admitted_kv = self.admitted + self.admitted_count * (page_size - 1) / 2.0


class Snapshot:
    """The live trajectories' columns, read once per refresh and ordered by state (one stable radix sort of the
    state column; each column gathered once, when first needed), so every state is a contiguous slice: a term reads
    views, never gathers. Consecutive state codes (e.g. decoded, tool, tool_done) form one slice too."""

    COLUMNS = ("entered", "prompt", "next_prompt", "task", "tool", "turn", "group", "mode", "instance", "launched",
               "sandbox", "decoded", "tool_start")

    def __init__(self, now: float, engine_shift: float, columns, radix: dict) -> None:
        self.now = now
        self.engine_shift = engine_shift  # seconds the engine states' clocks are behind (a pause in progress)
        self.radix = radix
        self._columns = columns
        state = columns.view("state")
        self._order = np.argsort(state, kind="stable")  # int8: a linear-time radix sort
        counts = np.bincount(state.astype(np.int64) + 1, minlength=len(STATE_CODES) + 1)
        self._ends = np.cumsum(counts)  # _ends[code + 1]: slots with a state code <= code (FREE = -1 first)
        self._sorted: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str) -> "_SortedColumn":
        if name not in Snapshot.COLUMNS:
            raise AttributeError(name)
        col = self._sorted.get(name)
        if col is None:
            col = self._sorted[name] = _SortedColumn(self._columns.view(name), self._order)
        return col

    def members(self, state: TrajState) -> slice:
        return self.span(state)

    def span(self, *states: TrajState) -> slice:
        """The slice of ``states`` (consecutive state codes) in the sorted columns."""
        codes = sorted(STATE_CODES[s] for s in states)
        assert codes == list(range(codes[0], codes[-1] + 1)), "states must have consecutive codes"
        return slice(int(self._ends[codes[0]]), int(self._ends[codes[-1] + 1]))

    @staticmethod
    def count(sl: slice) -> int:
        return sl.stop - sl.start

    def elapsed(self, idx, engine: bool = False, since: np.ndarray | None = None) -> np.ndarray:
        now = self.now - self.engine_shift if engine else self.now
        return np.maximum(now - (self.entered if since is None else since)[idx], 0.0)

    def running(self, states: tuple[TrajState, ...], since: str) -> tuple["_Ids", np.ndarray]:
        """(ids, elapsed) of the members of ``states`` whose phase started at column ``since`` (-1: not in it),
        in sorted order (the members of the lowest state code first)."""
        sl = self.span(*states)
        start = getattr(self, since)[sl]
        keep = start >= 0
        return _Ids(self, sl, keep), np.maximum(self.now - start[keep], 0.0)

    def ids(self, idx, keep: np.ndarray | None = None) -> "_Ids":
        """The class columns (task, tool, mode) of the items ``idx``, gathered when a store asks for them."""
        return _Ids(self, idx, keep)


class _SortedColumn:
    """A column in state order, gathered per slice on demand (a term touches only its states' rows)."""

    def __init__(self, values: np.ndarray, order: np.ndarray) -> None:
        self._values, self._order = values, order
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def __getitem__(self, sl: slice) -> np.ndarray:
        key = (sl.start, sl.stop)
        out = self._cache.get(key)
        if out is None:
            out = self._cache[key] = self._values[self._order[sl]]
        return out


class _Ids(Mapping):
    _COLUMNS = ("task", "tool", "mode")

    def __init__(self, snap: Snapshot, sl: slice, keep: np.ndarray | None) -> None:
        self._snap, self._sl, self._keep = snap, sl, keep
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        out = self._cache.get(name)
        if out is None:
            raw = getattr(self._snap, name)[self._sl]
            out = np.maximum(raw, 0) if name == "tool" else (raw == 1) if name == "mode" else raw
            if self._keep is not None:
                out = out[self._keep]
            self._cache[name] = out
        return out

    def __iter__(self):
        return iter(self._COLUMNS)

    def __len__(self) -> int:
        return len(self._COLUMNS)


def _task_of(store: DurationStore, key: Key) -> int | None:
    """The task id in one of ``store``'s class keys (None for a class above tasks)."""
    columns = store.levels[key[0]]
    return key[1 + columns.index("task")] if "task" in columns else None


class ArrivalTerms:
    """Computes ``SourceSums`` per source for one snapshot; callers supply x_hat, g and kappa as vector functions."""

    def __init__(self, tracker: TrajectoryTracker, stats: LifecycleStatistics, steps: StepModel, config) -> None:
        self.tracker, self.stats, self.steps, self.config = tracker, stats, steps, config

    def compute(self, snap: Snapshot, horizon_s: float, admit_s: float, dt: float,
                x_new: np.ndarray, g: Callable, kv: Callable, second_arrival_delay: np.ndarray | None,
                second_arrival_idx: np.ndarray | None) -> dict[str, SourceSums]:
        self.snap, self.S, self.h, self.dt = snap, horizon_s, admit_s, dt
        self.x_new, self.g, self.kv = x_new, g, kv
        self._launch_cdf = None
        self.launches = 0.0  # sample launches decided within S (group / sync rules; diagnostics)
        self._growth = np.array([self.stats.growth(t) for t in range(snap.radix["task"])])
        self._growth_by_tool = None
        self._calls_lut = None
        st = self.stats.stores
        out = {name: SourceSums() for name in ("sampler", "sandbox", "tool", "decode_return", "resend")}
        S_ = TrajState
        # Items in a later state of the same phase are still running in it: censored, not evaluated, there.
        self._simple(out["sandbox"], S_.SAMPLED, st[Phase.LAUNCH], self._first_x,
                     snap.running((S_.SANDBOX_STARTING, S_.SANDBOX_READY), "launched"))
        # A state that is left through a reported intermediate hint (sandbox_ready, tool_end) is conditioned on its
        # own dwell and chained with the rest; conditioning the whole sandbox / tool -> request delay on the elapsed
        # time would count the mass of trajectories already past the hint (they are in the next state) twice.
        if self.stats.mostly(self.stats.sandbox_ready_reported):
            ready = self._rest_cdf(st[Phase.READY_WAIT], (S_.SANDBOX_READY,), None, st[Phase.SANDBOX])
            self._simple(out["sandbox"], S_.SANDBOX_STARTING, st[Phase.SANDBOX], self._first_x, then=ready)
        else:
            self._simple(out["sandbox"], S_.SANDBOX_STARTING, st[Phase.STARTUP], self._first_x,
                         snap.running((S_.SANDBOX_READY,), "sandbox"))
        self._simple(out["sandbox"], S_.SANDBOX_READY, st[Phase.READY_WAIT], self._first_x)
        if self.stats.mostly(self.stats.tool_end_reported):
            after = self._rest_cdf(st[Phase.POST_TOOL], (S_.TOOL_DONE,), None, st[Phase.TOOL])
            self._simple(out["tool"], S_.TOOL, st[Phase.TOOL], self._tool_x, then=after)
        else:
            self._simple(out["tool"], S_.TOOL, st[Phase.TOOL_RETURN], self._tool_x,
                         snap.running((S_.TOOL_DONE,), "tool_start"))
        self._simple(out["tool"], S_.TOOL_DONE, st[Phase.POST_TOOL], self._tool_x)
        self._decode_return(out["decode_return"], second_arrival_idx, second_arrival_delay)
        self._simple(out["resend"], TrajState.INTERRUPTED, st[Phase.RESEND], self._same_x)
        self._sampler(out["sampler"])
        for sums in out.values():
            sums.finish(g, self.config.kv_page_size)
        return out

    # ----- prompt lengths -----
    def _first_x(self, idx: np.ndarray) -> np.ndarray:
        s = self.snap
        hint = s.next_prompt[idx]
        return np.where(hint >= 0, hint, np.where(s.prompt[idx] >= 0, s.prompt[idx], self.x_new[s.task[idx]]))

    def _next_x(self, idx: np.ndarray, by_tool: bool = False) -> np.ndarray:
        s = self.snap
        hint = s.next_prompt[idx]
        if by_tool:  # in a tool: the tool's typical result size is known
            growth = self._tool_growth()[s.task[idx], np.maximum(s.tool[idx], 0)]
        else:
            growth = self._growth[s.task[idx]]
        grown = s.prompt[idx] + growth
        return np.where(hint >= 0, hint, np.where(s.prompt[idx] >= 0, grown, self.x_new[s.task[idx]]))

    def _tool_x(self, idx: np.ndarray) -> np.ndarray:
        return self._next_x(idx, by_tool=True)

    def _tool_growth(self) -> np.ndarray:
        if self._growth_by_tool is None:
            r = self.snap.radix
            self._growth_by_tool = np.array([[self.stats.growth(t, k) for k in range(r["tool"])] for t in range(r["task"])])
        return self._growth_by_tool

    def _same_x(self, idx: np.ndarray) -> np.ndarray:
        s = self.snap
        return np.where(s.prompt[idx] >= 0, s.prompt[idx], self.x_new[s.task[idx]])

    def _add(self, sums: SourceSums, q_s: np.ndarray, q_h: np.ndarray, x: np.ndarray) -> None:
        sums.add(q_s, q_h, x)

    # ----- single phase (B.3 Eq. 6 form) -----
    def _simple(self, sums: SourceSums, state: TrajState, store: DurationStore, x_of, also=None, then=None) -> None:
        idx = self.snap.members(state)
        if not Snapshot.count(idx):
            return
        q_s, q_h = store.evaluate(self.snap.ids(idx), self.snap.radix, self.snap.elapsed(idx), self.dt, (self.S, self.h),
                                  then=then, now=self.snap.now, also=also)
        self._add(sums, q_s, q_h, x_of(idx))

    def _rest_cdf(self, store: DurationStore, states: tuple[TrajState, ...], since: np.ndarray | None,
                  first: DurationStore):
        """``then(key)`` for a chain after a phase of store ``first``: the CDF of ``store``'s phase for the task of
        ``first``'s class ``key``, fitted with the trajectories of ``states`` (its running members) censored."""
        snap = self.snap
        idx = snap.span(*states)
        fitted = store.fit(snap.ids(idx), snap.radix, snap.elapsed(idx, since=since), self.dt, snap.now)
        bins = int(round(self.S / self.dt)) + 2
        cache: dict[Key, np.ndarray] = {}

        def then(key: Key) -> np.ndarray:
            if key not in cache:
                cache[key] = self._then_curve(fitted, store, _task_of(first, key)).cdf_from_start(bins)
            return cache[key]
        return then

    # ----- decode-return -----
    def _then_curve(self, fitted, store: DurationStore, task: int | None) -> GridCurve:
        """The curve of ``store`` for ``task`` (None: all tasks)."""
        if task is not None and len(store.levels) > 1:
            key = store.resolve_one({c: 0 for lv in store.levels for c in lv} | {"task": task})
        else:
            key = (len(store.levels) - 1,)
        return fitted.curve(key)

    def _calls_tool(self, idx: np.ndarray) -> np.ndarray:
        s = self.snap
        if self._calls_lut is None:  # (task, turn class) -> P(calls a tool), flattened
            radix = s.radix["task"]
            self._calls_lut = np.array([self.stats.calls_tool_in_bucket(t, b) for t in range(radix)
                                        for b in range(TURN_BUCKETS)])
        buckets = _TURN_LUT[np.minimum(s.turn[idx], 127)]
        return self._calls_lut[s.task[idx] * TURN_BUCKETS + buckets]

    def _decode_return(self, sums: SourceSums, second_idx, second_delay) -> None:
        st, snap = self.stats.stores, self.snap
        ret, dec = st[Phase.DECODE_RETURN], st[Phase.DECODE]
        bins = int(round(self.S / self.dt)) + 2
        # decode_end -> next request, fitted on everything still in it: decoded, in a tool, tool done
        decoded = snap.members(TrajState.DECODED)
        r_ids, r_elapsed = snap.running((TrajState.DECODED, TrajState.TOOL, TrajState.TOOL_DONE), "decoded")
        ret_fit = ret.fit(r_ids, snap.radix, r_elapsed, self.dt, snap.now)
        cache: dict[Key, np.ndarray] = {}

        def then(key: Key) -> np.ndarray:
            if key not in cache:
                cache[key] = self._then_curve(ret_fit, ret, _task_of(dec, key)).cdf_from_start(bins)
            return cache[key]

        # Until decodes have been timed, the prior says nothing useful about short turns: one-step assumption.
        learned = dec.classes.get((len(dec.levels) - 1,))
        if learned is None or learned.count < dec.min_samples:
            second_idx = None
        idx = self.snap.members(TrajState.DECODE) if second_idx is not None else slice(0, 0)
        if Snapshot.count(idx):
            q_s, q_h = dec.evaluate(self.snap.ids(idx), self.snap.radix, self.snap.elapsed(idx, engine=True),
                                    self.dt, (self.S, self.h), then, now=self.snap.now - self.snap.engine_shift)
            c = self._calls_tool(idx)
            self._add(sums, c * q_s, c * q_h, self._next_x(idx))
        if Snapshot.count(decoded):  # running() lists the decoded first (all of them: they have decoded >= 0)
            n = Snapshot.count(decoded)
            q_s, q_h = ret_fit.probabilities(ret_fit.res[:n], snap.elapsed(decoded), (self.S, self.h), None)
            c = self._calls_tool(decoded)
            self._add(sums, c * q_s, c * q_h, self._next_x(decoded))
        if second_idx is not None and Snapshot.count(second_idx):  # queued / prefilling: prefill, decode, tool, back
            cdf = sum_cdf([dec.curve((len(dec.levels) - 1,), self.dt), ret_fit.curve((len(ret.levels) - 1,))], bins)
            q_s = self._cdf_before(cdf, self.S - second_delay)
            q_h = self._cdf_before(cdf, self.h - second_delay)
            c = self._calls_tool(second_idx)
            self._add(sums, c * q_s, c * q_h, self._next_x(second_idx))

    def _cdf_before(self, cdf: np.ndarray, room: np.ndarray) -> np.ndarray:
        """P(duration < room) from a CDF on the grid (0 where room <= 0)."""
        k = np.ceil(np.asarray(room) / self.dt).astype(np.int64) - 1
        return np.where(k >= 0, cdf[np.clip(k, 0, cdf.size - 1)], 0.0)

    # ----- the sampler (B.2) and the sync launch model -----
    def launch_cdf(self) -> np.ndarray:
        if self._launch_cdf is None:
            store = self.stats.stores[Phase.LAUNCH]
            self._launch_cdf = store.curve((len(store.levels) - 1,), self.dt).cdf_from_start(int(round(self.S / self.dt)) + 2)
        return self._launch_cdf

    def _sampler(self, sums: SourceSums) -> None:
        policy = self.config.injection.policy
        x_new = self.stats.new_sample_prompt(None)
        if policy is InjectionPolicy.REPLACE_ON_REWARD:
            idx = self.snap.members(TrajState.REWARD)
            if Snapshot.count(idx):
                q_s, q_h = self.stats.stores[Phase.REWARD].evaluate(
                    self.snap.ids(idx), self.snap.radix, self.snap.elapsed(idx), self.dt, (self.S, self.h),
                    lambda key: self.launch_cdf(), now=self.snap.now)
                p = self.stats.acceptance.value
                self._add(sums, p * q_s, p * q_h, self.x_new[self.snap.task[idx]])
        elif policy is InjectionPolicy.FIXED_RATE:
            rate = self.config.injection.rate_per_s
            n_s, n_h = (rate * self.dt * float(self.launch_cdf()[: int(round(h / self.dt))].sum())
                        for h in (self.S, self.h))
            sums.add_new(n_s, n_h, x_new)
        elif policy is InjectionPolicy.GROUP:
            self._group(sums, x_new)
        elif policy is InjectionPolicy.SYNC:
            self._sync(sums, x_new)

    def completion_cdf(self, ids: dict, e: np.ndarray, bins: int) -> np.ndarray:
        """Rows: P(reward of trajectory i ends at or before grid point m from now), m = 0..bins-1."""
        store = self.stats.stores[Phase.REWARD]
        res, used, _ = store.resolve(ids, self.snap.radix, e.size)
        b = np.floor(e / self.dt + 1e-9).astype(np.int64)
        out = np.empty((e.size, bins))
        m = np.arange(bins)
        for j, key in enumerate(used):
            rows = np.flatnonzero(res == j)
            curve = store.curve(key, self.dt)
            last = curve.last
            ext = curve.extended(max(last, 0) + bins + 2)
            bj = b[rows]
            tail = bj >= last
            live = ~tail
            if live.any():
                base = ext[bj[live]]
                out[rows[live]] = 1.0 - ext[bj[live, None] + m[None, :]] / np.maximum(base[:, None], 1e-300)
            if tail.any():
                out[rows[tail]] = 1.0 - np.exp(-(m + 0.5) * self.dt / curve.tail_mean_s)[None, :]
        return np.clip(out, 0.0, 1.0)

    def _arrivals_after(self, done_cdf: np.ndarray, then_cdf: np.ndarray, h: float) -> float:
        """P(an event whose CDF over grid points is ``done_cdf``, then a delay with ``then_cdf``, lands before h)."""
        n = int(round(h / self.dt))
        if n <= 0:
            return 0.0
        pmf = np.diff(np.concatenate(([0.0], done_cdf[:n])))
        return float(np.dot(pmf, then_cdf[n - 1::-1][:n]))

    def _group(self, sums: SourceSums, x_new: float) -> None:
        """Group replenishment: group_size samples launch when a group's last live member leaves reward."""
        sl = self.snap.members(TrajState.REWARD)
        keep, gid = self.completable(sl)
        if not keep.any():
            return
        bins = int(round(self.S / self.dt)) + 2
        ids = self.snap.ids(sl, keep)
        cdf = self.completion_cdf(ids, self.snap.elapsed(sl)[keep], bins)
        gid = gid[keep]
        key = np.where(gid < 0, -1 - np.arange(gid.size), gid)  # ungrouped: a group of one
        order = np.argsort(key, kind="stable")
        key, cdf = key[order], cdf[order]
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        with np.errstate(divide="ignore"):
            group_cdf = np.exp(np.add.reduceat(np.log(np.maximum(cdf, 0.0)), first, axis=0))
        size = self.config.injection.group_size
        launch = self.launch_cdf()
        n_s, n_h = (size * sum(self._arrivals_after(row, launch, h) for row in group_cdf) for h in (self.S, self.h))
        sums.add_new(n_s, n_h, x_new)

    def completable(self, sl: slice) -> tuple[np.ndarray, np.ndarray]:
        """Over the trajectories in reward (slice ``sl``): which have no live group member outside reward (so their
        completion can launch a new group; B.2 excludes members in decode or tool), and their group rows (-1: none)."""
        tr = self.tracker
        gid = self.snap.group[sl].astype(np.int64)
        if not gid.size:
            return np.zeros(0, bool), gid
        live = np.asarray(tr.group_live, np.int64)
        reward = np.asarray(tr.group_reward, np.int64)
        safe = np.maximum(gid, 0)
        complete = (gid < 0) | ((live[safe] == reward[safe]) if live.size else False)
        return complete, gid

    def _sync(self, sums: SourceSums, x_new: float) -> None:
        steps, tr = self.steps, self.tracker
        n_step = steps.step_size(self.config.injection.step_size)
        if n_step <= 0:
            return
        bins = int(round(self.S / self.dt)) + 2
        launch_store = self.stats.stores[Phase.LAUNCH]
        launch_curve = launch_store.curve((len(launch_store.levels) - 1,), self.dt)
        gap = steps.gap_phase(self.snap.now)
        if gap is not None:  # between steps: the rest of the gap, then the launch delay
            store, e = gap
            curve = store.curve((0,), self.dt)
            self.launches = n_step * float(chain_table(curve, self.S).lookup(np.array([e]))[0])
            q_s, q_h = (float(chain_table(curve, h, self.launch_cdf()).lookup(np.array([e]))[0]) if h > 0 else 0.0
                        for h in (self.S, self.h))
            sums.add_new(n_step * q_s, n_step * q_h, x_new)
            return
        idx = self.snap.members(TrajState.REWARD)
        n = Snapshot.count(idx)
        if not n or tr.live_count != n:
            return  # some trajectory of the step is still working: the step cannot end (one-step assumption)
        done = np.prod(self.completion_cdf(self.snap.ids(idx), self.snap.elapsed(idx), bins), axis=0)
        then = sum_cdf([steps.gap.curve((0,), self.dt), launch_curve], bins)
        sums.add_new(*(n_step * self._arrivals_after(done, then, h) for h in (self.S, self.h)), x_new)
