"""``python -m sglang_prorsa.launch_server [SGLang flags] [Prorsa flags]``.

Every ``sglang.launch_server`` flag passes through unchanged. On top:

- no ``--model-path``: serve the embedded default, a small random-weight Llama generated locally into a cache;
- no CUDA device: apply the CPU recipe (flags, environment, libcuda stub; see ``srt/cpu_recipe.py``), logging each
  setting; flags given explicitly win;
- ``--pd-adaptive`` / ``--pd-static P:D`` / ``--pd-colocated N``: start the front (a thin relay plus the controller)
  with its own engine instances instead of one server (``srt/controller/launcher.py``);
- ``--prorsa-controller URL``: one engine instance that registers with a controller (on this or another machine).

``launch_server(server_args, ...)`` below serves the same instance from a function with the signature of SGLang's
``sglang.srt.entrypoints.http_server.launch_server``: a framework that starts its engines by calling SGLang's (slime)
switches by changing that one import.

Our flags are parsed once into a frozen ``ProrsaConfig`` (``sglang_prorsa/config.py``) and handed down whole.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

from sglang_prorsa.config import (
    ADDRESS_VARIABLES,
    LOOPBACK,
    ConfigError,
    InstanceSpec,
    Mode,
    ProrsaConfig,
    add_prorsa_flags,
    address_variables,
    advertise_host,
    split_prorsa_flags,
)
from sglang_prorsa.srt import cpu_recipe

logger = logging.getLogger("sglang_prorsa.launch")

_REEXEC_MARK = "SGLANG_PRORSA_LAUNCH_ENV"  # set once the environment is ready (LD_LIBRARY_PATH needs a fresh exec)
PROG = "python -m sglang_prorsa.launch_server"


def build_parser() -> argparse.ArgumentParser:
    """SGLang's own parser with ``--model-path`` made optional, plus our flag group."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="SGLang server with sglang-prorsa's adaptive prefill-decode disaggregation. Every SGLang flag "
        "is accepted unchanged; the 'sglang-prorsa' group lists ours.",
    )
    ServerArgs.add_cli_args(parser)
    for action in parser._actions:
        if "--model-path" in action.option_strings:
            action.required = False
            action.help = (action.help or "") + " [sglang-prorsa: optional; default: the embedded tiny model]"
    add_prorsa_flags(parser)
    return parser


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _looks_like_local_path(path: str) -> bool:
    # A bare "org/name" may be a hub id (SGLang resolves those on machines that can reach a hub); anything else
    # names a local path, which must exist.
    return not _HUB_ID.match(path)


