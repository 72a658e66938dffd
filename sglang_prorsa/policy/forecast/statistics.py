"""Online statistics fed by the tracker: what the predictor learns from completed phases (paper B.8).

"Observed training-admission outcomes update p_hat; arrivals and completions update the reward and startup
distributions and the tool-duration EMA." Here every timed phase gets a censored duration store (stores.py): the
paper's reward (B.2) and startup (B.3) distributions, and, beyond the paper, the launch delay (B.2's d_hat as a whole
distribution, cold starts included), the tool -> next-request delay (replacing B.5's tool EMA, which stops at
tool_end and is a point estimate), decode durations and the decode -> next-request delay (for trajectories that will
return within the horizon through a short tool), the sandbox-ready wait, and the resend delay after an abort.

Also learned: the probability that a response calls a tool (per task and turn, shrunk toward coarser classes),
prompt lengths (x_hat of a new sample, B.2 Eq. 5; the growth per turn for x_hat_i, B.5 Eq. 11), p_hat, and the
decode speed in tokens/s (for the KV footprint of running decodes, when the engine reports output tokens).
"""

from __future__ import annotations

from collections import deque
from typing import TypedDict

from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.forecast.sampler import AcceptanceRate, LaunchDelay
from sglang_prorsa.policy.forecast.stores import DurationStore
from sglang_prorsa.policy.lifecycle.events import SandboxMode
from sglang_prorsa.policy.lifecycle.states import Trajectory, TrajState
from sglang_prorsa.policy.lifecycle.tracker import Phase, TrackerObserver, TrajectoryTracker

PROMPT_EMA_ALPHA = 0.1
GROWTH_WINDOW = 1024  # prompt growths per class averaged (a mean over many turns, not a jumpy EMA)
CONTINUE_SHRINK = 8.0  # pseudo-observations pulling a fine class's tool probability toward its parent's
_MODE_NAMES = {0: SandboxMode.PREWARM.value, 1: SandboxMode.COLD.value}
# module constants: ``TrajState.TOOL`` is a slow class-attribute look-up on the event path (Python 3.11)
_TOOL, _TOOL_DONE, _INTERRUPTED = TrajState.TOOL, TrajState.TOOL_DONE, TrajState.INTERRUPTED
_DECODED = TrajState.DECODED
_SANDBOX_STARTING, _SANDBOX_READY = TrajState.SANDBOX_STARTING, TrajState.SANDBOX_READY


def turn_bucket(turn: int) -> int:
    """0, 1, 2, 3, 4-5, 6-7, 8-11, 12-15, ..., 64+ (13 classes): late turns are rare and share classes."""
    if turn < 4:
        return max(0, turn)
    k = turn.bit_length() - 1
    return min(12, 4 + 2 * (k - 2) + ((turn >> (k - 1)) & 1))


TURN_BUCKETS = 13


def reward_chain(task: str) -> tuple:
    """Reward durations are task-conditioned (B.2), falling back to all tasks (kept for callers of the first cut)."""
    return ((task,), ())


def startup_chain(mode: SandboxMode | None, load: int) -> tuple:
    mode = mode or SandboxMode.PREWARM
    return ((mode.value, load), (mode.value,))


def launch_chain() -> tuple:
    return (("launch",),)


class _Ema:
    __slots__ = ("value", "count")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 0

    def update(self, x: float) -> None:
        self.value = x if self.count == 0 else (1 - PROMPT_EMA_ALPHA) * self.value + PROMPT_EMA_ALPHA * x
        self.count += 1


class _WindowMean:
    __slots__ = ("values", "total")

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self.total = 0.0

    def add(self, x: float) -> None:
        if len(self.values) == self.values.maxlen:
            self.total -= self.values[0]
        self.values.append(x)
        self.total += x

    @property
    def mean(self) -> float:
        return self.total / len(self.values) if self.values else 0.0


class _StoreSizes(TypedDict):
    history: int
    min_samples: int


