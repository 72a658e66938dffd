"""``launch_server --pd-adaptive | --pd-static P:D | --pd-colocated N``: start the front's own engine instances, then
serve the front (relay + controller) on ``--host/--port``.

Each instance is a separate process (``python -m sglang_prorsa.srt.engine --spec FILE``) handed an ``InstanceSpec``
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
from pathlib import Path

from sglang_prorsa.config import InstanceSpec, Mode, ProrsaConfig
from sglang_prorsa.srt.auth import AuthKeys
from sglang_prorsa.srt.controller.registry import Instance, Registry, State

logger = logging.getLogger("sglang_prorsa.front")

INSTANCE_MODULE = "sglang_prorsa.srt.engine"
READY_TIMEOUT_S = 900.0


def instance_specs(config: ProrsaConfig, sglang_argv: list[str], log_dir: Path,
                   controller_url: str) -> list[InstanceSpec]:
    from sglang_prorsa.srt.utils import processes

    specs = []
    for k in range(config.instance_count):
        if config.mode is Mode.COLOCATED:
            role, bport = "null", None
        else:
            role = "prefill" if k < config.initial_prefill else "decode"
            bport = processes.free_port()
        specs.append(InstanceSpec(instance_id=str(k), host=config.prorsa_instance_host, port=processes.free_port(),
                                  role=role, bootstrap_port=bport, sglang_argv=tuple(sglang_argv), prorsa=config,
                                  controller_url=controller_url, switchable=config.mode is Mode.ADAPTIVE))
    return specs


def wait_all_ready(started: list) -> None:
    """Wait for every instance; if this process is told to stop meanwhile, stop them first (their waits then end at
    once instead of running to their timeout)."""
    ex = ThreadPoolExecutor(len(started))
    try:
        for srv, took in zip(started, ex.map(lambda s: s.wait_ready(timeout=READY_TIMEOUT_S), started)):
            logger.info("%s ready after %.1f s", srv.name, took)
    except BaseException:
        from sglang_prorsa.srt.utils import processes

        processes.stop_many(started, grace_s=1.0)
        raise
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def run_front(config: ProrsaConfig, sglang_argv: list[str], host: str, port: int, keys: AuthKeys = AuthKeys()) -> None:
    import uvicorn

    from sglang_prorsa.srt.controller.app import Front, build_app
    from sglang_prorsa.srt.utils import processes

    # uvicorn re-raises SIGTERM after its graceful shutdown; as SystemExit, `finally` stops what this front started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log_dir = Path(config.prorsa_log_dir or tempfile.mkdtemp(prefix="prorsa-instances-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    started: list = []
    front = None
    master = None
    try:
        if config.prorsa_kv_store == "mooncake" and not config.prorsa_mooncake_master:
            from dataclasses import replace

            from sglang_prorsa.srt.disaggregation.mooncake_master import start_mooncake_master

            master = start_mooncake_master(log_dir=log_dir)
            config = replace(config, prorsa_mooncake_master=master.address)
            logger.info("Mooncake Store master on %s", master.address)
        registry = Registry()
        # The instances report their requests' lifecycle to this front (its controller), not to one of their own.
        reachable = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        specs = instance_specs(config, sglang_argv, log_dir, f"http://{reachable}:{port}")
        for spec in specs:
            path = spec.dump(log_dir / f"instance-{spec.instance_id}.json")
            srv = processes.start(["--spec", str(path)], name=f"instance-{spec.instance_id}", port=spec.port,
                                  log_dir=log_dir, module=INSTANCE_MODULE, die_with_parent=True)
            started.append(srv)
            registry.add(Instance(instance_id=spec.instance_id, url=spec.url, role=spec.role,
                                  bootstrap_host=spec.host, bootstrap_port=spec.bootstrap_port, started_here=True,
                                  pid=srv.pid))
        if started:
            logger.info("starting %d instances (logs in %s)", len(started), log_dir)
            wait_all_ready(started)
        for inst in registry:
            registry.set_state(inst, State.ACTIVE)
        front = Front(config, registry, processes={s.instance_id: srv for s, srv in zip(specs, started)},
                      specs={s.instance_id: s for s in specs}, keys=keys)
        uvicorn.run(build_app(front), host=host, port=port, log_level="warning", access_log=False)
    finally:
        # Instances restarted while serving replace the ones started first (Health.restart).
        restarted = list(front.processes.values()) if front is not None else []
        processes.stop_many([*started, *restarted], grace_s=5.0)
        if master is not None:
            master.stop()
