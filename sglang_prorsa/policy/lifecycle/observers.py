"""What the tracker reports: event outcomes, timed phases, rejections, and the observer callbacks.

Observers (the predictor's statistics, the accuracy windows, the step model) override the callbacks they need; the
tracker calls only overridden ones (``CALLBACKS``), so an event costs nothing for observers that ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sglang_prorsa.policy.lifecycle.events import PauseMode, SandboxMode
from sglang_prorsa.policy.lifecycle.states import Trajectory


class Outcome(str, Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    INVALID_TRANSITION = "invalid_transition"
    UNKNOWN_TRAJECTORY = "unknown_trajectory"
    AFTER_FINISH = "after_finish"


class Phase(str, Enum):
    """Timed phases the predictor learns duration distributions of (each ends in, or is censored before, its end)."""

    LAUNCH = "launch"  # sampled -> first request joins ready (dispatch + sandbox + first request, any mode)
    STARTUP = "startup"  # sandbox_start -> first request (B.3: "launch-to-ready-queue duration")
    SANDBOX = "sandbox"  # sandbox_start -> sandbox_ready (when the trainer reports ready)
    READY_WAIT = "ready_wait"  # sandbox_ready -> first request
    DECODE = "decode"  # prefill_end -> decode_end (engine time; pauses excluded)
    DECODE_RETURN = "decode_return"  # decode_end -> next request, for turns that call a tool
    HANDOFF = "handoff"  # decode_end -> tool_start (or the next request when none came), for turns that continue
    TOOL_RETURN = "tool_return"  # tool_start -> next request (tool time plus the agent's delay; B.5 goes to tool_end)
    TOOL = "tool"  # tool_start -> tool_end (B.5's tool execution time, when the trainer reports tool_end)
    POST_TOOL = "post_tool"  # tool_end -> next request
    REWARD = "reward"  # reward_start -> reward_end
    RESEND = "resend"  # interrupted (request dropped by the engine) -> resent


@dataclass(frozen=True, slots=True)
class Rejection:
    trajectory_id: str
    event: str
    state: str | None
    reason: str


class TrackerObserver:
    """Callbacks for completed phases, realised arrivals and engine-wide events. Override what you need."""

    def on_prefill_arrival(self, traj: Trajectory, ts: float, prompt_tokens: int, previous_tokens: int | None) -> None: ...

    def on_decode_admission(self, traj: Trajectory, ts: float, prompt_tokens: int) -> None: ...

    def on_startup_finished(self, mode: SandboxMode, load: int, duration: float) -> None: ...

    def on_launch_finished(self, duration: float) -> None: ...  # prewarmed launches only (d_hat, B.2)

    def on_tool_finished(self, traj: Trajectory, duration: float) -> None: ...

    def on_reward_finished(self, task: str, duration: float, accepted: bool | None) -> None: ...

    def on_reward_aborted(self, task: str, duration: float) -> None: ...

    # ----- added for issue 10 / 13 -----
    def on_phase(self, phase: Phase, traj: Trajectory, duration: float, completed: bool, ts: float) -> None: ...

    def on_turn_decided(self, traj: Trajectory, calls_tool: bool) -> None: ...  # after a response: tool or reward

    def on_decode_finished(self, traj: Trajectory, ts: float, duration: float, output_tokens: int | None) -> None: ...

    def on_created(self, traj: Trajectory, ts: float) -> None: ...

    def on_finished(self, traj: Trajectory, ts: float, live_after: int) -> None: ...

    def on_paused(self, ts: float, mode: PauseMode) -> None: ...

    def on_continued(self, ts: float, paused_s: float) -> None: ...

    def on_weights_updated(self, ts: float, version: str | None) -> None: ...


CALLBACKS = tuple(name for name in vars(TrackerObserver) if name.startswith("on_"))