class LifecycleStatistics(TrackerObserver):
    def __init__(self, config: PredictorConfig, tracker: TrajectoryTracker | None = None) -> None:
        self.config = config
        self.tracker = tracker
        kw = _StoreSizes(history=config.history_per_class, min_samples=config.min_survival_samples)

        def startup_prior(key):
            mode = key[-1] if len(key) > 1 else None  # levels: (task, mode) -> (mode,)
            return config.cold_startup_prior_s if mode == 1 else config.prewarm_startup_prior_s

        self.stores: dict[Phase, DurationStore] = {
            Phase.LAUNCH: DurationStore("launch", [("task",), ()], config.launch_delay_prior_s, **kw),
            Phase.STARTUP: DurationStore("startup", [("task", "mode"), ("mode",)], config.prewarm_startup_prior_s,
                                         prior_of=startup_prior, **kw),
            Phase.SANDBOX: DurationStore("sandbox", [("task", "mode"), ("mode",)], config.prewarm_startup_prior_s,
                                         prior_of=startup_prior, **kw),
            Phase.READY_WAIT: DurationStore("ready_wait", [("task",), ()], config.ready_wait_prior_s, **kw),
            Phase.DECODE: DurationStore("decode", [("task",), ()], config.decode_prior_s, **kw),
            Phase.DECODE_RETURN: DurationStore("decode_return", [("task",), ()], config.tool_prior_s, **kw),
            Phase.HANDOFF: DurationStore("handoff", [("task",), ()], config.handoff_prior_s, **kw),
            Phase.TOOL_RETURN: DurationStore("tool_return", [("task", "tool"), ("task",), ()], config.tool_prior_s, **kw),
            Phase.TOOL: DurationStore("tool", [("task", "tool"), ("task",), ()], config.tool_prior_s, **kw),
            Phase.POST_TOOL: DurationStore("post_tool", [("task",), ()], config.post_tool_prior_s, **kw),
            Phase.REWARD: DurationStore("reward", [("task",), ()], config.reward_prior_s, **kw),
            Phase.RESEND: DurationStore("resend", [()], config.resend_prior_s, **kw),
        }
        self.launch_delay = LaunchDelay(prior_s=config.launch_delay_prior_s)
        self.acceptance = AcceptanceRate()
        self._first_prompt: dict[int | None, _Ema] = {}
        self._growth: dict[tuple, _WindowMean] = {}  # (task, tool) / (task,) / () -> prompt growth per turn
        self._continue: dict[tuple, list[int]] = {}  # (task, bucket) / (task,) / () -> [calls tool, responses]
        self._decode_tokens: dict[int | None, list[float]] = {}  # task -> [output tokens, decode seconds]
        # how often the trainer reports the end of a tool / a ready sandbox before the request: [reported, seen]
        self.tool_end_reported = [0, 0]
        self.sandbox_ready_reported = [0, 0]
        self.tool_start_reported = [0, 0]  # turns that continued: through a reported tool_start / all

    # ----- ids of a trajectory in the tracker's interned columns -----
    def ids(self, traj: Trajectory) -> dict[str, int]:
        if self.tracker is None or traj.slot < 0:
            return {"task": 0, "tool": 0, "mode": 0}
        cols, s = self.tracker.columns, traj.slot
        return {"task": cols.task[s], "tool": max(cols.tool[s], 0), "mode": 1 if cols.mode[s] == 1 else 0}

    def id_tuple(self, traj: Trajectory) -> tuple[int, int, int]:
        """``ids`` as a (task, tool, mode) tuple (``DurationStore.record_ids``)."""
        if self.tracker is None or traj.slot < 0:
            return (0, 0, 0)
        cols, s = self.tracker.columns, traj.slot
        tool = cols.tool[s]
        return (cols.task[s], tool if tool > 0 else 0, 1 if cols.mode[s] == 1 else 0)

    def task_id(self, traj: Trajectory) -> int:
        return self.tracker.columns.task[traj.slot] if self.tracker is not None and traj.slot >= 0 else 0

    # ----- tracker callbacks -----
    def on_phase(self, phase: Phase, traj: Trajectory, duration: float, completed: bool, ts: float) -> None:
        tracker, s = self.tracker, traj.slot
        if tracker is None or s < 0:
            ids = (0, 0, 0)
        else:  # ``id_tuple``, inline: a few phases per event
            cols = tracker.columns
            tool = cols.tool[s]
            ids = (cols.task[s], tool if tool > 0 else 0, 1 if cols.mode[s] == 1 else 0)
        self.stores[phase].record_ids(ids, duration, completed, ts)

    def on_turn_decided(self, traj: Trajectory, calls_tool: bool) -> None:
        task = self.task_id(traj)
        continues = self._continue
        for key in ((task, turn_bucket(traj.turn)), (task,), ()):
            counts = continues.get(key)
            if counts is None:
                counts = continues[key] = [0, 0]
            counts[0] += calls_tool
            counts[1] += 1

    def on_decode_finished(self, traj: Trajectory, ts: float, duration: float, output_tokens: int | None) -> None:
        if output_tokens and duration > 0:
            for key in (self.task_id(traj), None):
                acc = self._decode_tokens.setdefault(key, [0.0, 0.0])
                acc[0] += output_tokens
                acc[1] += duration

    def on_prefill_arrival(self, traj: Trajectory, ts: float, prompt_tokens: int, previous_tokens: int | None) -> None:
        task = self.task_id(traj)
        state = traj.state  # still the state the request leaves
        if state is _TOOL or state is _TOOL_DONE:
            self.tool_end_reported[0] += state is _TOOL_DONE
            self.tool_end_reported[1] += 1
            self.tool_start_reported[0] += 1
            self.tool_start_reported[1] += 1
        elif state is _DECODED and traj.decoded_at is not None:
            self.tool_start_reported[1] += 1
        elif state is _SANDBOX_STARTING or state is _SANDBOX_READY:
            self.sandbox_ready_reported[0] += state is _SANDBOX_READY
            self.sandbox_ready_reported[1] += 1
        if previous_tokens is None:
            first = self._first_prompt
            for key in (task, None):
                ema = first.get(key)
                if ema is None:
                    ema = first[key] = _Ema()
                ema.update(prompt_tokens)
        elif state is not _INTERRUPTED:  # a resent request is the same turn, not growth
            grown = float(max(0, prompt_tokens - previous_tokens))
            keys = [(task,), ()]
            if state is _TOOL or state is _TOOL_DONE:  # the tool's result is part of the growth
                keys.append((task, self.ids(traj)["tool"]))
            growth = self._growth
            for growth_key in keys:
                mean = growth.get(growth_key)
                if mean is None:
                    mean = growth[growth_key] = _WindowMean(GROWTH_WINDOW)
                mean.add(grown)

    def on_launch_finished(self, duration: float) -> None:
        self.launch_delay.observe(duration)

    def on_reward_finished(self, task: str, duration: float, accepted: bool | None) -> None:
        if accepted is not None:
            self.acceptance.observe(accepted)

    # ----- estimates -----
    def new_sample_prompt(self, task: int | None = None) -> float:
        """x_hat of a not-yet-sent first request: the learned mean once ``min_class_samples`` first prompts were
        seen (per task, else overall), the trainer's ``default_prompt_tokens`` before that, else 0."""
        for key in (task, None):
            ema = self._first_prompt.get(key)
            if ema is not None and ema.count >= self.config.min_class_samples:
                return ema.value
        if self.config.default_prompt_tokens is not None:
            return float(self.config.default_prompt_tokens)
        ema = self._first_prompt.get(task) or self._first_prompt.get(None)
        return ema.value if ema else 0.0

    def growth(self, task: int | None, tool: int | None = None) -> float:
        """Mean prompt growth per turn (output + tool result): per (task, tool) once ``min_survival_samples`` turns
        through that tool were seen, else per task, else overall; 0 before any."""
        if tool is not None:
            mean = self._growth.get((task, tool))
            if mean is not None and len(mean.values) >= self.config.min_survival_samples:
                return mean.mean
        for key in ((task,), ()):
            mean = self._growth.get(key)
            if mean is not None and mean.values:
                return mean.mean
        return 0.0

    def next_prompt(self, traj: Trajectory) -> float:
        """x_hat_i after the tool result is appended: the trainer's estimate, else last prompt + learned growth."""
        if traj.next_prompt_tokens is not None:
            return float(traj.next_prompt_tokens)
        if traj.prompt_tokens is None:
            return self.new_sample_prompt(self.task_id(traj))
        tool = self.ids(traj)["tool"] if traj.state in (TrajState.TOOL, TrajState.TOOL_DONE) else None
        return traj.prompt_tokens + self.growth(self.task_id(traj), tool)

    def calls_tool(self, task: int, turn: int) -> float:
        """P(a response at ``turn`` calls a tool): counts per (task, turn class) shrunk toward the task's, and the
        task's toward all tasks'; 1.0 before any response was seen (B.5 assumes the tool follows)."""
        return self.calls_tool_in_bucket(task, turn_bucket(turn))

    def calls_tool_in_bucket(self, task: int, bucket: int) -> float:
        p = 1.0
        for key in ((), (task,), (task, bucket)):
            tools, total = self._continue.get(key, (0, 0))
            p = (tools + CONTINUE_SHRINK * p) / (total + CONTINUE_SHRINK)
        return p

    @staticmethod
    def mostly(counts: list[int]) -> bool:
        """True once at least half of the observed hand-offs reported the intermediate hint."""
        return counts[1] > 0 and 2 * counts[0] >= counts[1]

    def decode_tokens_per_s(self, task: int | None) -> float:
        acc = self._decode_tokens.get(task) or self._decode_tokens.get(None)
        return acc[0] / acc[1] if acc and acc[1] > 0 else 0.0
