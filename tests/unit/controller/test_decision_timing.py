"""Control decisions land just after a forecast window closes (loop.py, ``ControlLoop.next_tick_in``): the forecast a
decision reads then holds the window that just ended. A decision on the loop's own phase could come just before the
close and act on a forecast one window old (the demo's prefill surge reached the controller ten seconds late)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sglang_prorsa.config import split_prorsa_flags
from sglang_prorsa.srt.controller.app import Front
from sglang_prorsa.srt.controller.loop import AFTER_WINDOW_S


def _loop(argv: list[str]):
    config, _ = split_prorsa_flags(argv)
    front = Front(config)
    asyncio.run(front.relay.close())
    asyncio.run(front.http.close())
    return front


@pytest.mark.parametrize("until, since_last, expected", [
    (None, None, 4.0),  # no window yet: the plain interval
    (3.0, None, 3.0 + AFTER_WINDOW_S),  # just after the open window closes
    (3.0, 1.0, 3.0 + AFTER_WINDOW_S),
    (1.0, 0.1, 1.0 + AFTER_WINDOW_S + 4.0),  # a decision 0.1 s ago: not twice for one window, the close after
    (-0.1, 9.9, AFTER_WINDOW_S - 0.1),  # the window is overdue (the refresher's lag), the last decision long ago
    (-0.6, 9.9, 0.0),  # overdue by more than the margin: at once
    (9.0, None, 6.0),  # a window further than one interval away (a trace clock that jumped): at most 1.5 intervals
])
def test_decisions_follow_window_closes(until, since_last, expected):
    front = _loop(["--pd-adaptive", "--prorsa-horizon", "4"])
    front.control_plane.seconds_to_next_window = lambda: until
    front.loop.last_tick_at = None if since_last is None else time.monotonic() - since_last
    assert front.loop.next_tick_in() == pytest.approx(expected, abs=0.05)


def test_a_set_control_interval_keeps_its_own_period():
    front = _loop(["--pd-adaptive", "--prorsa-horizon", "4", "--prorsa-control-interval", "2"])
    front.control_plane.seconds_to_next_window = lambda: 3.0
    assert front.loop.next_tick_in() == 2.0


def test_the_control_plane_reports_its_next_window_close():
    front = _loop(["--pd-adaptive", "--prorsa-horizon", "4"])
    plane = front.control_plane
    assert plane.seconds_to_next_window() is None  # before the first refresh
    plane.tick()  # the first window opens now and closes one horizon later
    assert 3.9 < plane.seconds_to_next_window() <= 4.0
    assert 3.9 + AFTER_WINDOW_S < front.loop.next_tick_in() <= 4.0 + AFTER_WINDOW_S
