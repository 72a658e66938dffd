"""Online statistics fed by the tracker: what the predictor learns from completed phases (paper B.8).

"Observed training-admission outcomes update p_hat; arrivals and completions update the reward and startup
distributions and the tool-duration EMA." Plus the launch delay d_hat (B.2) and prompt-length estimates: x_hat for a
new sample (B.2 Eq. 5) and x_hat_i after a tool result is appended (B.5 Eq. 11).
"""

from __future__ import annotations

from sglang_prorsa.srt.forecast.config import PredictorConfig
from sglang_prorsa.srt.forecast.distributions import ConditionalDurations
from sglang_prorsa.srt.forecast.sampler import AcceptanceRate, LaunchDelay
from sglang_prorsa.srt.forecast.tool_ema import ToolDurationEMA, tool_class_chain
from sglang_prorsa.srt.lifecycle.events import SandboxMode
from sglang_prorsa.srt.lifecycle.states import Trajectory
from sglang_prorsa.srt.lifecycle.tracker import TrackerObserver

PROMPT_EMA_ALPHA = 0.1
_LAUNCH_CHAIN = (("launch",),)


def reward_chain(task: str) -> tuple:
    """Reward durations are task-conditioned (B.2), falling back to all tasks."""
    return ((task,), ())


def startup_chain(mode: SandboxMode | None, load: int) -> tuple:
    """Startup durations are conditioned on mode and concurrent startup load (B.3); never mixed across modes."""
    mode = mode or SandboxMode.PREWARM
    return ((mode.value, load), (mode.value,))


def launch_chain() -> tuple:
    return _LAUNCH_CHAIN


class _Ema:
    __slots__ = ("value", "count")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 0

    def update(self, x: float) -> None:
        self.value = x if self.count == 0 else (1 - PROMPT_EMA_ALPHA) * self.value + PROMPT_EMA_ALPHA * x
        self.count += 1


class LifecycleStatistics(TrackerObserver):
    def __init__(self, config: PredictorConfig) -> None:
        self.config = config
        kw = dict(min_samples=config.min_class_samples, history=config.history_per_class)
        self.reward = ConditionalDurations(config.reward_prior_s, **kw)
        self.startup = ConditionalDurations(
            config.prewarm_startup_prior_s,
            priors={
                (SandboxMode.PREWARM.value,): config.prewarm_startup_prior_s,
                (SandboxMode.COLD.value,): config.cold_startup_prior_s,
            },
            **kw,
        )
        self.launch = ConditionalDurations(config.launch_delay_prior_s, **kw)
        self.launch_delay = LaunchDelay(prior_s=config.launch_delay_prior_s)
        self.tool = ToolDurationEMA(config.tool_ema_alpha, config.min_class_samples, config.tool_prior_s)
        self.acceptance = AcceptanceRate()
        self._first_prompt: dict[str, _Ema] = {}
        self._growth: dict[str, _Ema] = {}

    # ----- tracker callbacks -----
    def on_prefill_arrival(self, traj: Trajectory, ts: float, prompt_tokens: int, previous_tokens: int | None) -> None:
        if previous_tokens is None:
            for key in (traj.task, None):
                self._first_prompt.setdefault(key, _Ema()).update(prompt_tokens)
        else:
            for key in (traj.task, None):
                self._growth.setdefault(key, _Ema()).update(max(0, prompt_tokens - previous_tokens))

    def on_startup_finished(self, mode: SandboxMode, load: int, duration: float) -> None:
        self.startup.record(startup_chain(mode, load), duration)

    def on_launch_finished(self, duration: float) -> None:
        self.launch_delay.observe(duration)
        self.launch.record(_LAUNCH_CHAIN, duration)

    def on_tool_finished(self, traj: Trajectory, duration: float) -> None:
        self.tool.update(tool_class_chain(traj.task, traj.tool, traj.turn, traj.tool_load), duration)

    def on_reward_finished(self, task: str, duration: float, accepted: bool | None) -> None:
        self.reward.record(reward_chain(task), duration)
        if accepted is not None:
            self.acceptance.observe(accepted)

    def on_reward_aborted(self, task: str, duration: float) -> None:
        self.reward.record(reward_chain(task), duration, completed=False)

    # ----- estimates -----
    def new_sample_prompt(self, task: str | None = None) -> float:
        """x_hat of a not-yet-sent first request: the trainer's default, else the learned mean, else 0."""
        if self.config.default_prompt_tokens is not None:
            return float(self.config.default_prompt_tokens)
        ema = self._first_prompt.get(task) or self._first_prompt.get(None)
        return ema.value if ema else 0.0

    def next_prompt(self, traj: Trajectory) -> float:
        """x_hat_i after the tool result is appended: the trainer's estimate, else last prompt + learned growth."""
        if traj.next_prompt_tokens is not None:
            return float(traj.next_prompt_tokens)
        if traj.prompt_tokens is None:
            return self.new_sample_prompt(traj.task)
        growth = self._growth.get(traj.task) or self._growth.get(None)
        return traj.prompt_tokens + (growth.value if growth else 0.0)
