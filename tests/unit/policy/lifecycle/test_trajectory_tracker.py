"""The trajectory state machine: transitions, duplicates, invalid transitions, bounded memory, observers."""

from sglang_prorsa.policy.lifecycle.events import EventKind as K
from sglang_prorsa.policy.lifecycle.events import LifecycleEvent, SandboxMode
from sglang_prorsa.policy.lifecycle.states import TrajState, load_bucket
from sglang_prorsa.policy.lifecycle.tracker import FINISHED_IDS_REMEMBERED, Outcome, TrackerObserver, TrajectoryTracker


def ev(tid, kind, ts, **kw):
    return LifecycleEvent(tid, kind, ts=float(ts), **kw)


class Recorder(TrackerObserver):
    def __init__(self):
        self.calls = []

    def on_prefill_arrival(self, traj, ts, prompt_tokens, previous_tokens):
        self.calls.append(("arrival", ts, prompt_tokens, previous_tokens))

    def on_decode_admission(self, traj, ts, prompt_tokens):
        self.calls.append(("admission", ts, prompt_tokens))

    def on_startup_finished(self, mode, load, duration):
        self.calls.append(("startup", mode, duration))

    def on_launch_finished(self, duration):
        self.calls.append(("launch", duration))

    def on_tool_finished(self, traj, duration):
        self.calls.append(("tool", traj.tool, traj.turn, duration))

    def on_reward_finished(self, task, duration, accepted):
        self.calls.append(("reward", task, duration, accepted))

    def on_reward_aborted(self, task, duration):
        self.calls.append(("reward_aborted", task, duration))


def full_trajectory(tid="t", mode=SandboxMode.PREWARM):
    return [
        ev(tid, K.SAMPLED, 0, task="swe", prompt_tokens=1000),
        ev(tid, K.SANDBOX_START, 1, mode=mode),
        ev(tid, K.SANDBOX_READY, 3),
        ev(tid, K.REQUEST_ARRIVED, 4, prompt_tokens=1000, instance="p0"),
        ev(tid, K.PREFILL_START, 4.5, instance="p0"),
        ev(tid, K.PREFILL_END, 5),
        ev(tid, K.DECODE_END, 9),
        ev(tid, K.TOOL_START, 9.5, tool="bash"),
        ev(tid, K.TOOL_END, 12.5),
        ev(tid, K.REQUEST_ARRIVED, 13, prompt_tokens=1800),
        ev(tid, K.PREFILL_END, 14),
        ev(tid, K.DECODE_END, 20),
        ev(tid, K.REWARD_START, 20),
        ev(tid, K.REWARD_END, 27, accepted=True),
    ]


def test_full_lifecycle_walks_every_state_and_leaves_live_set():
    rec = Recorder()
    tr = TrajectoryTracker([rec])
    expected = ["sampled", "sandbox_starting", "sandbox_ready", "ready", "prefill", "decode", "decoded", "tool",
                "tool_done", "ready", "decode", "decoded", "reward"]
    for event, state in zip(full_trajectory(), expected):
        assert tr.apply(event) is Outcome.APPLIED
        assert tr.get("t").state.value == state
    assert tr.apply(full_trajectory()[-1]) is Outcome.APPLIED
    assert tr.get("t") is None and tr.live_count == 0 and tr.finished_total == 1
    assert all(n == 0 for n in tr.state_counts().values())
    assert rec.calls == [
        ("startup", SandboxMode.PREWARM, 3.0),  # sandbox_start 1 -> first request joins ready at 4
        ("launch", 4.0),  # sampled 0 -> first request 4
        ("arrival", 4.0, 1000, None),
        ("admission", 5.0, 1000),
        ("tool", "bash", 0, 3.0),
        ("arrival", 13.0, 1800, 1000),
        ("admission", 14.0, 1800),
        ("reward", "swe", 7.0, True),
    ]
    assert tr.get("t") is None


