"""Curves kept between refreshes must not go stale (issue 10, refresh speed).

The refresh keeps, per duration class, the history's part of its survival curves (stores.py: ``DurationClass``'s
histograms, its ``CurveHistory`` and its complete-sample curve, all dropped by ``DurationClass.record``; the class
resolution tables, rebuilt when ``DurationStore.version`` moves; both keyed by the grid step). Each case here:

1. a predictor with a learned history and live trajectories forecasts at T1 (the curves of the classes its live
   items use are computed and kept);
2. events then change an input those curves are built from (new tool, decode or reward durations, aborted tools,
   a class reaching ``min_survival_samples``, a new horizon, hence a new grid step), and it forecasts at T2;
3. that forecast must equal, to 1e-12, the forecast at T2 of a fresh predictor fed every event from the start
   (nothing kept), and differ from the forecast at T1.

The changing events end phases that began before T1 and last longer than the live items' elapsed times at T2 (30 to
50 s): durations shorter than every live item's elapsed time leave each live item's conditional probability as it
was (only the class mean, which is not kept, would move), and a stale curve would go unnoticed.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from sglang_prorsa.policy.clock import ManualClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.forecast.config import PredictorConfig
from sglang_prorsa.policy.lifecycle.events import EventKind, LifecycleEvent

T1, T2 = 1000.0, 1030.0
CONFIG = PredictorConfig(default_prompt_tokens=4000, prefill_instances=("0", "1"), bias_enabled=False)
E = EventKind


def history() -> list[LifecycleEvent]:
    """Completed turns: decode, a tool (bash; edit for only 20 of them: below ``min_survival_samples``), the next
    request, reward; one in ten with long phases (30-90 s)."""
    rng, out = random.Random(3), []
    for i in range(200):
        t, tid = rng.uniform(0, 600), f"h{i}"
        d, tool_s, reward_s = rng.lognormvariate(2.0, 0.6), rng.lognormvariate(1.5, 0.7), rng.uniform(2, 20)
        if i % 10 == 5:  # a long tail: completions beyond the live items' elapsed times, where the curves matter
            d, tool_s, reward_s = rng.uniform(30, 90), rng.uniform(30, 90), rng.uniform(30, 90)
        tool = "edit" if i < 20 else "bash"
        out += [LifecycleEvent(tid, E.REQUEST_ARRIVED, ts=t, task="swe", prompt_tokens=3000, instance=str(i % 2)),
                LifecycleEvent(tid, E.PREFILL_END, ts=t + 0.2),
                LifecycleEvent(tid, E.DECODE_END, ts=t + 0.2 + d, output_tokens=int(20 * d)),
                LifecycleEvent(tid, E.TOOL_START, ts=t + 0.3 + d, tool=tool),
                LifecycleEvent(tid, E.TOOL_END, ts=t + 0.3 + d + tool_s),
                LifecycleEvent(tid, E.REQUEST_ARRIVED, ts=t + 0.5 + d + tool_s, prompt_tokens=4000),
                LifecycleEvent(tid, E.PREFILL_END, ts=t + 0.7 + d + tool_s),
                LifecycleEvent(tid, E.DECODE_END, ts=t + 5 + d + tool_s),
                LifecycleEvent(tid, E.REWARD_START, ts=t + 5 + d + tool_s),
                LifecycleEvent(tid, E.REWARD_END, ts=t + 5 + d + tool_s + reward_s, accepted=True)]
    return sorted(out, key=lambda e: e.ts)


def live() -> list[LifecycleEvent]:
    """Trajectories in a tool (bash and edit), decoding and in reward, started 0-20 s before T1; still there at T2."""
    rng, out = random.Random(4), []
    for i in range(120):
        t0, tid, kind = T1 - rng.uniform(0, 20), f"l{i}", i % 4
        if kind < 2:
            out.append(LifecycleEvent(tid, E.TOOL_START, ts=t0, task="swe", tool=("bash", "edit")[kind], turn=2))
        elif kind == 2:
            out += [LifecycleEvent(tid, E.REQUEST_ARRIVED, ts=t0, task="swe", prompt_tokens=5000, instance="0"),
                    LifecycleEvent(tid, E.PREFILL_END, ts=t0 + 0.1)]
        else:
            out.append(LifecycleEvent(tid, E.REWARD_START, ts=t0, task="swe"))
    return sorted(out, key=lambda e: e.ts)


def finishing(n: int, phase: str, *, tool: str = "bash", abort: bool = False,
              ) -> tuple[list[LifecycleEvent], list[LifecycleEvent]]:
    """``n`` trajectories that enter ``phase`` (tool, decode or reward) 40 s before T1 and leave it 45-65 s later
    (before T2): (the events up to T1, the rest). Their durations are longer than the live items' elapsed times at
    T2, so they change every live item's conditional probability; a tool can be ``abort``ed instead (a censored
    duration). After the phase: the next request, a short decode, a short reward, gone before T2."""
    before, after = [], []
    for i in range(n):
        t0, t1, tid = T1 - 40 + 0.01 * i, T1 + 5 + 0.5 * i, f"c{i}"
        if phase == "tool":
            before.append(LifecycleEvent(tid, E.TOOL_START, ts=t0, task="swe", tool=tool, turn=2))
            if abort:
                after.append(LifecycleEvent(tid, E.ABORTED, ts=t1))
                continue
            after += [LifecycleEvent(tid, E.TOOL_END, ts=t1),
                      LifecycleEvent(tid, E.REQUEST_ARRIVED, ts=t1 + 0.1, prompt_tokens=4000, instance="1")]
        elif phase == "decode":
            before += [LifecycleEvent(tid, E.REQUEST_ARRIVED, ts=t0, task="swe", prompt_tokens=4000, instance="1"),
                       LifecycleEvent(tid, E.PREFILL_END, ts=t0)]
            t1 -= 0.6  # the decode ends at t1 - 0.4
        elif phase == "reward":
            before.append(LifecycleEvent(tid, E.REWARD_START, ts=t0, task="swe"))
            after.append(LifecycleEvent(tid, E.REWARD_END, ts=t1, accepted=True))
            continue
        if phase == "tool":
            after.append(LifecycleEvent(tid, E.PREFILL_END, ts=t1 + 0.2))
        after += [LifecycleEvent(tid, E.DECODE_END, ts=t1 + 0.2 if phase == "decode" else t1 + 0.4,
                                 output_tokens=100),
                  LifecycleEvent(tid, E.REWARD_START, ts=t1 + 0.5),
                  LifecycleEvent(tid, E.REWARD_END, ts=t1 + 0.9, accepted=True)]
    assert max(e.ts for e in before) < T1 < min(e.ts for e in after) and max(e.ts for e in after) < T2
    return before, after


def plane(events: list[LifecycleEvent], config: PredictorConfig = CONFIG) -> LifecycleControlPlane:
    cp = LifecycleControlPlane(ManualClock(0.0), config)
    for event in events:
        cp.tracker.apply(event)
    return cp


def values(fc) -> dict[str, float]:
    """The forecast over S, per source (the admission horizon h* also depends on the previous forecast's load, which
    a fresh predictor has not made: the decode parts are left out)."""
    out = {"prefill_tokens": fc.prefill_tokens, "prefill_arrival_tokens": fc.prefill_arrival_tokens,
           "decode_kv_current_tokens": fc.decode_kv_current_tokens, "n_pass": fc.sampler.n_pass}
    for source, part in fc.arrivals.items():
        out[f"{source}.raw"], out[f"{source}.requests"] = part["raw"], part["requests"]
    return {k: float(v) for k, v in out.items()}


def assert_close(got: dict, want: dict, rel: float = 1e-12) -> None:
    assert got.keys() == want.keys()
    bad = {k: (got[k], want[k]) for k in got if abs(got[k] - want[k]) > rel * max(abs(want[k]), 1e-300)}
    assert not bad, f"kept curves went stale: (incremental, fresh) {bad}"


# (change, the forecast source it must move)
CHANGES = {
    "tool_durations": (lambda: finishing(40, "tool"), "tool"),
    "aborted_tools": (lambda: finishing(40, "tool", abort=True), "tool"),
    "decode_durations": (lambda: finishing(40, "decode"), "decode_return"),
    "reward_durations": (lambda: finishing(40, "reward"), "sampler"),
    # the (swe, edit) class reaches min_survival_samples: the edit tools' items move to their own class
    "class_reaches_min_samples": (lambda: finishing(12, "tool", tool="edit"), "tool"),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_forecast_after_a_change_equals_a_fresh_predictors(name):
    make_change, source = CHANGES[name]
    started, change = make_change()
    before = sorted(history() + live() + started, key=lambda e: e.ts)
    kept = plane(before)
    first = values(kept.predictor.forecast(T1))
    for event in change:
        kept.tracker.apply(event)
    second = values(kept.predictor.forecast(T2))
    fresh = values(plane(before + change).predictor.forecast(T2))
    assert_close(second, fresh)
    assert abs(second[f"{source}.raw"] - first[f"{source}.raw"]) > 1e-3 * first[f"{source}.raw"] > 0


def test_new_horizon_rebuilds_the_kept_curves_on_its_grid():
    """S = 10 s -> 20 s doubles the grid step (0.125 s -> 0.25 s): histograms and curves kept for the old step must
    not be read for the new one."""
    events = history() + live()
    longer = dataclasses.replace(CONFIG, horizon_s=20.0)
    kept = plane(events)
    first = values(kept.predictor.forecast(T1))
    kept.predictor.reconfigure(longer)
    second = values(kept.predictor.forecast(T1))
    assert_close(second, values(plane(events, longer).predictor.forecast(T1)))
    assert abs(second["tool.raw"] - first["tool.raw"]) > 1e-3 * first["tool.raw"] > 0


def test_refreshes_without_a_change_keep_the_same_numbers():
    """Control: with no event in between, the kept predictor and a fresh one agree too (the comparison is exact)."""
    events = history() + live()
    kept = plane(events)
    kept.predictor.forecast(T1)
    assert_close(values(kept.predictor.forecast(T2)), values(plane(events).predictor.forecast(T2)))
