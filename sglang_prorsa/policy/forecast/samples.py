"""Arrivals of samples not launched yet: the data sampler (paper B.2) and the sync launch model (steps.py).

B.2 forecasts the launches that reward completions trigger through the injection rule f, with a prewarmed launch
delay d_hat and the shortened horizon S_pw = S - d_hat. Here the launch delay is a distribution (sample -> first
request, cold starts included) chained after each trajectory's remaining reward time, so a replacement counts with
the probability that it arrives before t + S (beyond the paper: no point estimate, no separate S_pw):

* replace-on-reward: p_hat * sum_i P(R_i - e_i + L < S | R_i > e_i)                         (Eq. 2-5 as one chain)
* group replenishment: group_size * P(the group's last member ends, then L < S), the members' completion CDFs
  multiplied (independent completions; only groups with every live member in reward, as in B.2)
* fixed rate: rate * E[(S - L)+]
* sync (steps.py): the step's batch launches at one instant T (the rest of the training gap, or, when every live
  trajectory is in reward, the step's end -- product of completion CDFs -- followed by the gap), then each sample's
  first request follows after its own L: N_step * F_L(S - T_med).

Beyond the paper, on the sync batch: its N_step samples launch together, so their arrivals are one correlated event,
not N_step independent ones. The expectation N_step * P(T + L < S) would put a fraction of the batch into every
window of an uncertain gap and be wrong in each of them (and wrong again in the window the batch lands in). Given T,
the batch's share inside the window is F_L(S - T), a decreasing function of T, so the median of that share -- the
best point forecast under absolute error (WAPE) -- is F_L(S - T_med), T_med the median launch time. Once the gap is
learned (a trainer's gaps vary little) the two agree; they differ while the gap is uncertain, e.g. before the first
gap has been seen, when the median forecasts no launch until one is more likely than not within S (a weights update
inside the gap shortens the rest to the update -> launch delay).
"""

from __future__ import annotations

import numpy as np

from sglang_prorsa.policy.forecast.sampler import InjectionPolicy
from sglang_prorsa.policy.forecast.snapshot import Snapshot, SourceSums
from sglang_prorsa.policy.lifecycle.states import TrajState
from sglang_prorsa.policy.lifecycle.tracker import Phase


class NewSamples:
    """The sampler's part of a refresh; reads the refresh's snapshot and horizons from ``terms`` (ArrivalTerms)."""

    def __init__(self, terms) -> None:
        self.terms = terms
        self.launches = 0.0  # sample launches decided within S (group / sync rules; diagnostics)
        self._launch_cdf: np.ndarray | None = None

    def reset(self) -> None:
        self.launches = 0.0
        self._launch_cdf = None

    def __getattr__(self, name: str):  # snap, S, h, dt, stats, steps, config, tracker, x_new: the refresh's
        return getattr(self.terms, name)

    def launch_cdf(self) -> np.ndarray:
        cdf = self._launch_cdf
        if cdf is None:
            store = self.stats.stores[Phase.LAUNCH]
            cdf = self._launch_cdf = store.curve((len(store.levels) - 1,), self.dt).cdf_from_start(
                int(round(self.S / self.dt)) + 2)
        return cdf

    def add(self, sums: SourceSums) -> None:
        policy = self.config.injection.policy
        x_new = self.stats.new_sample_prompt(None)
        if policy is InjectionPolicy.REPLACE_ON_REWARD:
            idx = self.snap.members(TrajState.REWARD)
            if Snapshot.count(idx):
                fitted = self.terms.fitted(self.stats.stores[Phase.REWARD], idx)
                self.terms._expect(sums, fitted, None, self.snap.elapsed(idx), lambda key: self.launch_cdf(),
                                   self.x_new[self.snap.task[idx]], self.stats.acceptance.value)
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
        out = np.empty((e.size, bins))
        for j, key in enumerate(used):
            rows = np.flatnonzero(res == j)
            out[rows] = self.residual_cdf(store.curve(key, self.dt), e[rows], bins)
        return out

    def residual_cdf(self, curve, e: np.ndarray, bins: int) -> np.ndarray:
        """Rows: P(a duration following ``curve`` ends at or before grid point m from now | e_i already spent)."""
        b = np.floor(e / self.dt + 1e-9).astype(np.int64)
        m = np.arange(bins)
        out = np.empty((e.size, bins))
        last = curve.last
        ext = curve.extended(max(last, 0) + bins + 2)
        tail = b >= last
        live = ~tail
        if live.any():
            base = ext[b[live]]
            out[live] = 1.0 - ext[b[live, None] + m[None, :]] / np.maximum(base[:, None], 1e-300)
        if tail.any():
            out[tail] = 1.0 - np.exp(-(m + 0.5) * self.dt / curve.tail_mean_s)[None, :]
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
        gap = steps.gap_phase(self.snap.now)
        if gap is not None:  # between steps: the launch is the rest of the gap
            store, e = gap
            launch_at = self.residual_cdf(store.curve((0,), self.dt), np.array([e]), bins)[0]
        else:
            idx = self.snap.members(TrajState.REWARD)
            n = Snapshot.count(idx)
            if not n or tr.live_count != n:
                return  # some trajectory of the step is still working: the step cannot end (one-step assumption)
            done = np.prod(self.completion_cdf(self.snap.ids(idx), self.snap.elapsed(idx), bins), axis=0)
            gap_cdf = steps.gap.curve((0,), self.dt).cdf_from_start(bins)
            launch_at = np.convolve(np.diff(np.concatenate(([0.0], done))), gap_cdf)[:bins]  # the step's end + G
        median = np.flatnonzero(launch_at >= 0.5)  # T_med: the first grid point the launch is more likely than not by
        if not median.size:
            return  # no launch is likelier than not within S: the median of the batch's share is 0
        k = int(median[0])
        self.launches = float(n_step)
        launch = self.launch_cdf()
        ends = (int(round(h / self.dt)) for h in (self.S, self.h))
        n_arrivals, n_admitted = (n_step * (float(launch[n - 1 - k]) if n > k else 0.0) for n in ends)
        sums.add_new(n_arrivals, n_admitted, x_new)
