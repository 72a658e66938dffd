"""Predicted prefill arrivals per source, vectorised over the tracker's columns (paper B.2, B.3, B.5; issue 10).

Each live trajectory i contributes q_i * x_i: q_i the probability that its next request joins the ready queue
within the horizon, conditioned on the time e_i it has spent in its current state (censored survival curves,
stores.py / grid.py), x_i that request's estimated full prompt length. Evaluated twice per refresh: over S (the
prefill forecast) and over the admission horizon h* (predicted arrivals whose prefill also ends within S: the
decode forecast, admissions.py). x_i: the trainer's estimate if it sent one, else the last prompt plus the mean
growth per turn (per task and tool when the tool is known), else a new sample's mean first prompt.

Per state (what follows the paper and what goes beyond it):

=================  =============================================================================================
sampled            launch delay (sample -> first request), all startup modes. B.2's d_hat as a distribution.
sandbox_starting   B.3 Eq. 6-7, per (task, mode) -> mode: sandbox_start -> first request; when the trainer reports
                   sandbox_ready, the startup (start -> ready) conditioned, then ready -> first request.
sandbox_ready      sandbox_ready -> first request (beyond: the first cut counted these in full).
tool               per (task, tool) -> task -> all: tool_start -> next request; when the trainer reports tool_end,
                   the tool (start -> end, B.5's tau as a distribution) conditioned, then end -> next request.
                   Replaces B.5's EMA test r_i < S, which counted a tool that had outlived its mean in every window.
tool_done          tool_end -> next request (beyond).
decode, decoded    decode-return (beyond the one-step assumption): remaining decode, then decode_end -> next
                   request, times P(this response calls a tool | task, turn). When the trainer reports tool_start,
                   a decoded response is conditioned on its own dwell (decode_end -> tool_start), then the tool.
ready, prefill     the same chain after the request's own prefill (its predicted end from the queue model).
interrupted        abort -> resend (beyond; issue 13).
reward             the sampler (B.2) and the sync launch model: samples.py.
=================  =============================================================================================
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sglang_prorsa.policy.forecast.grid import GridCurve, sum_cdf
from sglang_prorsa.policy.forecast.samples import NewSamples
from sglang_prorsa.policy.forecast.snapshot import Snapshot, SourceSums
from sglang_prorsa.policy.forecast.statistics import TURN_BUCKETS, LifecycleStatistics, turn_bucket
from sglang_prorsa.policy.forecast.steps import StepModel
from sglang_prorsa.policy.forecast.stores import DurationStore, Fitted, Key
from sglang_prorsa.policy.lifecycle.states import TrajState
from sglang_prorsa.policy.lifecycle.tracker import Phase, TrajectoryTracker

_TURNS = 128  # turns told apart by the tool-call table; bucket of 127 = bucket of any later turn
_TURN_COLUMNS = 4096  # a refresh's table is as wide as its items' turns, up to this; later turns are clipped to 127
_TURN_LUT = np.array([turn_bucket(t) for t in range(_TURN_COLUMNS)], np.int64)


def _task_of(store: DurationStore, key: Key) -> int | None:
    """The task id in one of ``store``'s class keys (None for a class above tasks)."""
    columns = store.levels[key[0]]
    return key[1 + columns.index("task")] if "task" in columns else None


