"""The recipe that lets real SGLang 0.5.23 schedulers run on a machine with no CUDA device.

Observed on this kind of machine (see docs/ARCHITECTURE.md): the CPU engine must be selected by environment, the
PyPI ``sgl_kernel`` build needs a ``libcuda.so.1`` to load (a stub whose functions return an error code is enough),
and a fixed set of flags picks torch-native paths. Flags the user gave explicitly always win; every setting chosen here
is logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sglang_prorsa.srt.common.paths import cache_root

logger = logging.getLogger("sglang_prorsa.launch")

REPO_ROOT = Path(__file__).resolve().parents[2]
STUB_SOURCE = REPO_ROOT / "csrc" / "libcuda_stub.c"


@dataclass(frozen=True)
class FlagDefault:
    """One flag the recipe sets unless the user passed it: ``flag`` plus its value (None = a boolean switch)."""

    flag: str
    value: str | None
    why: str
    also: tuple[str, ...] = ()  # flags that, when given, already settle this one


CPU_FLAGS: tuple[FlagDefault, ...] = (
    FlagDefault("--device", "cpu", "no CUDA device"),
    FlagDefault("--attention-backend", "torch_native", "the only attention backend that runs on CPU"),
    FlagDefault("--sampling-backend", "pytorch", "flashinfer sampling needs CUDA"),
    FlagDefault("--cuda-graph-backend-decode", "disabled", "no CUDA graphs without CUDA", ("--disable-cuda-graph",)),
    FlagDefault("--cuda-graph-backend-prefill", "disabled", "no CUDA graphs without CUDA", ("--disable-cuda-graph",)),
    FlagDefault("--disable-overlap-schedule", None, "the overlap scheduler assumes CUDA streams"),
    FlagDefault("--grammar-backend", "none", "xgrammar's kernels need CUDA"),
    FlagDefault("--sleep-on-idle", None, "an idle scheduler otherwise spins a whole core"),
    # SGLang sizes the KV pool from free memory (72 % of the machine's RAM on CPU), which leaves no room for a second
    # server; a fixed token budget keeps several instances on one machine.
    FlagDefault("--max-total-tokens", "131072", "size the CPU KV pool by tokens, not by free RAM",
                ("--mem-fraction-static",)),
    # Even with a token budget SGLang checks that the RAM free after loading the weights exceeds (1 - fraction) of the
    # RAM free before; on a shared host another server starting meanwhile eats that margin and the start fails
    # ("Loaded weights leave no GPU memory for the KV cache", seen at the auto-picked 0.846 with five instances
    # starting). The pool is sized by --max-total-tokens, so the fraction only needs to keep that check passing.
    FlagDefault("--mem-fraction-static", "0.97", "the token budget sizes the pool; only keep SGLang's free-RAM check"),
)

# Decode servers on CPU: the default retraction backup registers host memory with CUDA and dies. Set everywhere:
# an instance a front starts as prefill may become decode, and the flag is inert on other servers.
CPU_DECODE_FLAGS: tuple[FlagDefault, ...] = (
    FlagDefault("--disaggregation-decode-retraction-backup", "cpu_tensor", "the default decode backup needs CUDA"),
)


def instance_threads(requested: int, instances_on_host: int) -> int:
    """Torch threads for each of ``instances_on_host`` CPU instances: ``requested`` if given, else the cores this
    process may use shared out, at least 1. Measured here (2 cores, 3 tiny-model instances, torch's default of one
    OpenMP thread per core in each): 6 requests on each of 3 instances took 19.6 s against 0.8 s on one instance
    alone; with one thread each, 1.6 s. Each team spins on cores the others need."""
    if requested > 0:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, instances_on_host))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def given(argv: list[str], flag: str) -> bool:
    """Did the user pass ``flag`` (as ``--flag``, ``--flag value`` or ``--flag=value``)?"""
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


def apply_cpu_flags(argv: list[str]) -> list[str]:
    """Return argv with the recipe's flags added where the user did not give them (each one logged)."""
    out = list(argv)
    defaults = list(CPU_FLAGS) + list(CPU_DECODE_FLAGS)
    for d in defaults:
        mine = next((f for f in (d.flag, *d.also) if given(argv, f)), None)
        if mine:
            logger.info("CPU recipe: keeping your %s", mine)
            continue
        out += [d.flag] if d.value is None else [d.flag, d.value]
        logger.info("CPU recipe: %s%s (%s)", d.flag, "" if d.value is None else f" {d.value}", d.why)
    return out


