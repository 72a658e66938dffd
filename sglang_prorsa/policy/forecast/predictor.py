"""The short-horizon workload predictor (paper §4.1.2, Appendix B; rebuilt for issue 10).

``WorkloadPredictor.forecast(now)`` reads the tracker's columns and returns, for [t, t + S):

    W_P = predicted arrivals + W_ready + W_inflight                                        (Eq. 15; Eq. 8, 12)
    A_D, K_D = observed requests through the per-instance recurrence (Eq. 13-14)
             + predicted arrivals over the admission horizon h* (admissions.py)

Predicted arrivals are sum_i q_i * x_i over every live trajectory (terms.py, samples.py): the paper's sampler (B.2)
and sandbox (B.3) terms with censored survival curves conditioned on elapsed time, and, beyond the paper, every
other state (tool -> next request replacing the tool EMA test of B.5, decode-return, resend after an abort, the
sync-mode next step). The ready queue and in-flight prefills are observed backlog, counted in full (B.4, B.6).

The bias correction (B.8) is per source and touches only predicted parts: the backlog and the observed admissions
stay as measured. Each source's factor is used only while it has beaten no correction over the recent windows,
windows with a step boundary or a pause do not update it (bias.py, steps.py).

What is served (beyond the paper, combiner.py): the predicted arrivals and A_D above are the ``lifecycle`` member of
a per-quantity combination with persistence and a local level Kalman filter of the realised window series, weighted
by their recent accuracy. ``Forecast``'s allocation-facing fields carry the served values: W_P = backlog + served
arrivals, A_D served, and K_D scaled by served / lifecycle A_D (kappa_D per admitted token as the lifecycle forecast
has it); ``Forecast.lifecycle`` keeps the lifecycle-only values. Windows forecast while a sync-mode step launch is
expected (no step running) or under way but not yet seen (no closed window has had an arrival since the step's first
sample) form a second regime with combiners of their own: the steady window series cannot see a launch coming, so
launches are scored only against launches. The lifecycle forecast is served at the first launches unless the steady
windows have trimmed it (a lifecycle forecast that misses steady windows by far -- no reward hints, say -- was seen
to forecast a launch 40x too large); once launches have been compared, the member that forecast them best (without
reward hints the lifecycle one cannot see a step end coming, and the Kalman filter of the launch windows learns their
usual size). A third regime, the surge (``surging``), holds windows forecast while first prompts already announced
by sandbox starts exceed SURGE_FACTOR times the series' level: the lifecycle forecast is served at the first surges,
then the member that forecast surges best. A fourth, the rebound, holds the window after one whose realised value
``jumped`` (a sync step's first prompts after a gap): persistence repeats the jump there by construction, and one
such error outweighed dozens of steady windows in the steady ranking and guard.

``refresh(now)`` is the every-S step: it closes the accuracy window that just ended (scores it against the forecast
and against persistence), updates the corrections from its per-source residuals, scores the members of the regime
the window was forecast in (a launch window unless paused, the others only when no pause or step boundary touched
them) and moves that regime's Kalman filters on, then opens the next window with
the new forecast. The refresh is vectorised (snapshot.py): the live trajectories sorted by state once, a few dozen numpy
passes over them (O(live)), small tables per duration class; no Python loop over trajectories.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TypedDict

import numpy as np

from sglang_prorsa.policy.forecast.accuracy import ARRIVAL_SOURCES, AccuracyTracker, BaselineSummary, WapeSummary
from sglang_prorsa.policy.forecast.admissions import admission_horizon, observed_admissions
from sglang_prorsa.policy.forecast.bias import SourceBiases
from sglang_prorsa.policy.forecast.combiner import (
    COMBINATION,
    LIFECYCLE,
    PERSISTENCE,
    ForecastCombiner,
    ServedValue,
    lifecycle_served,
    served_json,
)
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.forecast.grid import grid_step
from sglang_prorsa.policy.forecast.profile import KVFootprint
from sglang_prorsa.policy.forecast.sampler import InjectionPolicy, SamplerForecast
from sglang_prorsa.policy.forecast.statistics import LifecycleStatistics
from sglang_prorsa.policy.forecast.steps import StepModel
from sglang_prorsa.policy.forecast.terms import ArrivalTerms, Snapshot
from sglang_prorsa.policy.lifecycle.states import TrajState
from sglang_prorsa.policy.lifecycle.tracker import Phase, TrajectoryTracker

STEADY, LAUNCH, SURGE, REBOUND = "steady", "launch", "surge", "rebound"  # a forecast window's regimes (combiners each)
SURGE_FACTOR = 3.0  # announced first prompts over the series' level that make a surge (as DISAGREEMENT_FACTOR: far off noise)


@dataclass(frozen=True)
class SourceBreakdown:
    """Raw (uncorrected) prefill-token contribution per source, in the first cut's five groups. ``tool`` counts every
    trajectory expected back from a tool: in a tool, decoding towards one (decode-return) or resending after an
    abort; ``Forecast.arrivals`` splits it."""

    sampler: float
    sandbox: float
    ready: float
    tool: float
    inflight: float

    @property
    def predicted_arrivals(self) -> float:
        return self.sampler + self.sandbox + self.tool

    @property
    def backlog(self) -> float:
        return self.ready + self.inflight


@dataclass(frozen=True)
class LifecycleOnly:
    """The lifecycle forecast before the combination (Appendix B with the bias correction)."""

    prefill_tokens: float  # backlog + bias-corrected predicted arrivals
    prefill_arrival_tokens: float
    decode_admission_tokens: float  # observed + bias-corrected predicted
    decode_kv_tokens: float


@dataclass(frozen=True)
class Forecast:
    t: float
    horizon_s: float
    prefill_tokens: float  # W_P: backlog + served predicted arrivals
    prefill_arrival_tokens: float  # served predicted arrivals only (combiner.py)
    decode_admission_tokens: float  # A_D served
    decode_kv_tokens: float  # K_D: the lifecycle K_D scaled by served / lifecycle A_D
    decode_kv_current_tokens: float  # K_D_t: kappa_D(prompt + generated so far) of requests in decode
    sources: SourceBreakdown
    raw_decode_admission_tokens: float
    bias_prefill: float  # effective factor on the predicted arrivals (corrected / raw)
    bias_decode: float
    p_hat: float
    launch_delay_s: float
    sampler: SamplerForecast
    wape: WapeSummary
    live_trajectories: int
    rejected_events: int
    states: dict[str, int]
    paused: bool = False  # generation is paused: hold decisions (the engine states are frozen, not idle)
    arrivals: dict = field(default_factory=dict)  # per source: raw, factor, tokens, admitted
    baseline: BaselineSummary | None = None
    admission_horizon_s: float = 0.0
    decode_observed_tokens: float = 0.0  # the part of the lifecycle A_D from requests queued or in prefill at t
    weight_version: str | None = None
    lifecycle: LifecycleOnly | None = None
    served_prefill: ServedValue | None = None  # the combiner's report: member served, every member's forecast
    served_decode: ServedValue | None = None
    regime: str = STEADY  # STEADY | LAUNCH | SURGE: whose combiners served this forecast

    def to_dict(self) -> dict:
        life_admitted = self.decode_admission_tokens if self.lifecycle is None else self.lifecycle.decode_admission_tokens
        served = served_json(self.served_prefill or lifecycle_served(self.prefill_arrival_tokens),
                             self.served_decode or lifecycle_served(self.decode_admission_tokens), self.regime)
        return {
            "t": self.t,
            "horizon_s": self.horizon_s,
            "prefill_tokens": self.prefill_tokens,
            "prefill_arrival_tokens": self.prefill_arrival_tokens,
            "decode_admission_tokens": self.decode_admission_tokens,
            "decode_kv_tokens": self.decode_kv_tokens,
            "decode_kv_current_tokens": self.decode_kv_current_tokens,
            "sources": asdict(self.sources),
            "raw": {
                "prefill_arrival_tokens": self.sources.predicted_arrivals,
                "decode_admission_tokens": self.raw_decode_admission_tokens,
            },
            "bias": {"prefill": self.bias_prefill, "decode": self.bias_decode},
            "sampler": asdict(self.sampler) | {"p_hat": self.p_hat, "launch_delay_s": self.launch_delay_s},
            "wape": self.wape.to_dict(),
            "live_trajectories": self.live_trajectories,
            "rejected_events": self.rejected_events,
            "states": self.states,
            "paused": self.paused,
            "arrivals": self.arrivals,
            "decode": {"observed_tokens": self.decode_observed_tokens,  # the lifecycle A_D's split
                       "predicted_tokens": life_admitted - self.decode_observed_tokens,
                       "admission_horizon_s": self.admission_horizon_s},
            "baseline": self.baseline.to_dict() if self.baseline is not None else None,
            "weight_version": self.weight_version,
        } | served


def _scaled_kv(life: LifecycleOnly, admitted: float) -> float:
    """K_D for a served A_D: the lifecycle forecast's KV slots per admitted token (kappa_D's page rounding), 1 when it
    admits nothing; exactly the lifecycle K_D when the lifecycle A_D is served."""
    if admitted == life.decode_admission_tokens:
        return life.decode_kv_tokens
    if life.decode_admission_tokens > 0:
        return admitted * (life.decode_kv_tokens / life.decode_admission_tokens)
    return admitted


def surging(announced: float, persisted: float | None, level: float | None) -> bool:
    """Whether first prompts already announced (trajectories whose sandbox is starting, B.3's term, bias-corrected)
    exceed ``SURGE_FACTOR`` times the larger of the last window's realised arrivals and the steady Kalman level: new
    work the window series cannot have seen. Beyond the paper: a steady load's sandbox starts are part of the series
    (a fraction of it), so only a jump in them makes a surge; from an idle series any announced prompt does."""
    if not (math.isfinite(announced) and announced > 0.0):
        return False
    return announced > SURGE_FACTOR * _series_level(persisted, level)


def _series_level(previous: float | None, level: float | None) -> float:
    """The base a surge or a jump is measured against: the larger of the last window's value and the Kalman level."""
    return max((v for v in (previous, level) if v is not None and math.isfinite(v)), default=0.0)


def jumped(realised: float, previous: float | None, level: float | None) -> bool:
    """Whether a closed window's realised value exceeds ``SURGE_FACTOR`` times the larger of the window before it and
    the steady Kalman level before it (the base ``surging`` uses): a sync step's first prompts after a gap, a burst.
    Persistence missed it and repeats it in the next window by construction, which is therefore a rebound. The level
    keeps a trickle after an empty window (a step's last stragglers) from counting; a first window is no jump."""
    if previous is None or not math.isfinite(realised):
        return False
    return realised > SURGE_FACTOR * _series_level(previous, level)


def _member_forecasts(served: ServedValue | None) -> dict[str, float | None]:
    if served is None:
        return {}
    return {**{m: r.forecast for m, r in served.members.items()}, COMBINATION: served.combination}


class _BiasSettings(TypedDict):  # SourceBiases' settings after its sources
    beta: float
    lo: float
    hi: float
    gate_windows: int
    min_windows: int
    margin: float


class WorkloadPredictor:
    def __init__(self, tracker: TrajectoryTracker, config: PredictorConfig | None = None) -> None:
        self.tracker = tracker
        self.config = config or PredictorConfig()
        self.stats = LifecycleStatistics(self.config, tracker)
        self.accuracy = AccuracyTracker(self.config.recent_windows)
        self.steps = StepModel(self.config.train_gap_prior_s)
        for observer in (self.stats, self.accuracy, self.steps):
            tracker.add_observer(observer)
        self.terms = ArrivalTerms(tracker, self.stats, self.steps, self.config)
        self.latest: Forecast | None = None
        self.next_refresh_at: float | None = None
        self._load = 0.0  # rho: predicted prefill work per second of pooled capacity, from the last forecast
        self._typical_x = 0.0  # mean prompt length of the last forecast's predicted arrivals
        self._factors_at_open: tuple[dict, dict, dict, dict] | None = None
        self._last_factors: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})
        self._members_at_open: tuple[dict, dict] | None = None  # each member's forecasts for the open window
        self._regime_at_open = STEADY  # the regime the open window was forecast in: its members are scored there
        self._rebound = False  # the last closed window jumped (``jumped``): the next one is forecast as a rebound
        self._step_seen: float | None = None  # start of the last sync step whose arrivals a closed window has seen
        self._combiner_settings: tuple | None = None
        self._apply_config(self.config)

    def _apply_config(self, config: PredictorConfig) -> None:
        self.config = config
        self.stats.config = config
        self.terms.config = config
        self.steps.active = config.injection.policy is InjectionPolicy.SYNC
        self._kv = KVFootprint(config.kv_page_size)
        lo, hi = config.bias_bounds
        kw = _BiasSettings(beta=config.bias_beta, lo=lo, hi=hi, gate_windows=config.bias_gate_windows,
                           min_windows=config.bias_gate_min_windows, margin=config.bias_gate_margin)
        self.bias_prefill = SourceBiases(ARRIVAL_SOURCES, **kw)
        self.bias_decode = SourceBiases(ARRIVAL_SOURCES, **kw)
        settings = (config.horizon_s, config.combiner_members, config.combiner_half_life_windows,
                    config.combiner_selection_margin, config.combiner_noise_half_life_windows)
        if settings != self._combiner_settings:  # the members' records hold for the same S and settings only
            self._combiner_settings = settings
            make = lambda prior: ForecastCombiner(  # noqa: E731
                config.combiner_half_life_windows, config.combiner_selection_margin, config.combiner_members,
                config.combiner_noise_half_life_windows, prior=prior, robust=prior == PERSISTENCE)
            # Three regimes, each scored on its own windows: steady windows, windows forecast as a sync step's
            # launch, and windows forecast while announced first prompts surge (sandboxes starting). In the last
            # two the lifecycle forecast is served first, then whichever member has forecast that regime best
            # (without reward hints the lifecycle one cannot see a step end coming).
            self.combine_prefill, self.combine_decode = make(PERSISTENCE), make(PERSISTENCE)
            self.launch_prefill, self.launch_decode = make(LIFECYCLE), make(LIFECYCLE)
            self.surge_prefill, self.surge_decode = make(LIFECYCLE), make(LIFECYCLE)
            self.rebound_prefill, self.rebound_decode = make(LIFECYCLE), make(LIFECYCLE)

    def reconfigure(self, config: PredictorConfig) -> None:
        """New trainer settings: learned statistics stay; the open window closes unscored and the bias restarts
        (residuals measured under the old horizon / policy say nothing about the new one)."""
        self.accuracy.discard()
        self._apply_config(config)
        self.next_refresh_at = None
        self._factors_at_open = None
        self._members_at_open, self._regime_at_open, self._rebound = None, STEADY, False

    # ----- refresh every S (B.8) -----
    def refresh(self, now: float) -> Forecast:
        window = self.accuracy.open_window
        boundary = window is not None and self.steps.boundary_in(window["start"], now)
        record = self.accuracy.close(boundary=boundary)
        if record is not None and self.config.bias_enabled and not record.boundary and self._factors_at_open:
            cand_p, gated_p, cand_d, gated_d = self._factors_at_open
            self.bias_prefill.observe(record.raw_sources, record.realised_sources, cand_p, gated_p)
            self.bias_decode.observe(record.raw_decode_sources, record.realised_decode_sources, cand_d, gated_d)
        if record is not None:  # measured against the steady level before this window moves it on
            self._rebound = (
                jumped(record.realised_arrivals, record.persistence_arrivals, self.combine_prefill.kalman.forecast)
                or jumped(record.realised_decode, record.persistence_decode, self.combine_decode.kalman.forecast))
        steps = self.steps
        if record is not None and record.realised_arrivals > 0 and steps.step_open:
            self._step_seen = steps.step_started_at  # sync: nothing arrives between steps, so these are this step's
        if record is not None and self._members_at_open:
            at_open_prefill, at_open_decode = self._members_at_open
            regime = self._regime_at_open
            # a launch window is scored among launches unless paused, the others unless a pause or a step boundary
            # touched them (``boundary`` includes a pause)
            if (not record.paused) if regime == LAUNCH else (not record.boundary):
                prefill_combiner, decode_combiner = self._combiners(regime)
                prefill_combiner.observe(record.realised_arrivals, at_open_prefill)
                decode_combiner.observe(record.realised_decode, at_open_decode)
        forecast = self.forecast(now)
        self._factors_at_open = self._last_factors
        self._members_at_open = (_member_forecasts(forecast.served_prefill), _member_forecasts(forecast.served_decode))
        self._regime_at_open = forecast.regime
        life = forecast.lifecycle
        self.accuracy.open(
            now,
            now + forecast.horizon_s,
            forecast_arrivals=forecast.prefill_arrival_tokens,
            raw_arrivals=forecast.sources.predicted_arrivals,
            backlog=forecast.sources.backlog,
            forecast_decode=forecast.decode_admission_tokens,
            raw_decode=forecast.raw_decode_admission_tokens,
            lifecycle_arrivals=None if life is None else life.prefill_arrival_tokens,
            lifecycle_decode=None if life is None else life.decode_admission_tokens,
            states=self.tracker.columns.view("state"),
            paused=self.tracker.paused,
            raw_sources={s: v["raw"] for s, v in forecast.arrivals.items()},
            raw_decode_sources={s: v["admitted_raw"] for s, v in forecast.arrivals.items()},
        )
        self.latest = forecast
        self.next_refresh_at = now + forecast.horizon_s
        return forecast

    def maybe_refresh(self, now: float) -> bool:
        if self.next_refresh_at is None or now >= self.next_refresh_at:
            self.refresh(now)
            return True
        return False

    # ----- the forecast itself -----
    def _snapshot(self, now: float) -> Snapshot:
        tr = self.tracker
        shift = max(0.0, now - tr.paused_since) if tr.paused_since is not None else 0.0
        return Snapshot(now, shift, tr.columns, {"task": len(tr.tasks), "tool": len(tr.tools), "mode": 2})

    def forecast(self, now: float) -> Forecast:
        cfg, tr, st = self.config, self.tracker, self.stats
        horizon = cfg.horizon_s
        dt = grid_step(horizon)
        snap = self._snapshot(now)
        g, kv = cfg.prefill_profile.many, self._kv.many

        # observed: in-flight prefills (B.6) and the ready queue (B.4), through Eq. 13 (engine clocks: pause-aware)
        inflight, queued = snap.members(TrajState.PREFILL), snap.members(TrajState.READY)
        x_in, x_q = snap.prompt[inflight].clip(0), snap.prompt[queued].clip(0)
        inst_in, inst_q = snap.instance[inflight].astype(np.int64), snap.instance[queued].astype(np.int64)
        ids = np.concatenate((inst_in[inst_in >= 0], inst_q[inst_q >= 0]))
        known = int(np.count_nonzero(np.bincount(ids))) if ids.size else 0  # distinct ids (small ints): no sort
        pool = max(len(cfg.prefill_instances), known, 1)
        obs = observed_admissions(now, horizon, pool, x_in, g(x_in), snap.entered[inflight] + snap.engine_shift,
                                  inst_in, x_q, g(x_q), snap.entered[queued] + snap.engine_shift, inst_q, kv)
        x_new = np.array([st.new_sample_prompt(t) for t in range(snap.radix["task"])])
        # a typical predicted request's prefill time: last forecast's mean predicted prompt (returning requests carry
        # the whole context, much longer than a new sample's), else a new sample's
        typical = float(g(np.array([max(self._typical_x or float(np.mean(x_new)), 1.0)]))[0])
        admit = admission_horizon(horizon, obs.backlog_s, self._load, typical)
        admit = math.floor(admit / dt + 1e-9) * dt

        # predicted arrivals per source, over S and over h*; the ready queue precedes prefill in the sorted columns
        again = snap.span(TrajState.READY, TrajState.PREFILL)
        again_delay = np.concatenate((obs.finish_at, obs.inflight_finish_at)) - now
        sums = self.terms.compute(snap, horizon, admit, dt, x_new, g, kv, again_delay, again)
        self._load = sum(s.work_s for s in sums.values()) / (pool * horizon)
        count = sum(s.count for s in sums.values())
        self._typical_x = sum(s.arrivals for s in sums.values()) / count if count > 0 else 0.0

        on = cfg.bias_enabled
        cand_p, gated_p = self.bias_prefill.candidates(), self.bias_prefill.gated()
        cand_d, gated_d = self.bias_decode.candidates(), self.bias_decode.gated()
        f_p = self.bias_prefill.factors() if on else {s: 1.0 for s in sums}
        f_d = self.bias_decode.factors() if on else {s: 1.0 for s in sums}
        self._last_factors = (cand_p, gated_p, cand_d, gated_d)
        raw_arrivals = sum(s.arrivals for s in sums.values())
        arrivals = sum(f_p[k] * s.arrivals for k, s in sums.items())
        raw_admitted = sum(s.admitted for s in sums.values())
        admitted = sum(f_d[k] * s.admitted for k, s in sums.items())
        admitted_kv = sum(f_d[k] * s.admitted_kv for k, s in sums.items())
        per_source = {k: {"raw": s.arrivals, "factor": f_p[k], "tokens": f_p[k] * s.arrivals,
                          "admitted_raw": s.admitted, "decode_factor": f_d[k], "admitted": f_d[k] * s.admitted,
                          "requests": s.count} for k, s in sums.items()}

        w_ready, w_inflight = float(x_q.sum()), float(x_in.sum())
        sources = SourceBreakdown(sums["sampler"].arrivals, sums["sandbox"].arrivals, w_ready,
                                  sums["tool"].arrivals + sums["decode_return"].arrivals + sums["resend"].arrivals,
                                  w_inflight)
        life = LifecycleOnly(sources.backlog + arrivals, arrivals, obs.tokens + admitted, obs.kv_tokens + admitted_kv)
        # the combination (combiner.py), in the regime of this window
        persist_prefill, persist_decode = self.accuracy.persistence
        regime = self._regime(now, f_p["sandbox"] * sums["sandbox"].arrivals, persist_prefill)
        prefill_combiner, decode_combiner = self._combiners(regime)
        if regime in (LAUNCH, REBOUND):  # until compared there, the lifecycle forecast only if steady windows trust it
            for first, steady in zip(self._combiners(regime), (self.combine_prefill, self.combine_decode)):
                first.prior = LIFECYCLE if steady.trusts(LIFECYCLE) else PERSISTENCE
        served_p = prefill_combiner.serve(arrivals, persist_prefill)
        served_d = decode_combiner.serve(life.decode_admission_tokens, persist_decode)
        served_kv = _scaled_kv(life, served_d.value)
        return Forecast(
            t=now,
            horizon_s=horizon,
            prefill_tokens=sources.backlog + served_p.value,
            prefill_arrival_tokens=served_p.value,
            decode_admission_tokens=served_d.value,
            decode_kv_tokens=served_kv,
            decode_kv_current_tokens=self._decode_kv_now(snap),
            sources=sources,
            raw_decode_admission_tokens=obs.tokens + raw_admitted,
            bias_prefill=arrivals / raw_arrivals if raw_arrivals > 0 else 1.0,
            bias_decode=admitted / raw_admitted if raw_admitted > 0 else 1.0,
            p_hat=st.acceptance.value,
            launch_delay_s=st.launch_delay.value,
            sampler=self._sampler_summary(snap, horizon, dt, sums["sampler"]),
            wape=self.accuracy.summary(),
            live_trajectories=tr.live_count,
            rejected_events=tr.rejected_count,
            states=tr.state_counts(),
            paused=tr.paused,
            arrivals=per_source,
            baseline=self.accuracy.baseline(),
            admission_horizon_s=admit,
            decode_observed_tokens=obs.tokens,
            weight_version=tr.weight_version,
            lifecycle=life,
            served_prefill=served_p,
            served_decode=served_d,
            regime=regime,
        )

    def _combiners(self, regime: str) -> tuple[ForecastCombiner, ForecastCombiner]:
        if regime == LAUNCH:
            return self.launch_prefill, self.launch_decode
        if regime == SURGE:
            return self.surge_prefill, self.surge_decode
        if regime == REBOUND:
            return self.rebound_prefill, self.rebound_decode
        return self.combine_prefill, self.combine_decode

    def _regime(self, now: float, announced: float, persisted: float | None) -> str:
        """LAUNCH (``_launch_unseen``), SURGE (``surging``), REBOUND (the last window ``jumped``) or STEADY."""
        if self._launch_unseen(now):
            return LAUNCH
        if surging(announced, persisted, self.combine_prefill.kalman.forecast):
            return SURGE
        return REBOUND if self._rebound else STEADY

    def _launch_unseen(self, now: float) -> bool:
        """Sync steps: between steps (the next launch is coming), or a step launched that no closed window has seen
        an arrival of yet. Persistence and the series model are blind to both; only the lifecycle forecast models it."""
        steps = self.steps
        if not steps.active:
            return False
        if steps.gap_phase(now) is not None:
            return True
        return steps.step_open and self._step_seen != steps.step_started_at

    def _decode_kv_now(self, snap: Snapshot) -> float:
        """K_D_t: prompt plus the tokens generated so far (elapsed decode time x the learned decode speed)."""
        idx = snap.members(TrajState.DECODE)
        if not Snapshot.count(idx):
            return 0.0
        speed = np.array([self.stats.decode_tokens_per_s(t) for t in range(snap.radix["task"])])
        prompt = snap.prompt[idx]
        if speed.any():  # the engine reports output tokens: add what the running decodes generated so far
            tokens = speed.take(snap.task[idx])
            tokens *= snap.elapsed(idx, engine=True)
            np.floor(tokens, out=tokens)
            tokens += prompt if prompt.min() >= 0 else np.maximum(prompt, 0.0)  # a min pass spares the clip
        else:
            tokens = np.maximum(prompt, 0.0)
        return float(self._kv.many(tokens, overwrite=True).sum())  # tokens: our own array, >= 0

    def _sampler_summary(self, snap: Snapshot, horizon: float, dt: float, sums) -> SamplerForecast:
        """B.2's diagnostics: N_pass over S (Eq. 3), launches, and the new-sample arrivals the forecast counts."""
        idx = snap.members(TrajState.REWARD)
        p_hat = self.stats.acceptance.value
        n_pass, q = 0.0, np.zeros(0)
        if Snapshot.count(idx):
            fitted = self.terms.fitted(self.stats.stores[Phase.REWARD], idx)  # the sampler term's fit
            (q,) = fitted.probabilities(None, snap.elapsed(idx), (horizon,), None)
            n_pass = p_hat * float(q.sum())
        d_hat = self.stats.launch_delay.value
        policy = self.config.injection.policy
        if policy is InjectionPolicy.REPLACE_ON_REWARD:
            n_samp = n_pass
        elif policy is InjectionPolicy.FIXED_RATE:
            n_samp = self.config.injection.rate_per_s * horizon
        elif policy is InjectionPolicy.GROUP:  # Eq. 4 with the group rule: P(group completes) = prod of members' q
            n_samp = 0.0
            keep, gid = self.terms.completable(idx)
            if keep.any():
                q_done, gid = q[keep], gid[keep]
                key = np.where(gid < 0, -1 - np.arange(gid.size), gid)
                order = np.argsort(key, kind="stable")
                first = np.flatnonzero(np.r_[True, np.diff(key[order]) != 0])
                with np.errstate(divide="ignore"):
                    per_group = np.exp(np.add.reduceat(np.log(q_done[order]), first))
                n_samp = self.config.injection.group_size * float(per_group.sum())
        else:
            n_samp = self.terms.launches
        return SamplerForecast(n_pass=n_pass, n_samp=n_samp, launch_horizon_s=max(0.0, horizon - d_hat),
                               n_launch=sums.count, tokens=sums.arrivals, arrival_offset_s=d_hat)