class ArrivalTerms:
    """Computes ``SourceSums`` per source for one snapshot; callers supply x_hat, g and kappa as vector functions."""

    def __init__(self, tracker: TrajectoryTracker, stats: LifecycleStatistics, steps: StepModel, config) -> None:
        self.tracker, self.stats, self.steps, self.config = tracker, stats, steps, config
        self.samples = NewSamples(self)

    @property
    def launches(self) -> float:
        return self.samples.launches

    def completable(self, sl: slice):
        return self.samples.completable(sl)

    def compute(self, snap: Snapshot, horizon_s: float, admit_s: float, dt: float,
                x_new: np.ndarray, g: Callable[[np.ndarray], np.ndarray], kv: Callable[[np.ndarray], np.ndarray],
                second_arrival_delay: np.ndarray | None, second_arrival_idx: slice | None) -> dict[str, SourceSums]:
        self.snap, self.S, self.h, self.dt = snap, horizon_s, admit_s, dt
        self.x_new, self.g, self.kv = x_new, g, kv
        self.samples.reset()
        self._fits: dict[tuple[str, int, int], Fitted] = {}
        self._growth = np.array([self.stats.growth(t) for t in range(snap.radix["task"])])
        self._growth_by_tool: np.ndarray | None = None
        self._calls_lut: np.ndarray | None = None
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
        self.samples.add(out["sampler"])
        for sums in out.values():
            sums.finish(g, self.config.kv_page_size)
        return out

    # ----- prompt lengths -----
    def _first_x(self, idx: slice) -> np.ndarray:
        s = self.snap
        x = np.where(s.prompt[idx] >= 0, s.prompt[idx], self.x_new[s.task[idx]])
        if not s.hinted:
            return x
        hint = s.next_prompt[idx]
        return np.where(hint >= 0, hint, x)

    def _next_x(self, idx: slice, by_tool: bool = False) -> np.ndarray:
        s = self.snap
        task = s.task[idx]
        if by_tool:  # in a tool: the tool's typical result size is known
            out = self._tool_growth()[task, np.maximum(s.tool[idx], 0)]
        else:
            out = self._growth.take(task)
        prompt = s.prompt[idx]
        out += prompt  # prompt + growth, into the gathered array
        if prompt.size and prompt.min() < 0:  # a min pass: no mask unless some request was not seen yet
            unknown = prompt < 0  # no request seen yet: a new sample's first prompt
            out[unknown] = self.x_new[task[unknown]]
        if s.hinted:  # the trainer's estimate
            hint = s.next_prompt[idx]
            hinted = hint >= 0
            if hinted.any():
                out[hinted] = hint[hinted]
        return out

    def _tool_x(self, idx: slice) -> np.ndarray:
        return self._next_x(idx, by_tool=True)

    def _tool_growth(self) -> np.ndarray:
        table = self._growth_by_tool
        if table is None:
            r = self.snap.radix
            table = self._growth_by_tool = np.array([[self.stats.growth(t, k) for k in range(r["tool"])]
                                                     for t in range(r["task"])])
        return table

    def _same_x(self, idx: slice) -> np.ndarray:
        s = self.snap
        return np.where(s.prompt[idx] >= 0, s.prompt[idx], self.x_new[s.task[idx]])

    def _add(self, sums: SourceSums, q_s: np.ndarray, q_h: np.ndarray, x: np.ndarray) -> None:
        sums.add(q_s, q_h, x)

    def fitted(self, store: DurationStore, sl: slice):
        """``store`` fitted on the items of slice ``sl`` of this refresh's snapshot, each censored at its elapsed time
        in its state; computed once per refresh (the reward and post-tool fits serve two terms each)."""
        key = (store.name, sl.start, sl.stop)
        fitted = self._fits.get(key)
        if fitted is None:
            snap = self.snap
            fitted = self._fits[key] = store.fit(snap.ids(sl), snap.radix, snap.elapsed(sl), self.dt, snap.now)
        return fitted

    # ----- single phase (B.3 Eq. 6 form) -----
    def _simple(self, sums: SourceSums, state: TrajState, store: DurationStore, x_of, also=None, then=None) -> None:
        idx = self.snap.members(state)
        if not Snapshot.count(idx):
            return
        if also is None or not also[1].size:
            fitted, res = self.fitted(store, idx), None
        else:  # the items of the later states are censored observations only: fitted with them, not evaluated
            own = self.snap.ids(idx)
            ids = {c: np.concatenate((own[c], also[0][c])) for c in store.levels[0]}
            elapsed = np.concatenate((self.snap.elapsed(idx), also[1]))
            fitted = store.fit(ids, self.snap.radix, elapsed, self.dt, self.snap.now)
            res = fitted.res[: Snapshot.count(idx)]
        self._expect(sums, fitted, res, self.snap.elapsed(idx), then, x_of(idx))

    def _expect(self, sums: SourceSums, fitted, res, elapsed: np.ndarray, then, x: np.ndarray,
                scale: np.ndarray | float | None = None) -> None:
        """Add sum_i s_i q_i x_i and sum_i s_i q_i over S and h* (s: ``scale``, per item or one number; ``res``: the
        items' classes in ``fitted``, None for the fit's own items)."""
        if isinstance(scale, np.ndarray):
            tokens, requests = fitted.expected(res, elapsed, (self.S, self.h), then, (x, None), scale=scale)
        else:
            tokens, requests = fitted.expected(res, elapsed, (self.S, self.h), then, (x, None))
            if scale is not None:
                tokens, requests = [scale * v for v in tokens], [scale * v for v in requests]
        sums.add_expected(tokens, requests)

    def _rest_cdf(self, store: DurationStore, states: tuple[TrajState, ...], since: str | None,
                  first: DurationStore):
        """``then(key)`` for a chain after a phase of store ``first``: the CDF of ``store``'s phase for the task of
        ``first``'s class ``key``, fitted with the trajectories of ``states`` (its running members) censored at their
        time in their state (``since``: at their time since that column's instant, ``Snapshot.running``)."""
        snap = self.snap
        if since is None:
            fitted = self.fitted(store, snap.span(*states))
        else:
            ids, elapsed = snap.running(states, since)
            fitted = store.fit(ids, snap.radix, elapsed, self.dt, snap.now)
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

    def _calls_tool(self, idx: slice) -> np.ndarray:
        """P(the response calls a tool | task, turn) per item: one gather from a (task, turn) table as wide as the
        items' turns reach (every turn its own column, up to ``_TURN_COLUMNS``: no clipping pass)."""
        s = self.snap
        calls_lut = self._calls_lut
        if calls_lut is None:  # (task, bucket) -> P(calls a tool)
            calls_lut = self._calls_lut = np.array([[self.stats.calls_tool_in_bucket(t, b) for b in range(TURN_BUCKETS)]
                                                    for t in range(s.radix["task"])]).reshape(-1, TURN_BUCKETS)
        turn = s.turn[idx]  # int32
        if not turn.size:
            return np.zeros(0)
        lo, hi = int(turn.min()), int(turn.max())
        if 0 <= lo and hi < _TURN_COLUMNS:  # (task, turn 0..hi) flattened
            width = hi + 1
            code = np.multiply(s.task[idx], width)
            code += turn
            return calls_lut[:, _TURN_LUT[:width]].ravel().take(code)
        code = np.minimum(turn, _TURNS - 1).astype(np.int64)  # later turns share 127's (bucket 12 from turn 64)
        code += s.task[idx] * _TURNS
        return calls_lut[:, _TURN_LUT[:_TURNS]].ravel().take(code)

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

        # Until a decode has been timed the prior says nothing useful about short turns: one-step assumption.
        learned = dec.classes.get((len(dec.levels) - 1,))
        if learned is None or not learned.count:
            second_idx = None
        idx = self.snap.members(TrajState.DECODE) if second_idx is not None else slice(0, 0)
        if Snapshot.count(idx):
            elapsed = self.snap.elapsed(idx, engine=True)
            fitted = dec.fit(self.snap.ids(idx), self.snap.radix, elapsed, self.dt,
                             self.snap.now - self.snap.engine_shift)
            self._expect(sums, fitted, None, elapsed, then, self._next_x(idx), self._calls_tool(idx))
        if Snapshot.count(decoded) and self.stats.mostly(self.stats.tool_start_reported):
            # The trainer reports tool_start: a response still in DECODED has not handed off to a tool yet. Its own
            # dwell (decode_end -> tool_start, HANDOFF) is conditioned and chained with tool_start -> request; the
            # whole decode -> request delay conditioned on the elapsed time would count an episode that ended
            # without a reward hint (it stays DECODED for good) like a turn still on its way through a tool.
            rest = self._rest_cdf(st[Phase.TOOL_RETURN], (TrajState.TOOL, TrajState.TOOL_DONE), "tool_start",
                                  st[Phase.HANDOFF])
            self._expect(sums, self.fitted(st[Phase.HANDOFF], decoded), None, snap.elapsed(decoded), rest,
                         self._next_x(decoded), self._calls_tool(decoded))
        elif Snapshot.count(decoded):  # running() lists the decoded first (all of them: they have decoded >= 0)
            n = Snapshot.count(decoded)
            self._expect(sums, ret_fit, ret_fit.res[:n], snap.elapsed(decoded), None, self._next_x(decoded),
                         self._calls_tool(decoded))
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