def test_cold_start_does_not_feed_launch_delay():
    rec = Recorder()
    tr = TrajectoryTracker([rec])
    for event in full_trajectory(mode=SandboxMode.COLD)[:4]:
        tr.apply(event)
    assert ("startup", SandboxMode.COLD, 3.0) in rec.calls
    assert not [c for c in rec.calls if c[0] == "launch"]


def test_duplicates_are_idempotent():
    tr = TrajectoryTracker()
    events = full_trajectory()
    for event in events[:8]:
        tr.apply(event)
    before = (tr.get("t").state, tr.get("t").entered_at)
    assert tr.apply(events[7]) is Outcome.DUPLICATE  # tool_start again
    assert (tr.get("t").state, tr.get("t").entered_at) == before
    for event in events[8:]:
        tr.apply(event)
    assert tr.apply(events[-1]) is Outcome.DUPLICATE  # reward_end again, after the trajectory left
    assert tr.counts[Outcome.DUPLICATE] == 2 and tr.rejected_count == 0


def test_invalid_transitions_are_counted_and_do_not_corrupt_others():
    tr = TrajectoryTracker()
    for event in full_trajectory("a")[:8] + full_trajectory("b")[:4]:
        tr.apply(event)
    assert tr.apply(ev("a", K.PREFILL_END, 10)) is Outcome.INVALID_TRANSITION  # a is in tool
    assert tr.apply(ev("a", K.SANDBOX_READY, 10)) is Outcome.INVALID_TRANSITION
    assert tr.apply(ev("ghost", K.PREFILL_START, 10, instance="p0")) is Outcome.UNKNOWN_TRAJECTORY
    assert tr.get("a").state is TrajState.TOOL and tr.get("a").entered_at == 9.5
    assert tr.get("b").state is TrajState.READY
    assert tr.rejected_count == 3
    assert [r.reason for r in tr.recent_rejections] == ["invalid_transition", "invalid_transition", "unknown_trajectory"]
    assert tr.recent_rejections[0].state == "tool"
    for event in full_trajectory("a")[8:]:
        tr.apply(event)
    assert tr.apply(ev("a", K.TOOL_START, 30)) is Outcome.AFTER_FINISH
    assert tr.rejected_count == 4


def test_engine_arrival_implies_missing_tool_end():
    rec = Recorder()
    tr = TrajectoryTracker([rec])
    for event in full_trajectory()[:8]:
        tr.apply(event)
    assert tr.apply(ev("t", K.REQUEST_ARRIVED, 15.5, prompt_tokens=2000)) is Outcome.APPLIED
    assert ("tool", "bash", 0, 6.0) in rec.calls
    assert tr.get("t").state is TrajState.READY and tr.get("t").turn == 1


def test_memory_stays_bounded_over_many_trajectories():
    tr = TrajectoryTracker()
    n = 100_000
    for i in range(n):
        tr.apply(ev(f"t{i}", K.SAMPLED, i))
        tr.apply(ev(f"t{i}", K.ABORTED, i + 0.5))
    assert tr.live_count == 0 and tr.finished_total == n
    assert len(tr._finished) == FINISHED_IDS_REMEMBERED
    assert all(len(d) == 0 for d in tr._by_state.values())


def test_group_bookkeeping():
    tr = TrajectoryTracker()
    tr.apply(ev("a", K.REWARD_START, 0, group_id="g"))
    tr.apply(ev("b", K.TOOL_START, 0, group_id="g"))
    assert tr.group_waiting_outside_reward("g")
    tr.apply(ev("b", K.REWARD_START, 1))
    assert not tr.group_waiting_outside_reward("g")
    tr.apply(ev("a", K.REWARD_END, 2))
    tr.apply(ev("b", K.ABORTED, 3))
    assert tr._group_live == {} and tr._group_reward == {}