def check_model_path(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Fill in the embedded default model, or fail fast on a local model path that does not exist."""
    path = cpu_recipe.flag_value(argv, "--model-path")
    if path is None and not cpu_recipe.given(argv, "--model-path"):
        from sglang_prorsa.testing.tiny_model import ensure_default_model

        default = ensure_default_model()
        logger.info("no --model-path: serving the embedded default model at %s", default)
        argv = [*argv, "--model-path", str(default)]
        if not cpu_recipe.given(argv, "--dtype"):
            # The embedded model is stored in fp32; SGLang's "auto" would halve it to fp16, which CPUs run slowly.
            argv += ["--dtype", "float32"]
        return argv
    if path is None:
        parser.error("argument --model-path: expected one argument")
    expanded = os.path.expanduser(path)
    if not os.path.exists(expanded) and _looks_like_local_path(path):
        parser.error(f"argument --model-path: {path!r} does not exist (models are never downloaded here)")
    return argv


def prepare_environment(argv: list[str]) -> None:
    """Set the environment SGLang needs here; re-exec once if the dynamic loader must see a new library path."""
    if os.environ.get(_REEXEC_MARK) == "1":
        return
    try:
        host = advertised_host(argv)
    except ConfigError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        raise SystemExit(2) from None
    env = dict(os.environ)
    env[_REEXEC_MARK] = "1"
    env.update(address_environment(host, env))
    env.setdefault("MOONCAKE_PROTOCOL", "tcp")
    if not cpu_recipe.cuda_available():
        env["SGLANG_PRORSA_NO_CUDA"] = "1"
        for k, v in cpu_recipe.cpu_environment(env).items():
            logger.info("CPU recipe: %s=%s", k, v)
            env[k] = v
    os.execve(sys.executable, [sys.executable, "-m", "sglang_prorsa.launch_server", *argv], env)


def advertised_host(argv: list[str]) -> str:
    """The one address this process advertises (its instance URL, PD bootstrap and Mooncake endpoints), from the
    flags (``config.advertise_host``): a front's is its instances' ``--prorsa-instance-host`` (each instance it starts
    gets its own spec's, ``launcher.start_instance``); a server's, the host of ``--prorsa-advertise-url``, else
    ``--host``. ``--host 0.0.0.0`` names no address: refused (``ConfigError`` naming ``--prorsa-advertise-url``) for
    an instance others must reach (it registers with a controller, or serves a PD role), else loopback."""
    config, _ = split_prorsa_flags(argv)
    if config.mode in (Mode.ADAPTIVE, Mode.STATIC, Mode.COLOCATED):
        return advertise_host(config.prorsa_instance_host)
    host = cpu_recipe.flag_value(argv, "--host") or LOOPBACK  # SGLang's default --host
    pd = (cpu_recipe.flag_value(argv, "--disaggregation-mode") or "null").lower() in ("prefill", "decode")
    required_by = ("on an instance that registers with --prorsa-controller" if config.mode is Mode.INSTANCE
                   else "on a PD server (--disaggregation-mode)" if pd else "")
    return advertise_host(host, config.prorsa_advertise_url, required_by=required_by)


def address_environment(host: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables through which SGLang (``SGLANG_HOST_IP``: the address its PD bootstrap and KV
    transfer endpoints advertise) and Mooncake's transfer engine (``MC_TCP_BIND_ADDRESS``) learn the address this
    process advertises. They are set here for those two to read, always derived from the flags
    (``advertised_host``); our own code never reads them back (it uses ``InstanceSpec.advertise_host``). A different
    value already in ``environ`` is replaced, with a warning."""
    for name in ADDRESS_VARIABLES:
        was = (environ or {}).get(name)
        if was is not None and was != host:
            logger.warning("%s=%s in the environment replaced by %s (from --host / --prorsa-advertise-url / "
                           "--prorsa-instance-host)", name, was, host)
    return address_variables(host)


def instance_spec(config: ProrsaConfig, sglang_argv: list[str]) -> InstanceSpec:
    """The spec of the one instance this process serves (a single server, or one under a controller)."""
    from sglang.srt.server_args import prepare_server_args

    return spec_of(config, prepare_server_args(list(sglang_argv)), tuple(sglang_argv),
                   switchable=config.mode is Mode.INSTANCE)


def spec_of(config: ProrsaConfig, args, sglang_argv: tuple[str, ...], *, switchable: bool) -> InstanceSpec:
    """An instance's spec from SGLang's parsed record ``args`` (a ``ServerArgs``): its address, PD role and bootstrap
    port are read from it; ``switchable`` applies to a PD role only (a colocated instance never switches)."""
    role = str(args.disaggregation_mode or "null").lower()
    pd = role in ("prefill", "decode")
    return InstanceSpec(
        instance_id=config.prorsa_instance_id or f"{args.host}:{args.port}", host=args.host, port=args.port,
        role=role, bootstrap_port=args.disaggregation_bootstrap_port if pd else None,
        sglang_argv=sglang_argv, prorsa=config, controller_url=config.prorsa_controller,
        advertise_url=config.prorsa_advertise_url, switchable=pd and switchable,
        cpu_threads=config.prorsa_cpu_threads)


def check_kernels_importable() -> None:
    """A busy switch exports KV through ``sglang_prorsa.kernels`` (installed from ``kernels/``): a broken install must
    stop the launch here, not surface as a failed switch an hour into a rollout."""
    try:
        import sglang_prorsa.kernels  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"prorsa: cannot import the KV export/import kernels (sglang_prorsa.kernels): {e}. The "
                         "package install is broken (an editable install pointing at a removed checkout?); "
                         "reinstall it (make env)") from e


_KEYWORD_OF_FLAG = {"--prorsa-controller": "controller_url", "--prorsa-advertise-url": "advertise_url",
                    "--prorsa-cpu-threads": "cpu_threads", "--prorsa-mooncake-master": "mooncake_master"}


def instance_config(*, controller_url: str | None = None, instance_id: str | None = None,
                    advertise_url: str | None = None, kv_store: str = "file", kv_store_path: str = "",
                    mooncake_master: str = "", cpu_threads: int = 0) -> ProrsaConfig:
    """The frozen configuration of one instance started from a function (``launch_server``, ``Engine``): the
    keywords are our flags (``_KEYWORD_OF_FLAG``); a bad value raises ``ConfigError`` naming the keyword."""
    if kv_store not in ("file", "mooncake"):
        raise ConfigError("kv_store", f"must be 'file' or 'mooncake', got {kv_store!r}")
    if kv_store == "mooncake" and not mooncake_master:
        raise ConfigError("mooncake_master", "is required with kv_store='mooncake' (HOST:PORT of the mooncake_master "
                                             "the front and its instances share: GET /prorsa/info on the front)")
    config = ProrsaConfig(prorsa_controller=controller_url or "", prorsa_instance_id=instance_id or "",
                          prorsa_advertise_url=advertise_url or "", prorsa_kv_store=kv_store,
                          prorsa_kv_store_path=kv_store_path, prorsa_mooncake_master=mooncake_master,
                          prorsa_cpu_threads=cpu_threads)
    try:
        config.validate()
    except ConfigError as e:
        keyword = _KEYWORD_OF_FLAG.get(e.flag, e.flag)
        raise ConfigError(keyword, str(e).split(": ", 1)[1]) from None
    return config


def prepare_in_process(spec: InstanceSpec) -> None:
    """What an instance started from a function needs before SGLang starts its processes: the kernels importable,
    the address it advertises (``spec.advertise_host``, from ``advertise_url`` / SGLang's ``host``) in the two
    variables SGLang's PD bootstrap and Mooncake's transfer engine read in the processes SGLang starts next
    (``address_environment``), and on a host without CUDA the CPU recipe's environment for the scheduler processes
    (they read it at start; the libcuda stub on LD_LIBRARY_PATH reaches only processes started after this, so a
    caller on a CPU host sets the recipe's environment before it starts this process:
    tests/integration/slime_engine.py does)."""
    check_kernels_importable()
    os.environ.update(address_environment(spec.advertise_host, dict(os.environ)))
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1" and not cpu_recipe.cuda_available():
        os.environ.update(cpu_recipe.cpu_environment(dict(os.environ)))


def launch_server(server_args, *, controller_url: str | None = None, instance_id: str | None = None,
                  advertise_url: str | None = None, kv_store: str = "file", kv_store_path: str = "",
                  mooncake_master: str = "", cpu_threads: int = 0, switchable: bool = True) -> None:
    """Serve one engine instance from SGLang's ``ServerArgs``, with our engine extension, until the server ends.

    The drop-in for ``sglang.srt.entrypoints.http_server.launch_server(server_args)`` (run it where that ran, e.g. in
    a ``multiprocessing.Process``). It serves what ``python -m sglang_prorsa.launch_server`` serves for the same
    flags, with two differences a caller that built its own record needs: ``server_args`` is taken as final (no
    embedded default model and no CPU flags are filled in: on a host without CUDA build it with the CPU recipe's
    flags, ``srt/cpu_recipe.py``), and a PD instance is switchable without ``controller_url`` (``switchable``), since
    the caller registers it with a controller itself (``POST /workers`` on the front, as slime posts to its router).
    The keywords are our flags: ``controller_url`` is ``--prorsa-controller`` (register and heartbeat; the instance's
    request events then go to that controller), ``kv_store`` / ``kv_store_path`` / ``mooncake_master`` where a
    switched request's KV goes (``mooncake`` under a front on other machines), ``advertise_url`` and
    ``instance_id`` how others reach and name it. Raises ``ConfigError`` naming the keyword for a bad value.
    """
    config = instance_config(controller_url=controller_url, instance_id=instance_id, advertise_url=advertise_url,
                             kv_store=kv_store, kv_store_path=kv_store_path, mooncake_master=mooncake_master,
                             cpu_threads=cpu_threads)
    spec = spec_of(config, server_args, (), switchable=switchable)
    prepare_in_process(spec)
    from sglang_prorsa.srt.instance.server import run_instance

    run_instance(spec, server_args=server_args)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s prorsa] %(message)s", datefmt="%H:%M:%S")
    parser = build_parser()
    # Validate everything (unknown flags, bad values, bad combinations) before anything is started or built.
    parser.parse_args(argv)
    try:
        split_prorsa_flags(argv)
    except ConfigError as e:
        parser.error(str(e))
    prepare_environment(argv)
    check_kernels_importable()

    argv = check_model_path(parser, argv)
    config, sglang_argv = split_prorsa_flags(argv)
    if os.environ.get("SGLANG_PRORSA_NO_CUDA") == "1":  # set by prepare_environment: what it detected
        sglang_argv = cpu_recipe.apply_cpu_flags(sglang_argv)
    if config.mode in (Mode.ADAPTIVE, Mode.STATIC, Mode.COLOCATED):
        from sglang.srt.server_args import prepare_server_args

        from sglang_prorsa.srt.common.auth import AuthKeys
        from sglang_prorsa.srt.controller.launcher import run_front

        front_args = prepare_server_args(list(sglang_argv))
        run_front(config, sglang_argv, host=front_args.host, port=front_args.port, keys=AuthKeys.of(front_args))
        return
    from sglang_prorsa.srt.instance.server import run_instance

    run_instance(instance_spec(config, sglang_argv))


if __name__ == "__main__":
    main()
