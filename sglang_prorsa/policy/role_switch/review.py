"""Move review: each switch judged by the completions it brought, and undone if they fell (beyond the paper).

Both of the planner's rules predict what a move does from a model of the queues: Eq. 1's demands, or the wait rule's
held queues (waits.py). Near saturation both miss. On the Qwen3-like general agent at staleness 8 decode runs
within one instance of its load at the fastest split, so the wait rule reads a 12th and a 13th prefill instance as
nearly free (decode holds no queue between bursts) while each costs decode a queue at the next burst; the rule drifted
to 13-15 prefill instances and took 1.20x the best static split's time (docs/controller.md has the trace). The review
measures the move instead of predicting it:

    before = completions over [t - window_s, t] / window_s                     (t: the move)
    after  = completions over [t + settle_s, t + settle_s + window_s] / window_s
    undo the move when after < (1 - tolerance) * before

A completion is a turn's decode finishing (the trajectories' ``decode_end`` events: the counter the wait rule's rate
comes from). In a GPU-bound rollout every finished turn starts the next one after its tool call, so the completion
rate is the rollout's throughput. ``settle_s`` skips the switch itself and the requests it moved; ``window_s`` spans
about two steps of the cell above, so that a window's phase within a step matters less. While a move is under review no other
move is made (``REVIEWING``): a second move would make the comparison say nothing about either. An undone move is
refused from the same split in the same direction for ``block_s`` (``REFUSED_BY_REVIEW``), after which it may be
tried again: the workload may have changed. A move made with less than ``window_s`` of readings behind it, with no
completion in that window (a paused trainer, a cold start), or while the completion counter is not known, goes
unreviewed.

Measured, not a default (opt-in in the simulator only: ``ClusterConfig.move_review``, ``bench_sim_grid.py
--move-review``; benchmarks/results/wait_rule_ab/move_review_per_seed.json). With the wait rule it fixes the cell
above: 1.006 of the best static over 24 seeds on a 12-step window (held-out seeds 12-23: 1.009) against 1.244, and
1.013 against 1.060 on the 4-step grid. But over the 13 GPU-bound cells it takes four above 1.02 that were within it
(MiMo-like coding agent at staleness 0 and 2, general agent at staleness 0; Qwen3-like coding agent at staleness 2),
9 of 13 within against 12. Our reading, not traced: where the fastest schedule moves often, a hold of
``due_after_s`` after every move is too slow, and in synchronous steps the completion rate moves with the step's
phases and undoes good moves. Reviewing only moves into prefill (the
direction the trace blames) keeps the moves into decode free and takes the cell to 1.042. In that cell the review
freezes the split rather than finds it (seed 0: the first two wait-driven moves, from 11:21 either way, undone and
refused for longer than the run; 11:21 is the best static split): refused for 300 s instead of 1,800 s, the cell is
1.055. docs/controller.md has the verdicts. What it cannot tell
apart: a fall in completions the move caused from one the workload brought at the same time (the end of a
synchronous step, a paused trainer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sglang_prorsa.policy.role_switch.capacity import Role
from sglang_prorsa.policy.role_switch.waits import CompletionRate

REVIEWING = "reviewing"  # a move is under review: no other move until its verdict
REFUSED_BY_REVIEW = "refused_by_review"  # this move, from this split, was undone less than block_s ago
REVERTED = "reverted_by_review"  # the considered reason of a move that undoes one


@dataclass(frozen=True)
class ReviewConfig:
    window_s: float = 180.0  # completions are counted over this long before and after a move
    settle_s: float = 30.0  # skipped after the move: the switch itself and the requests it moved
    tolerance: float = 0.05  # a fall in completions per second by more than this fraction undoes the move
    block_s: float = 1800.0  # an undone move is refused from the same split, in the same direction, this long

    def __post_init__(self) -> None:
        for name in ("window_s", "settle_s", "block_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance}")

    @property
    def due_after_s(self) -> float:
        """Seconds from a move to its verdict."""
        return self.settle_s + self.window_s


@dataclass(frozen=True)
class Review:
    """A move under review."""

    started_s: float
    instance_ids: tuple[str, ...]
    src: Role
    dst: Role
    prefill_instances: int  # the split it left, in prefill instances (mid-switch ones under their destination)
    before_per_s: float

    def to_dict(self) -> dict:
        return {"started_s": self.started_s, "instances": list(self.instance_ids), "from": self.src.value,
                "to": self.dst.value, "prefill_instances": self.prefill_instances, "before_per_s": self.before_per_s}


@dataclass(frozen=True)
class Verdict:
    review: Review
    after_per_s: float
    undone: bool
    decided_s: float

    def to_dict(self) -> dict:
        return self.review.to_dict() | {"after_per_s": self.after_per_s, "undone": self.undone,
                                        "decided_s": self.decided_s}


@dataclass
class MoveReview:
    """The review's state: the completion counter's readings, the move under review, the refused moves."""

    config: ReviewConfig = field(default_factory=ReviewConfig)
    pending: Review | None = None
    last_verdict: Verdict | None = None
    verdicts: int = 0
    undone: int = 0
    _history: CompletionRate = field(init=False)
    _refused: dict[tuple[int, Role], float] = field(default_factory=dict)  # (split, direction) -> until

    def __post_init__(self) -> None:
        # back to the start of the before window of a move whose verdict is due now
        cfg = self.config
        self._history = CompletionRate(cfg.window_s, keep_s=2 * cfg.window_s + cfg.settle_s)

    def observe(self, now: float, completions_total: int) -> None:
        """The completion counter read ``completions_total`` at ``now``. A counter or clock that went back (a
        restarted control plane) starts the readings over and drops the move under review."""
        if not self._history.observe(now, completions_total):
            self.pending = None

    def rate(self, t0: float, t1: float) -> float | None:
        """Completions per second between the readings at or before ``t0`` and ``t1``; None without both."""
        return self._history.rate(t0, t1)

    def holding(self, now: float) -> bool:
        """A move is under review and its verdict is not due yet."""
        return self.pending is not None and now < self.pending.started_s + self.config.due_after_s

    def refused(self, prefill_instances: int, dst: Role, now: float) -> bool:
        """Whether a move into ``dst`` from this split was undone less than ``block_s`` ago."""
        return self._refused.get((prefill_instances, dst), -math.inf) > now

    def due(self, now: float) -> Verdict | None:
        """The verdict on the move under review once ``due_after_s`` passed; an undone move's direction from its
        split is refused from now for ``block_s``."""
        review = self.pending
        if review is None or now < review.started_s + self.config.due_after_s:
            return None
        self.pending = None
        after = self.rate(review.started_s + self.config.settle_s, now)
        if after is None:
            return None
        undone = after < (1 - self.config.tolerance) * review.before_per_s
        if undone:
            self._refused[(review.prefill_instances, review.dst)] = now + self.config.block_s
            self.undone += 1
        self.verdicts += 1
        self.last_verdict = Verdict(review, after, undone, now)
        return self.last_verdict

    def start(self, now: float, instance_ids: tuple[str, ...], src: Role, dst: Role, prefill_instances: int) -> bool:
        """Put a move made now under review; False (unreviewed) with less than ``window_s`` of readings behind it,
        or with no completion in the window before it: no fall can be measured from zero, and a review would only
        hold every other move for ``due_after_s``."""
        first = self._history.first_s
        if first is None or now - first < self.config.window_s:
            return False
        before = self.rate(now - self.config.window_s, now)
        if before is None or before <= 0:
            return False
        self.pending = Review(now, instance_ids, src, dst, prefill_instances, before)
        return True

    def snapshot(self, now: float) -> dict:
        """What GET /prorsa/decision reports under ``review``."""
        return {"pending": self.pending.to_dict() if self.pending is not None else None,
                "last_verdict": self.last_verdict.to_dict() if self.last_verdict is not None else None,
                "verdicts": self.verdicts, "undone": self.undone,
                "refused": [{"prefill_instances": split, "to": dst.value, "until_s": until}
                            for (split, dst), until in sorted(self._refused.items(), key=lambda kv: kv[0][0])
                            if until > now]}
