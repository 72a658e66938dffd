"""Where the simulated engines and trainer report lifecycle events: nowhere (colocated, static PD) or the real
control plane (adaptive.py). One small interface, so the cluster code is the same in every mode."""

from __future__ import annotations

from typing import Protocol

from sglang_prorsa.policy.lifecycle.events import LifecycleEvent


class Lifecycle(Protocol):
    def hint(self, event: LifecycleEvent) -> None:
        """A trainer hint (sampled, sandbox, tool, reward, aborted), possibly stamped ahead of the current time."""

    def request_arrived(self, run, prompt_tokens: int, instance: str, t: float) -> None:
        """A request joined the ready queue of ``instance`` (engine event)."""

    def prefill_finished(self, instance: str, req, t: float) -> None:
        """Prefill completed (a decode admission when the request is tracked)."""

    def decode_finished(self, run, t: float) -> None:
        """The response is complete."""

    def instance_interrupted(self, instance: str) -> None:
        """``instance`` starts a role switch."""

    def prefill_interval(self, instance, new_tokens: int, cached_tokens: int, requests: int, seconds: float) -> None:
        """A prefill instance went from idle to idle: one busy interval for the θ model."""


class NullLifecycle:
    """Static modes have no control plane: events are dropped."""

    hint = None  # the trainer builds no hints at all for a None sink

    def request_arrived(self, run, prompt_tokens: int, instance: str, t: float) -> None: ...

    def prefill_finished(self, instance: str, req, t: float) -> None: ...

    def decode_finished(self, run, t: float) -> None: ...

    def instance_interrupted(self, instance: str) -> None: ...

    def prefill_interval(self, instance, new_tokens: int, cached_tokens: int, requests: int, seconds: float) -> None:
        ...
