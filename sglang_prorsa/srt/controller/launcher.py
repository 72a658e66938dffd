"""``launch_server --pd-adaptive | --pd-static P:D | --pd-colocated N``: start the front's own engine instances, then
serve the front (relay + controller) on ``--host/--port``.

Each instance is a separate process (``python -m sglang_prorsa.srt.instance --spec FILE``) handed an ``InstanceSpec``
whole: the user's SGLang flags unchanged, plus the port, role and bootstrap port the front chose. Instances on other
machines join the same controller with ``launch_server --prorsa-controller URL`` (``--prorsa-instances 0`` starts
none here).
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_prorsa.config import ConfigError, InstanceSpec, Mode, ProrsaConfig, address_variables, advertise_host
from sglang_prorsa.srt.common.auth import AuthKeys
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller import placement
from sglang_prorsa.srt.controller.placement import PlacementSpec

logger = logging.getLogger("sglang_prorsa.front")

INSTANCE_MODULE = "sglang_prorsa.srt.instance"
READY_TIMEOUT_S = 900.0
PORT_RETRIES = 3
SHUTDOWN_GRACE_S = 15.0  # requests still open this long after SIGTERM are cut (their callers get an error)


def instance_specs(config: ProrsaConfig, sglang_argv: list[str], log_dir: Path, controller_url: str,
                   placements: list[PlacementSpec] | None = None) -> list[InstanceSpec]:
    """The specs of the instances this front starts; ``placements`` (``placement.plan_front``; None on a host
    without CUDA) gives instance k its devices: its flags end with ``--base-gpu-id B --gpu-id-step 1``, which win
    over the user's (the last occurrence is the one SGLang's parser keeps)."""
    from sglang_prorsa.srt.cpu_recipe import instance_threads
    from sglang_prorsa.srt.utils import processes

    specs = []
    threads = instance_threads(config.prorsa_cpu_threads, config.instance_count)  # used by instances on CPU only
    for k in range(config.instance_count):
        if config.mode is Mode.COLOCATED:
            role, bport = "null", None
        else:
            role = "prefill" if k < config.initial_prefill else "decode"
            bport = processes.free_port()
        argv = (*sglang_argv, *placements[k].flags()) if placements else tuple(sglang_argv)
        specs.append(InstanceSpec(instance_id=str(k), host=config.prorsa_instance_host, port=processes.free_port(),
                                  role=role, bootstrap_port=bport, sglang_argv=argv, prorsa=config,
                                  controller_url=controller_url, switchable=config.mode is Mode.ADAPTIVE,
                                  cpu_threads=threads))
    return specs


def place_instances(config: ProrsaConfig, sglang_argv: list[str]) -> list[PlacementSpec] | None:
    """Each instance's devices on this node (None: no CUDA, or none started here), decided before anything starts;
    too few visible GPUs ends the launch here with an error naming the flag to change."""
    if config.instance_count == 0 or config.prorsa_share_gpus:
        return None
    visible = placement.visible_gpus()
    if visible is None:
        return None
    from sglang.srt.server_args import prepare_server_args

    try:
        placements = placement.plan_front(config, prepare_server_args(list(sglang_argv)), visible)
    except ConfigError as e:
        sys.stderr.write(f"python -m sglang_prorsa.launch_server: error: {e}\n")
        raise SystemExit(2) from None
    for k, p in enumerate(placements or []):
        logger.info("instance %d: GPUs %s (--base-gpu-id %d, %d GPU%s)", k, ",".join(map(str, p.devices)),
                    p.base_gpu_id, p.gpus, "s" if p.gpus != 1 else "")
    return placements


def instance_environment(spec: InstanceSpec) -> dict[str, str]:
    """What an instance's process is started with beyond ours (``processes.loopback_env``): the address it advertises
    (``InstanceSpec.advertise_host``), for SGLang's PD bootstrap and Mooncake's transfer engine, which read it from
    these variables; our code never reads them back."""
    return address_variables(spec.advertise_host)


def start_instance(spec: InstanceSpec, log_dir: Path, attempt: int = 0):
    from sglang_prorsa.srt.utils import processes

    path = spec.dump(log_dir / f"instance-{spec.instance_id}.json")
    name = f"instance-{spec.instance_id}" + (f"-port-retry{attempt}" if attempt else "")
    return processes.start(["--spec", str(path)], name=name, port=spec.port, log_dir=log_dir,
                           module=INSTANCE_MODULE, die_with_parent=True, env=instance_environment(spec))


def ready_instance(spec: InstanceSpec, srv, log_dir: Path, started: dict) -> tuple[InstanceSpec, Any]:
    """Wait for one instance; one whose port another process bound first starts again on fresh ports, up to
    ``PORT_RETRIES`` times (``processes.ready_or_restarted``). ``started`` (instance id -> process) always holds the
    live attempt."""
    from sglang_prorsa.srt.utils import processes

    live = {"spec": spec}

    def restart(attempt: int):
        old = live["spec"]
        logger.warning("instance %s: port %d was taken before it could bind; starting it again on fresh ports "
                       "(attempt %d)", old.instance_id, old.port, attempt + 1)
        new = live["spec"] = replace(old, port=processes.free_port(), bootstrap_port=processes.free_port()
                                     if old.bootstrap_port is not None else None)
        started[new.instance_id] = proc = start_instance(new, log_dir, attempt)
        return proc

    srv, took = processes.ready_or_restarted(srv, restart, PORT_RETRIES, READY_TIMEOUT_S)
    logger.info("%s ready after %.1f s", srv.name, took)
    return live["spec"], srv


def wait_all_ready(specs: list[InstanceSpec], started: dict, log_dir: Path) -> list[InstanceSpec]:
    """Wait for every instance (``started``: instance id -> process, updated when one starts again); the specs they
    finally serve. If this process is told to stop meanwhile, stop them first (their waits then end at once instead
    of running to their timeout)."""
    ex = ThreadPoolExecutor(len(specs))
    try:
        return [spec for spec, _ in ex.map(lambda sp: ready_instance(sp, started[sp.instance_id], log_dir, started),
                                           specs)]
    except BaseException:
        from sglang_prorsa.srt.utils import processes

        processes.stop_many(list(started.values()), grace_s=1.0)
        raise
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def run_front(config: ProrsaConfig, sglang_argv: list[str], host: str, port: int, keys: AuthKeys = AuthKeys()) -> None:
    from sglang_prorsa.srt.controller.app import Front
    from sglang_prorsa.srt.utils import processes

    # uvicorn re-raises SIGTERM after its graceful shutdown; as SystemExit, `finally` stops what this front started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log_dir = Path(config.prorsa_log_dir or tempfile.mkdtemp(prefix="prorsa-instances-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    started: dict = {}  # instance id -> its process
    front = None
    master = None
    placements = place_instances(config, sglang_argv)  # refuses too few GPUs before anything starts
    try:
        if config.prorsa_kv_store == "mooncake" and not config.prorsa_mooncake_master:
            from sglang_prorsa.srt.disaggregation.mooncake_master import start_mooncake_master

            # Where the instances that register from other machines reach it: this front's own address.
            master = start_mooncake_master(log_dir=log_dir, bind=host or "0.0.0.0",
                                           advertise=advertise_host(host, config.prorsa_advertise_url))
            config = replace(config, prorsa_mooncake_master=master.address)
            logger.info("Mooncake Store master on %s", master.address)
        registry = Registry()
        # The instances report their requests' lifecycle to this front (its controller), not to one of their own.
        reachable = advertise_host(host, config.prorsa_advertise_url)
        specs = instance_specs(config, sglang_argv, log_dir, f"http://{reachable}:{port}", placements)
        for spec in specs:
            started[spec.instance_id] = start_instance(spec, log_dir)
        if started:
            logger.info("starting %d instances (logs in %s)", len(started), log_dir)
            specs = wait_all_ready(specs, started, log_dir)
        for k, spec in enumerate(specs):
            inst = registry.add(Instance(instance_id=spec.instance_id, url=spec.url, role=spec.role,
                                         bootstrap_host=spec.advertise_host, bootstrap_port=spec.bootstrap_port,
                                         started_here=True, pid=started[spec.instance_id].pid,
                                         gpus=placements[k].gpus if placements else 1))
            inst.take_gpus(reported_gpus(spec, keys))  # its own report, where it answers
        for inst in registry:
            registry.set_state(inst, State.ACTIVE)
        front = Front(config, registry, processes=dict(started),
                      specs={s.instance_id: s for s in specs}, keys=keys)
        serve(front, host, port)
    finally:
        if front is not None:
            front.health.stop()
        processes.stop_many(deployment_processes(started, front), grace_s=5.0)
        if master is not None:
            master.stop()


def reported_gpus(spec: InstanceSpec, keys: AuthKeys) -> object:
    """The GPU count an instance reports (``gpus`` of its ``GET /prorsa/status``); None when it does not answer."""
    import requests

    try:
        r = requests.get(spec.url + "/prorsa/status", timeout=10, headers=keys.admin_headers())
        return r.json().get("gpus") if r.status_code == 200 else None
    except (requests.RequestException, ValueError, AttributeError):
        return None


def deployment_processes(started: dict, front: Any) -> list:
    """Every instance process this front started, once each: the first ones, the ones serving now and every one a
    restart started (Health.restart replaces an instance's entry, and a restart ended by the stop is no entry)."""
    procs = [*started.values()]
    if front is not None:
        procs += [*front.processes.values(), *front.health.started]
    return list({p.pid: p for p in procs}.values())


def serve(front: Any, host: str, port: int) -> None:
    """``uvicorn.run``, except that the signal that stops the front also stops its instance restarts at once
    (``Health.stop``), before uvicorn's graceful wait for open requests: no restart starts while the front stops, and
    one still loading ends its process instead of keeping the front waiting for it (issue 29)."""
    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    from sglang_prorsa.srt.common.http_utils import SERVER_KEEPALIVE_S
    from sglang_prorsa.srt.controller.app import serve_app

    class FrontServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            front.health.stop()
            super().handle_exit(sig, frame)

    # SIGTERM must stop the deployment: uvicorn otherwise waits, without end, for every open request (a soak's
    # front sat through two SIGTERMs with requests in flight); after the grace, run_front's finally stops the instances.
    server = FrontServer(uvicorn.Config(serve_app(front), host=host, port=port, log_level="warning",
                                        access_log=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                                        timeout_keep_alive=SERVER_KEEPALIVE_S))
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run: Ctrl-C is an ordinary stop
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
