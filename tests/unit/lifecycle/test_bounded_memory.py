"""Bounded memory (issue 14 item 5): every map the control plane keeps stays bounded as trajectories pass through."""

import gc
import tracemalloc

from sglang_prorsa.srt.forecast.config import PredictorConfig
from sglang_prorsa.srt.lifecycle.control_plane import LifecycleControlPlane
from sglang_prorsa.srt.lifecycle.events import EventKind as K
from sglang_prorsa.srt.lifecycle.events import LifecycleEvent
from sglang_prorsa.srt.lifecycle.tracker import FINISHED_IDS_REMEMBERED, MAX_TOOLS
from sglang_prorsa.srt.utils.clock import ManualClock

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


def test_memory_does_not_grow_with_the_number_of_trajectories():
    clock = ManualClock(0.0)
    cp = LifecycleControlPlane(clock, PredictorConfig(horizon_s=1.0))
    _pass_through(cp, clock, 0, 70_000)  # beyond the finished-id memory (65,536): every bounded map is full
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _pass_through(cp, clock, 70_000, 70_000)
    gc.collect()
    growth = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert cp.tracker.live_count == 0 and cp.tracker.finished_total == 140_000
    sizes = cp.tracker.memory_footprint()
    assert sizes["finished_ids"] == FINISHED_IDS_REMEMBERED and sizes["groups"] == 0
    assert sizes["slots"] <= 2048 and sizes["tasks"] == 4  # three names + the shared overflow id
    assert growth < 512 * 1024, f"grew {growth} bytes over 70,000 more trajectories"


def test_names_are_capped():
    cp = LifecycleControlPlane(ManualClock(0.0))
    cp.ingest([LifecycleEvent(f"x{i}", K.TOOL_START, ts=0.0, tool=f"tool-{i}") for i in range(MAX_TOOLS + 50)])
    assert len(cp.tracker.tools) == MAX_TOOLS + 1  # the names beyond the cap share one id
    cp.forecast()