def test_abort_during_reward_is_censored_and_load_buckets():
    rec = Recorder()
    tr = TrajectoryTracker([rec])
    tr.apply(ev("a", K.REWARD_START, 0, task="m"))
    tr.apply(ev("a", K.ABORTED, 4))
    assert rec.calls == [("reward_aborted", "m", 4.0)]
    assert [load_bucket(n) for n in (0, 1, 3, 4, 15, 16, 64)] == [0, 1, 1, 2, 2, 3, 4]


def test_a_late_tool_end_after_the_next_request_is_an_implied_duplicate_not_an_error():
    """The trainer's tool_end and the engine's request_arrived race: the request implies the tool ended."""
    from sglang_prorsa.policy.lifecycle.events import EventKind, LifecycleEvent
    from sglang_prorsa.policy.lifecycle.observers import Outcome
    from sglang_prorsa.policy.lifecycle.tracker import TrajectoryTracker

    tr = TrajectoryTracker()
    for i, (kind, extra) in enumerate([(EventKind.SAMPLED, {}), (EventKind.REQUEST_ARRIVED, {"prompt_tokens": 10}),
                                       (EventKind.PREFILL_END, {}), (EventKind.DECODE_END, {}),
                                       (EventKind.TOOL_START, {}), (EventKind.REQUEST_ARRIVED, {"prompt_tokens": 20})]):
        assert tr.apply(LifecycleEvent(trajectory_id="t", kind=kind, ts=float(i), **extra)) is Outcome.APPLIED
    late = tr.apply(LifecycleEvent(trajectory_id="t", kind=EventKind.TOOL_END, ts=5.5))
    assert late is Outcome.DUPLICATE and tr.rejected_count == 0


def test_the_engines_late_report_of_a_response_the_trainer_acted_on_does_not_rewind_it():
    """The engine batches its events; the trainer's tool_start can overtake all of them. Both stamp when things
    happened, so the engine's older events are recognised as late and the trajectory stays in its tool."""
    tr = TrajectoryTracker()
    assert tr.apply(ev("t", K.SAMPLED, 0)) is Outcome.APPLIED
    assert tr.apply(ev("t", K.REQUEST_ARRIVED, 1, prompt_tokens=10)) is Outcome.APPLIED  # the trainer's own copy
    assert tr.apply(ev("t", K.TOOL_START, 4, tool="bash")) is Outcome.APPLIED  # from READY: the engine is late
    for kind, ts in [(K.REQUEST_ARRIVED, 1.01), (K.PREFILL_START, 1.01), (K.PREFILL_END, 2), (K.DECODE_END, 3)]:
        assert tr.apply(ev("t", kind, ts, prompt_tokens=10) if kind is K.REQUEST_ARRIVED else ev("t", kind, ts)) \
            is Outcome.DUPLICATE
    assert tr.get("t").state is TrajState.TOOL and tr.rejected_count == 0
    # The next request (stamped after the tool started) is not late.
    assert tr.apply(ev("t", K.REQUEST_ARRIVED, 9, prompt_tokens=30)) is Outcome.APPLIED
    assert tr.get("t").state is TrajState.READY
    # Receipt-stamped states (a sender that gave no ts) never make later events late.
    tr.apply(LifecycleEvent("u", K.SAMPLED), 20.0)  # ts None: stamped on receipt
    assert tr.get("u").stamped is False


def test_decode_ends_are_counted_once_each():
    # the decode completion rate of the planner's wait rule (role_switch/waits.py) is read from this counter
    tr = TrajectoryTracker()
    events = full_trajectory()
    for event in events[:7]:  # through the first decode_end
        tr.apply(event)
    assert tr.decode_ends_total == 1
    assert tr.apply(events[6]) is not Outcome.APPLIED  # the same decode_end again
    assert tr.decode_ends_total == 1
    for event in events[7:]:
        tr.apply(event)
    assert tr.decode_ends_total == 2 and tr.finished_total == 1
