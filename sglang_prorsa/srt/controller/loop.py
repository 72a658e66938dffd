"""The controller's background work: watch the instances, and every control interval turn the forecast into a
target ratio (Eq. 1) and the planned switches into busy switches.

Nothing here runs on a request's path: instance polls are background tasks with short timeouts, the forecast is
computed in a worker thread, and a switch is awaited by the loop, not by any caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sglang_prorsa.config import ProrsaConfig
from sglang_prorsa.policy.clock import WallClock
from sglang_prorsa.policy.control_plane import LifecycleControlPlane
from sglang_prorsa.policy.role_switch.capacity import CannotDecide
from sglang_prorsa.policy.role_switch.controller import ControlInputs, ControllerConfig, RoleSwitchController
from sglang_prorsa.policy.role_switch.planner import PlannerConfig
from sglang_prorsa.policy.role_switch.theta import ThetaConfig, ThetaModel, ThetaSample
from sglang_prorsa.policy.role_switch.waits import CompletionRate
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.health import Health
from sglang_prorsa.srt.controller.http import Http
from sglang_prorsa.srt.controller.orchestrator import Orchestrator, SwitchRefused

logger = logging.getLogger(__name__)

POLL_EVERY_S = 1.0
# A decision lands this long after a forecast window closes: past the refresher's lag (REFRESH_INTERVAL_S), so the
# forecast it reads holds the window that just ended.
AFTER_WINDOW_S = 0.5
POLL_TIMEOUT_S = 5.0
MISSED_CHECKS_UNHEALTHY = 3
# Prefill speed to assume before any busy interval has been measured (tokens/s/instance); CPU-sized.
PROFILED_THETA_P = 2000.0


class ControlLoop:
    def __init__(self, config: ProrsaConfig, registry: Registry, orchestrator: Orchestrator,
                 control_plane: LifecycleControlPlane, http: Http, health: Health) -> None:
        if control_plane.config.horizon_s != config.prorsa_horizon_s:  # one S: the forecast's is Eq. 1's
            raise ValueError(f"the control plane's horizon ({control_plane.config.horizon_s:g} s) is not "
                             f"--prorsa-horizon ({config.prorsa_horizon_s:g} s): build it with control_plane_for")
        self.config = config
        self.health = health
        self.registry = registry
        self.orchestrator = orchestrator
        self.control_plane = control_plane
        self.http = http
        clock = WallClock()
        # θ (issue 11): a continuous model of the prefill schedulers' own busy intervals, from this prior until
        # measured; never the front's PD round trips (they time transfers, not prefill).
        self.theta = ThetaModel(ThetaConfig(per_new_token_s=1.0 / PROFILED_THETA_P, reference_prompt_tokens=1024.0))
        planner = PlannerConfig(min_dwell_s=config.prorsa_min_dwell_s, hysteresis=config.prorsa_hysteresis,
                                dwell_switch_costs=config.prorsa_dwell_switch_costs,
                                wait_balance=config.prorsa_wait_rule)
        self.controller = RoleSwitchController(ControllerConfig(horizon_s=config.prorsa_horizon_s, planner=planner),
                                               self.theta, clock)
        self.decisions = 0
        self.held_ticks = 0
        self.cannot_decide: dict[str, str] | None = None  # why the last tick could not decide (code, error)
        self.busy_intervals = 0
        self.last_tick_at: float | None = None  # time.monotonic() of the last decision
        self.decode_rate = CompletionRate()  # decode completions per second, for the planner's wait rule (waits.py)
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._poll_forever()))
        self._tasks.append(loop.create_task(self.health.watch_forever()))
        if self.config.switching:
            self._tasks.append(loop.create_task(self._control_forever()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()

    # -- watching instances -----------------------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:
                logger.exception("instance poll failed")
            await asyncio.sleep(POLL_EVERY_S)

    async def poll(self) -> None:
        await asyncio.gather(*(self._poll_one(i) for i in self.registry
                               if i.state not in (State.DEAD, State.STARTING)))

    async def _poll_one(self, inst: Instance) -> None:
        try:
            status, st = await self.http.get(f"{inst.url}/prorsa/status?since={inst.busy_seq}",
                                             timeout_s=POLL_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            status, st = 0, {"error": str(e)}
        if status != 200:
            inst.missed_checks += 1
            if inst.missed_checks >= MISSED_CHECKS_UNHEALTHY and inst.state is State.ACTIVE:
                logger.warning("instance %s failed %d checks: unhealthy", inst.instance_id, inst.missed_checks)
                self.registry.set_state(inst, State.UNHEALTHY)
                await self.orchestrator.push_peers()
                if inst.role == "prefill":  # what waits for its KV would wait for a timeout: continue it elsewhere
                    await self.health.notify_decodes(inst, dead=False)
            return
        inst.missed_checks = 0
        inst.last_seen = time.time()
        inst.running, inst.queued = int(st.get("running", 0)), int(st.get("queued", 0))
        inst.take_gpus(st.get("gpus"))  # Eq. 1's G counts what the instance reports (registered from anywhere)
        inst.kv_footprint_tokens = int(st.get("kv_footprint_tokens", 0))
        inst.kv_capacity_tokens = int(st.get("kv_capacity_tokens", 0))
        inst.prefix_cache_tokens = int(st.get("prefix_cache_tokens", 0))
        for interval in st.get("busy_intervals") or []:
            seq = int(interval["seq"])
            if seq <= inst.busy_seq:
                continue  # seen already (a poll raced a restart's renumbering)
            inst.busy_seq = seq
            self.busy_intervals += 1
            self._observe(inst, interval)
        if inst.state is State.UNHEALTHY and st.get("role") == inst.role:
            logger.info("instance %s answers again: active", inst.instance_id)
            inst.epoch += 1  # it may have restarted behind the same address: decode instances re-learn it
            self.registry.set_state(inst, State.ACTIVE)
            await self.orchestrator.push_peers()

    def _observe(self, inst: Instance, interval: dict[str, Any]) -> None:
        """One prefill busy interval (idle -> busy -> idle) of a scheduler -> one θ sample."""
        if interval.get("role") != "prefill" or int(interval.get("requests", 0)) <= 0:
            return
        try:
            sample = ThetaSample(inst.instance_id, int(interval["new_tokens"]), int(interval["cached_tokens"]),
                                 int(interval["requests"]), float(interval["seconds"]))
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("busy interval of %s ignored: %s", inst.instance_id, e)
            return
        self.controller.observe(sample)

    # -- deciding -----------------------------------------------------------------------------------------------------
    async def _control_forever(self) -> None:
        while True:
            await asyncio.sleep(self.next_tick_in())
            try:
                await self.tick()
            except CannotDecide:
                pass  # logged by tick when the reason changes; the next interval tries again
            except Exception:
                logger.exception("control tick failed; retrying next interval")

    def next_tick_in(self) -> float:
        """Seconds to the next decision. When decisions follow the horizon (the default), each lands
        ``AFTER_WINDOW_S`` after a forecast window closes: persistence and the other members of the served forecast
        then include the window that just ended. Ticking on the loop's own phase, a decision could come just before
        the window closed and act on a forecast one window old (a prefill surge seen ten seconds late). A set
        ``--prorsa-control-interval`` other than S keeps its own period."""
        interval = self.config.control_interval_s
        until = self.control_plane.seconds_to_next_window()
        if until is None or interval != self.config.prorsa_horizon_s:
            return interval
        delay = max(0.0, until + AFTER_WINDOW_S)
        since = time.monotonic() - self.last_tick_at if self.last_tick_at is not None else interval
        while since + delay < interval / 2:  # not twice for one window
            delay += interval
        return min(delay, 1.5 * interval)

    async def tick(self) -> dict[str, Any]:
        """Forecast -> Eq. 1 -> plan -> busy switches, once (held while a control operation holds switches: a
        paused trainer is not low demand)."""
        self.last_tick_at = time.monotonic()
        forecast = await asyncio.to_thread(self.control_plane.forecast)
        if self.orchestrator.held_by:
            self.held_ticks += 1
            return {"held_by": self.orchestrator.held_by, "forecast": forecast.to_dict(), "executed": []}
        src = forecast.sources
        self.decode_rate.observe(self.last_tick_at, self.control_plane.tracker.decode_ends_total)
        control = ControlInputs(
            forecast.prefill_tokens, forecast.decode_kv_tokens,
            prefill_backlog_tokens=min(forecast.prefill_tokens, max(0.0, float(src.backlog))),
            paused=bool(self.control_plane.tracker.paused), decode_completions_per_s=self.decode_rate.per_s())
        try:
            decision = self.controller.tick(control, self.registry.reports())
        except CannotDecide as e:
            if self.cannot_decide is None or self.cannot_decide["code"] != e.code:
                logger.warning("control tick cannot decide (%s): %s; trying again every %.0f s", e.code, e,
                               self.config.control_interval_s)
            self.cannot_decide = {"code": e.code, "error": str(e)}
            raise
        if self.cannot_decide is not None:
            logger.info("control ticks decide again (was: %s)", self.cannot_decide["code"])
            self.cannot_decide = None
        self.decisions += 1
        executed = []
        for sw in decision.plan.switches:
            try:
                executed.append(await self.orchestrator.switch(sw.instance_id, sw.dst.value))
            except SwitchRefused as e:
                logger.info("planned switch of %s skipped: %s", sw.instance_id, e)
        return {"decision": decision.to_dict(), "forecast": forecast.to_dict(), "executed": executed}

    def decision(self) -> dict[str, Any]:
        return {"decision": self.controller.last_decision(), "theta_p": self.controller.theta_snapshot(),
                "horizon_s": self.config.prorsa_horizon_s, "held_by": self.orchestrator.held_by,
                "held_ticks": self.held_ticks, "cannot_decide": self.cannot_decide}

