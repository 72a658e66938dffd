"""Bounded memory (issue 14 item 5): every map the control plane keeps stays bounded as trajectories pass through."""

import gc
import os

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.lifecycle import tracker as tracker_module
from sglang_prorsa.policy.lifecycle.events import EventKind as K
from sglang_prorsa.policy.lifecycle.events import LifecycleEvent
from sglang_prorsa.policy.lifecycle.tracker import MAX_TOOLS

BATCH = 1_000


def _pass_through(cp: LifecycleControlPlane, clock: ManualClock, first: int, count: int) -> None:
    """``count`` trajectories, each: queued, prefilled, decoded for a while, dropped; a refresh every batch."""
    for start in range(first, first + count, BATCH):
        t = start * 0.01
        clock.set(t)
        events = []
        for i in range(start, start + BATCH):
            tid, g = f"t{i}", f"g{i // 8}"
            events += [LifecycleEvent(tid, K.REQUEST_ARRIVED, ts=t, prompt_tokens=1000, group_id=g, task=f"task{i % 3}"),
                       LifecycleEvent(tid, K.PREFILL_END, ts=t + 0.001),
                       LifecycleEvent(tid, K.ABORTED, ts=t + 0.002 + (i % 7))]
        cp.ingest(events)
        cp.tick()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_does_not_grow_with_the_number_of_trajectories(monkeypatch):
    # A small finished-id memory so that a short warm-up fills every bounded structure (the benchmark
    # bench_predictor.py runs 1,000,000 trajectories through the real one). Resident memory, not tracemalloc:
    # tracing every allocation made this test take half a minute.
    monkeypatch.setattr(tracker_module, "FINISHED_IDS_REMEMBERED", 1024)
    clock = ManualClock(0.0)
    cp = LifecycleControlPlane(clock, PredictorConfig(horizon_s=1.0, history_per_class=128))
    _pass_through(cp, clock, 0, 10_000)
    gc.collect()
    before = _rss_bytes()
    _pass_through(cp, clock, 10_000, 40_000)
    gc.collect()
    growth = _rss_bytes() - before
    assert cp.tracker.live_count == 0 and cp.tracker.finished_total == 50_000
    sizes = cp.tracker.memory_footprint()
    assert sizes["finished_ids"] == 1024 and sizes["groups"] == 0
    assert sizes["slots"] <= 2048 and sizes["tasks"] == 4  # three names + the shared overflow id
    # keeping as little as 100 bytes per trajectory would show: 4 MB over these 40,000
    assert growth < 2 * 1024 * 1024, f"resident memory grew {growth} bytes over 40,000 more trajectories"


def test_names_are_capped():
    cp = LifecycleControlPlane(ManualClock(0.0))
    cp.ingest([LifecycleEvent(f"x{i}", K.TOOL_START, ts=0.0, tool=f"tool-{i}") for i in range(MAX_TOOLS + 50)])
    assert len(cp.tracker.tools) == MAX_TOOLS + 1  # the names beyond the cap share one id
    cp.forecast()
