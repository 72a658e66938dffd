"""``python -m sglang_prorsa.launch_server [SGLang flags] [Prorsa flags]``.

Every ``sglang.launch_server`` flag passes through unchanged. On top:

- no ``--model-path``: serve the embedded default, a small random-weight Llama generated locally into a cache;
- no CUDA device: apply the CPU recipe (flags, environment, libcuda stub; see ``srt/cpu_recipe.py``), logging each
  setting; flags given explicitly win;
- ``--pd-adaptive`` / ``--pd-static P:D`` / ``--pd-colocated N``: start the front (a thin relay plus the controller)
  with its own engine instances instead of one server (``srt/controller/launcher.py``);
- ``--prorsa-controller URL``: one engine instance that registers with a controller (on this or another machine).

Our flags are parsed once into a frozen ``ProrsaConfig`` (``sglang_prorsa/config.py``) and handed down whole.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

from sglang_prorsa.config import ConfigError, InstanceSpec, Mode, ProrsaConfig, add_prorsa_flags, split_prorsa_flags
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
    env = dict(os.environ)
    env[_REEXEC_MARK] = "1"
    # Nothing we start advertises more than loopback unless the user says otherwise.
    env.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    env.setdefault("MOONCAKE_PROTOCOL", "tcp")
    env.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    if not cpu_recipe.cuda_available():
        env["SGLANG_PRORSA_NO_CUDA"] = "1"
        for k, v in cpu_recipe.cpu_environment(env).items():
            logger.info("CPU recipe: %s=%s", k, v)
            env[k] = v
    os.execve(sys.executable, [sys.executable, "-m", "sglang_prorsa.launch_server", *argv], env)


def instance_spec(config: ProrsaConfig, sglang_argv: list[str]) -> InstanceSpec:
    """The spec of the one instance this process serves (a single server, or one under a controller)."""
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(list(sglang_argv))
    role = str(args.disaggregation_mode or "null").lower()
    pd = role in ("prefill", "decode")
    return InstanceSpec(
        instance_id=config.prorsa_instance_id or f"{args.host}:{args.port}", host=args.host, port=args.port,
        role=role, bootstrap_port=args.disaggregation_bootstrap_port if pd else None,
        sglang_argv=tuple(sglang_argv), prorsa=config, controller_url=config.prorsa_controller,
        advertise_url=config.prorsa_advertise_url, switchable=pd and config.mode is Mode.INSTANCE,
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
