"""The event queue orders actions by time, ties in scheduling order."""

from __future__ import annotations

import heapq
import itertools
import random

from sglang_prorsa.sim.events import EventQueue


def test_ties_run_in_scheduling_order_and_an_action_due_now_runs_after_those_already_due():
    q, seen = EventQueue(), []

    def log(name, then=None):
        def action(t):
            seen.append((t, name))
            if then:
                then(t)
        return action

    q.at(2.0, log("b1", lambda t: q.at(t, log("b3"))))  # scheduled at 2.0 while 2.0 runs: after b2
    q.at(1.0, log("a"))
    q.at(2.0, log("b2", lambda t: q.at(0.5, log("past"))))  # in the past: clamped to now, after b3
    q.at(3.0, log("c"))
    assert len(q) == 4
    q.run(until=10.0)
    assert seen == [(1.0, "a"), (2.0, "b1"), (2.0, "b2"), (2.0, "b3"), (2.0, "past"), (3.0, "c")]
    assert q.processed == 6 and len(q) == 0


def test_run_stops_at_until_and_after_stop_and_continues_where_it_left():
    q, seen = EventQueue(), []
    for t, name in ((1.0, "a"), (1.0, "b"), (1.0, "c"), (5.0, "d")):
        q.at(t, lambda now, name=name: (seen.append(name), name == "a" and q.stop()))
    q.run(until=10.0)  # stop() after "a": "b" and "c" stay due at 1.0
    assert seen == ["a"] and q.now == 1.0 and len(q) == 3
    q.stopped = False
    q.run(until=4.0)
    assert seen == ["a", "b", "c"] and q.now == 4.0 and len(q) == 1  # "d" left queued, the clock at ``until``
    q.run(until=10.0)
    assert seen == ["a", "b", "c", "d"] and q.now == 5.0 and q.processed == 4


def test_the_order_is_a_tuple_heaps_on_random_schedules_with_many_ties():
    """The (time, sequence) order of a heap of tuples, on 2,000 actions at 40 distinct times, half scheduled by
    running actions."""
    rng = random.Random(7)
    q, seen, reference, seq = EventQueue(), [], [], itertools.count()

    def schedule(t, depth):
        name = next(seq)
        heapq.heappush(reference, (max(t, q.now), name))  # the tuple heap's key, clamped as ``at`` does

        def action(now):
            seen.append((now, name))
            if depth < 3 and rng.random() < 0.5:
                schedule(now + rng.choice((0.0, 0.0, 1.0, 2.5)), depth + 1)
        q.at(t, action)

    for _ in range(1000):
        schedule(float(rng.randrange(40)), 0)
    q.run(until=1e9)
    assert len(seen) == q.processed >= 1000
    assert seen == sorted(seen)  # times non-decreasing, ties in scheduling (sequence) order
    assert sorted(seen) == sorted(reference)