def build_libcuda_stub(cache: Path | None = None) -> Path:
    """Compile ``csrc/libcuda_stub.c`` with gcc into the cache (``paths.cache_root()`` unless given; once per source
    hash); return its directory."""
    cache = cache_root() if cache is None else Path(cache)
    src = STUB_SOURCE.read_bytes()
    out_dir = cache / "libcuda-stub" / hashlib.sha256(src).hexdigest()[:12]
    lib = out_dir / "libcuda.so.1"
    if lib.exists():
        return out_dir
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc) found: needed once to build the libcuda stub for sgl_kernel on CPU")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".libcuda.so.1.{os.getpid()}"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(STUB_SOURCE)],
                   check=True)
    os.replace(tmp, lib)
    (out_dir / "libcuda.so").unlink(missing_ok=True)
    (out_dir / "libcuda.so").symlink_to("libcuda.so.1")
    return out_dir


def cpu_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment SGLang needs on CPU; returns only the variables that must change."""
    changes: dict[str, str] = {}
    if env.get("SGLANG_USE_CPU_ENGINE") != "1":
        changes["SGLANG_USE_CPU_ENGINE"] = "1"  # otherwise rotary embedding imports vllm
    stub = str(build_libcuda_stub())
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    if stub not in paths:
        changes["LD_LIBRARY_PATH"] = ":".join([stub, *paths])
    return changes


def parallel_environment(tp_size: int, dp_size: int, env: dict[str, str], cores: int | None = None) -> dict[str, str]:
    """What tensor or data parallelism needs on CPU (SGLang 0.5.23); only the variables that must change, none for
    one rank. Variables the user set win.

    * ``SGLANG_CPU_OMP_THREADS_BIND``: without it SGLang refuses more ranks than NUMA nodes; each rank gets its own
      cores (``0|1`` for two ranks on two cores; the PyPI ``sgl_kernel`` only logs the binding).
    * ``SGLANG_NCCL_SO_PATH`` (TP > 1): on CPU SGLang still sets up pynccl for the TP group, which fails on a CPU
      device ("Expected a cuda device"); pointed at a library that does not exist, pynccl disables itself and the
      group all-reduces over gloo (checked: TP 2 output equals TP 1)."""
    ranks = max(1, tp_size) * max(1, dp_size)
    changes: dict[str, str] = {}
    if ranks > 1 and not env.get("SGLANG_CPU_OMP_THREADS_BIND"):
        changes["SGLANG_CPU_OMP_THREADS_BIND"] = threads_bind(ranks, cores or os.cpu_count() or 1)
    if tp_size > 1 and not env.get("SGLANG_NCCL_SO_PATH"):
        changes["SGLANG_NCCL_SO_PATH"] = str(cache_root() / "no-nccl-on-cpu" / "libnccl.so.2")  # never created
    return changes


def threads_bind(ranks: int, cores: int) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for ``ranks`` ranks over cores ``0..cores-1``: disjoint ranges while there are
    enough cores, else rank i on core ``i mod cores``."""
    if ranks > cores:
        return "|".join(str(i % cores) for i in range(ranks))
    per = cores // ranks
    return "|".join(f"{i * per}-{(i + 1) * per - 1}" if per > 1 else str(i) for i in range(ranks))
