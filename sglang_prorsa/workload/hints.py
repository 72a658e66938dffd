"""Trainers that send only some of their lifecycle hints: a replay option that filters the simulated event stream.

The simulator (simulator.py) reports every hint a fully integrated trainer would send next to the engine's own events.
Real trainers often send less. Two channels feed the tracker (policy/lifecycle/events.py):

* the trainer's hints: ``sampled``, ``sandbox_start`` / ``sandbox_ready``, ``tool_start`` / ``tool_end``,
  ``reward_start`` / ``reward_end`` (``aborted`` too, which the simulator never emits);
* the engine's events: ``request_arrived``, ``prefill_start``, ``prefill_end``, ``decode_end`` for requests that carry a
  trajectory id, and the engine-wide control events (``weights_updated`` among them: the trainer's weight update goes
  through the engine's route, which reports it).

``filter_hints(events, hints)`` drops the trainer's hints of the named groups and keeps every engine event. With no
``sampled`` hint (``none``) nothing tells the control plane a trajectory's task, group or turn, so those fields are
stripped from the engine's events too: the engine's own reporter (srt/engine/events.py) sends only the trajectory id,
the prompt length, the prefill instance and the output length.

Sets (``HINT_SETS``): ``all``; ``no_sandbox``; ``no_tool``; ``no_reward`` (trajectories are then never seen to
finish: their last response leaves them ``decoded`` for good); ``none`` (engine events only).
"""

from __future__ import annotations

from typing import Iterable, Iterator

from sglang_prorsa.policy.lifecycle.events import ENGINE_EVENT_KINDS, EventKind, LifecycleEvent

HINT_GROUPS: dict[str, frozenset[EventKind]] = {
    "sampled": frozenset({EventKind.SAMPLED}),
    "sandbox": frozenset({EventKind.SANDBOX_START, EventKind.SANDBOX_READY}),
    "tool": frozenset({EventKind.TOOL_START, EventKind.TOOL_END}),
    "reward": frozenset({EventKind.REWARD_START, EventKind.REWARD_END}),
    "aborted": frozenset({EventKind.ABORTED}),
}
TRAINER_HINT_KINDS = frozenset().union(*HINT_GROUPS.values())
assert not TRAINER_HINT_KINDS & ENGINE_EVENT_KINDS and TRAINER_HINT_KINDS | ENGINE_EVENT_KINDS == set(EventKind)

HINT_SETS: dict[str, tuple[str, ...]] = {  # name -> the hint groups the trainer does NOT send
    "all": (),
    "no_sandbox": ("sandbox",),
    "no_tool": ("tool",),
    "no_reward": ("reward",),
    "none": tuple(HINT_GROUPS),
}


def dropped_kinds(hints: str) -> frozenset[EventKind]:
    if hints not in HINT_SETS:
        raise ValueError(f"hints must be one of {', '.join(HINT_SETS)}, got {hints!r}")
    return frozenset().union(*(HINT_GROUPS[g] for g in HINT_SETS[hints]))


def engine_view(event: LifecycleEvent) -> LifecycleEvent:
    """An engine event as the engine itself reports it: no task, group or turn (only a trainer knows those)."""
    if event.group_id is None and event.task is None and event.turn is None:
        return event
    return LifecycleEvent(event.trajectory_id, event.kind, event.ts, prompt_tokens=event.prompt_tokens,
                          instance=event.instance, output_tokens=event.output_tokens, pause_mode=event.pause_mode,
                          trajectory_ids=event.trajectory_ids, weight_version=event.weight_version)


def filter_hints(events: Iterable[LifecycleEvent], hints: str = "all") -> Iterator[LifecycleEvent]:
    """``events`` as a trainer that sends only the hint set ``hints`` would leave them (order kept)."""
    drop = dropped_kinds(hints)
    if not drop:
        yield from events
        return
    strip = EventKind.SAMPLED in drop
    for event in events:
        if event.kind in drop:
            continue
        yield engine_view(event) if strip else event
