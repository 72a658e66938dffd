"""The short-horizon workload predictor (paper §4.1.2, Appendix B).

``WorkloadPredictor.forecast(now)`` reads the tracker's live trajectories and returns, for [t, t + S):

    W_P = W_samp + W_start + W_ready + W_tool + W_inflight                      (Eq. 15; sources Eq. 5, 7, 8, 11, 12)
    A_D, K_D from the per-instance serial recurrence over in-flight, queued and predicted requests    (Eq. 13-14)

with the online multiplicative bias correction (B.8) applied to the *predicted* parts: the predicted arrivals
(sampler + sandbox + tool; the ready and in-flight backlog is observed, not predicted) and A_D / K_D.
``refresh(now)`` is the every-S step: it closes the accuracy window that just ended, updates the bias from its
residuals, and opens the next window with the new forecast.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sglang_prorsa.srt.forecast.accuracy import AccuracyTracker, WapeSummary
from sglang_prorsa.srt.forecast.bias import MultiplicativeBias
from sglang_prorsa.srt.forecast.config import PredictorConfig
from sglang_prorsa.srt.forecast.decode_admissions import PrefillJob, forecast_decode_admissions
from sglang_prorsa.srt.forecast.profile import KVFootprint
from sglang_prorsa.srt.forecast.sampler import SamplerForecast, forecast_sampler, make_injection_rule
from sglang_prorsa.srt.forecast.statistics import LifecycleStatistics, launch_chain, reward_chain, startup_chain
from sglang_prorsa.srt.forecast.tool_ema import tool_class_chain
from sglang_prorsa.srt.lifecycle.states import TrajState
from sglang_prorsa.srt.lifecycle.tracker import TrajectoryTracker


@dataclass(frozen=True)
class SourceBreakdown:
    """Raw (uncorrected) prefill-token contribution of each source."""

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
class Forecast:
    t: float
    horizon_s: float
    prefill_tokens: float  # W_P: backlog + bias-corrected predicted arrivals
    prefill_arrival_tokens: float  # bias-corrected predicted arrivals only
    decode_admission_tokens: float  # A_D, bias-corrected
    decode_kv_tokens: float  # K_D, bias-corrected
    decode_kv_current_tokens: float  # K_D_t approximated by kappa_D(prompt) of requests in decode
    sources: SourceBreakdown
    raw_decode_admission_tokens: float
    bias_prefill: float
    bias_decode: float
    p_hat: float
    launch_delay_s: float
    sampler: SamplerForecast
    wape: WapeSummary
    live_trajectories: int
    rejected_events: int
    states: dict[str, int]

    def to_dict(self) -> dict:
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
        }


class WorkloadPredictor:
    def __init__(self, tracker: TrajectoryTracker, config: PredictorConfig | None = None) -> None:
        self.tracker = tracker
        self.config = config or PredictorConfig()
        self.stats = LifecycleStatistics(self.config)
        self.accuracy = AccuracyTracker(self.config.recent_windows)
        tracker.add_observer(self.stats)
        tracker.add_observer(self.accuracy)
        self.latest: Forecast | None = None
        self.next_refresh_at: float | None = None
        self._apply_config(self.config)

    def _apply_config(self, config: PredictorConfig) -> None:
        self.config = config
        self.stats.config = config
        self._rule = make_injection_rule(config.injection)
        self._kv = KVFootprint(config.kv_page_size)
        lo, hi = config.bias_bounds
        self.bias_prefill = MultiplicativeBias(config.bias_beta, lo, hi)
        self.bias_decode = MultiplicativeBias(config.bias_beta, lo, hi)

    def reconfigure(self, config: PredictorConfig) -> None:
        """New trainer settings: learned statistics stay; the open window closes unscored and the bias restarts
        (residuals measured under the old horizon / policy say nothing about the new one)."""
        self.accuracy.discard()
        self._apply_config(config)
        self.next_refresh_at = None

    # ----- refresh every S (B.8) -----
    def refresh(self, now: float) -> Forecast:
        record = self.accuracy.close()
        if record is not None and self.config.bias_enabled:
            self.bias_prefill.update(record.raw_arrivals, record.realised_arrivals)
            self.bias_decode.update(record.raw_decode, record.realised_decode)
        forecast = self.forecast(now)
        self.accuracy.open(
            now,
            now + forecast.horizon_s,
            forecast_arrivals=forecast.prefill_arrival_tokens,
            raw_arrivals=forecast.sources.predicted_arrivals,
            backlog=forecast.sources.backlog,
            forecast_decode=forecast.decode_admission_tokens,
            raw_decode=forecast.raw_decode_admission_tokens,
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
    def forecast(self, now: float) -> Forecast:
        cfg, tr, st = self.config, self.tracker, self.stats
        horizon = cfg.horizon_s
        g = cfg.prefill_profile
        x_new = st.new_sample_prompt()
        predicted: list[PrefillJob] = []

        sampler = self._sampler(now, horizon, x_new)
        if sampler.n_launch > 0 and x_new > 0:
            arrival = now + sampler.arrival_offset_s
            whole = int(math.floor(sampler.n_launch))
            predicted += [PrefillJob(x_new, arrival)] * whole
            if sampler.n_launch - whole > 1e-9:
                predicted.append(PrefillJob(x_new, arrival, weight=sampler.n_launch - whole))

        w_start = self._sandbox(now, horizon, x_new, predicted)
        w_tool = self._tool(now, horizon, predicted)

        queued = []
        w_ready = 0.0
        for traj in tr.in_state(TrajState.READY).values():
            x = float(traj.prompt_tokens or 0)
            w_ready += x
            queued.append(PrefillJob(x, now, instance=traj.instance))

        inflight = []
        w_inflight = 0.0
        for traj in tr.in_state(TrajState.PREFILL).values():
            x = float(traj.prompt_tokens or 0)
            w_inflight += x
            inflight.append(PrefillJob(x, traj.entered_at, instance=traj.instance, finish_at=traj.entered_at + g(x)))

        instances = list(cfg.prefill_instances) or sorted({j.instance for j in inflight + queued if j.instance})
        admissions = forecast_decode_admissions(now, horizon, instances, inflight, queued, predicted, g, self._kv)
        kv_now = sum(self._kv(t.prompt_tokens or 0) for t in tr.in_state(TrajState.DECODE).values())

        sources = SourceBreakdown(sampler.tokens, w_start, w_ready, w_tool, w_inflight)
        b_p = self.bias_prefill.factor if cfg.bias_enabled else 1.0
        b_d = self.bias_decode.factor if cfg.bias_enabled else 1.0
        arrivals = b_p * sources.predicted_arrivals
        return Forecast(
            t=now,
            horizon_s=horizon,
            prefill_tokens=sources.backlog + arrivals,
            prefill_arrival_tokens=arrivals,
            decode_admission_tokens=b_d * admissions.tokens,
            decode_kv_tokens=b_d * admissions.kv_tokens,
            decode_kv_current_tokens=kv_now,
            sources=sources,
            raw_decode_admission_tokens=admissions.tokens,
            bias_prefill=b_p,
            bias_decode=b_d,
            p_hat=st.acceptance.value,
            launch_delay_s=st.launch_delay.value,
            sampler=sampler,
            wape=self.accuracy.summary(),
            live_trajectories=tr.live_count,
            rejected_events=tr.rejected_count,
            states=tr.state_counts(),
        )

    def _sampler(self, now: float, horizon: float, x_new: float) -> SamplerForecast:
        """B.2 over trajectories in reward."""
        tr, st = self.tracker, self.stats
        in_reward = list(tr.in_state(TrajState.REWARD).values())
        snap = st.reward.snapshot([reward_chain(t.task) for t in in_reward], [t.elapsed(now) for t in in_reward])
        d_hat = st.launch_delay.value
        s_pw = max(0.0, horizon - d_hat)
        groups = [
            (t.group_id, t.group_id is None or not tr.group_waiting_outside_reward(t.group_id)) for t in in_reward
        ]
        return forecast_sampler(
            snap.prob_within(horizon),
            snap.prob_within(s_pw),
            snap.mean_residual_within(s_pw),
            groups,
            rule=self._rule,
            p_hat=st.acceptance.value,
            launch_delay_s=d_hat,
            horizon_s=horizon,
            new_prompt_tokens=x_new,
        )

    def _sandbox(self, now: float, horizon: float, x_new: float, predicted: list[PrefillJob]) -> float:
        """B.3 (Eq. 6-7) over starting sandboxes; launched-but-not-started samples use the launch-delay distribution,
        and sandboxes reported ready count with q = 1 (their first request is being dispatched)."""
        tr, st = self.tracker, self.stats
        total = 0.0
        groups = (
            (tr.in_state(TrajState.SANDBOX_STARTING).values(), st.startup, lambda t: startup_chain(t.mode, t.startup_load)),
            (tr.in_state(TrajState.SAMPLED).values(), st.launch, lambda t: launch_chain()),
        )
        for trajs, durations, chain_of in groups:
            trajs = list(trajs)
            if not trajs:
                continue
            snap = durations.snapshot([chain_of(t) for t in trajs], [t.elapsed(now) for t in trajs])
            q = snap.prob_within(horizon)
            r = snap.mean_residual_within(horizon)
            x = np.array([t.next_prompt_tokens if t.next_prompt_tokens is not None else x_new for t in trajs], float)
            total += float(np.dot(q, x))
            predicted.extend(PrefillJob(float(xi), now + float(ri), weight=float(qi)) for qi, ri, xi in zip(q, r, x) if qi > 0)
        for t in tr.in_state(TrajState.SANDBOX_READY).values():
            x = float(t.next_prompt_tokens if t.next_prompt_tokens is not None else x_new)
            total += x
            predicted.append(PrefillJob(x, now))
        return total

    def _tool(self, now: float, horizon: float, predicted: list[PrefillJob]) -> float:
        """B.5 (Eq. 10-11): r_i = max(0, tau_i - e_i); contributes x_hat_i iff r_i < S. TOOL_DONE has r_i = 0."""
        tr, st = self.tracker, self.stats
        total = 0.0
        for t in tr.in_state(TrajState.TOOL).values():
            tau = st.tool.estimate(tool_class_chain(t.task, t.tool, t.turn, t.tool_load))
            r = max(0.0, tau - t.elapsed(now))
            if r < horizon:
                x = st.next_prompt(t)
                total += x
                predicted.append(PrefillJob(x, now + r))
        for t in tr.in_state(TrajState.TOOL_DONE).values():
            x = st.next_prompt(t)
            total += x
            predicted.append(PrefillJob(x, now))
        return total
