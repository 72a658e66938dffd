"""Tool-duration EMA per conditioning class with fallback to coarser classes (paper B.5, Eq. 9-11).

    tau <- (1 - alpha) * tau + alpha * tau_hat,    alpha = 0.1                                   (Eq. 9)
    r_i = max(0, tau_i - e_i);   trajectory i contributes x_hat_i iff r_i < S                    (Eq. 10, 11)

Classes, finest first: (task, tool, turn, concurrent tool load) -> (task, tool, turn) -> (task, tool) -> (task,) -> ().
Every completed tool updates every class it belongs to; a forecast uses the finest class with at least
``min_samples`` observations ("whenever enough samples are available"), else the finest class with any observation,
else the prior. The first observation of a class initialises its EMA (an EMA started at 0 would predict instant tools).

The predictor no longer counts tools with this EMA test (Eq. 10-11 count a tool that has outlived its mean in every
window, issue 10); it uses censored survival curves of the tool -> next-request delay (stores.py). Kept for reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

MAX_TURN_CLASS = 16  # turns beyond this share a class: late turns are rare and would never gather samples


def tool_class_chain(task: str, tool: str | None, turn: int, load: int) -> tuple[Hashable, ...]:
    tool = tool or "-"
    turn = min(turn, MAX_TURN_CLASS)
    return ((task, tool, turn, load), (task, tool, turn), (task, tool), (task,), ())


@dataclass(slots=True)
class _Ema:
    value: float
    count: int


class ToolDurationEMA:
    def __init__(self, alpha: float = 0.1, min_samples: int = 5, prior_s: float = 5.0) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.min_samples = min_samples
        self.prior_s = prior_s
        self._classes: dict[Hashable, _Ema] = {}

    def update(self, chain: tuple[Hashable, ...], duration: float) -> None:
        duration = max(0.0, float(duration))
        for key in chain:
            ema = self._classes.get(key)
            if ema is None:
                self._classes[key] = _Ema(duration, 1)
            else:
                ema.value = (1.0 - self.alpha) * ema.value + self.alpha * duration
                ema.count += 1

    def estimate(self, chain: tuple[Hashable, ...]) -> float:
        """tau for a trajectory in class ``chain``."""
        fallback = None
        for key in chain:
            ema = self._classes.get(key)
            if ema is None:
                continue
            if ema.count >= self.min_samples:
                return ema.value
            if fallback is None:
                fallback = ema.value
        return self.prior_s if fallback is None else fallback

    def samples(self, key: Hashable) -> int:
        ema = self._classes.get(key)
        return 0 if ema is None else ema.count
