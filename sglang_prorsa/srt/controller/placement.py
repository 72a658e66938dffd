"""Where a front's engine instances run on a GPU node: each on its own devices.

An instance's size is the GPUs its SGLang flags ask for (``instance_gpus``): ``--tp-size`` × ``--pp-size`` ×
``--dp-size`` (data-parallel replicas; attention DP -- ``--attn-dp-size``, or the deprecated ``--enable-dp-attention``
with ``--dp-size`` -- runs inside the tensor-parallel group and adds none). SGLang puts rank r of an instance on
visible device ``--base-gpu-id`` + r (``--gpu-id-step`` 1; a DP replica starts ``tp × pp`` further on), where the
index counts the devices ``CUDA_VISIBLE_DEVICES`` leaves visible. ``plan`` gives instance k the block starting at
``first + k × size``, ``first`` being the user's ``--base-gpu-id`` (0 unless given: the devices below it stay free,
e.g. for a trainer). The front appends ``--base-gpu-id B --gpu-id-step 1`` to each instance's flags (the last
occurrence wins in SGLang's parser), and refuses, before it starts anything, a node with too few visible GPUs, naming
the flag to change. On a host without CUDA nothing is placed and no flag is added.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sglang_prorsa.config import ConfigError, Mode, ProrsaConfig
from sglang_prorsa.srt.common.gpus import instance_gpus
from sglang_prorsa.srt.common.parallel import replicas

__all__ = ["PlacementSpec", "instance_gpus", "plan", "plan_front", "visible_gpus"]


@dataclass(frozen=True)
class PlacementSpec:
    """One instance's devices: SGLang's ``--base-gpu-id`` (an index into the visible devices) and its ``gpus``
    devices from there on; ``devices`` names them as ``CUDA_VISIBLE_DEVICES`` does (the indices when it is unset)."""

    base_gpu_id: int
    gpus: int
    devices: tuple[int, ...]

    def flags(self) -> list[str]:
        return ["--base-gpu-id", str(self.base_gpu_id), "--gpu-id-step", "1"]


def size_text(args: Any) -> str:
    parts = [f"--tp-size {max(int(args.tp_size or 1), 1)}"]
    if int(getattr(args, "pp_size", 1) or 1) > 1:
        parts.append(f"--pp-size {args.pp_size}")
    if replicas(args) > 1:
        parts.append(f"--dp-size {args.dp_size}")
    return " × ".join(parts)


def plan(visible_gpus: list[int] | int, n_instances: int, gpus_per_instance: int, first: int = 0, *,
         count_flag: str = "--prorsa-instances", size_flag: str = "--tp-size", size: str = "") -> list[PlacementSpec]:
    """Each of ``n_instances`` instances of ``gpus_per_instance`` GPUs on its own visible devices, from visible index
    ``first`` on. ``visible_gpus``: the visible devices as ``CUDA_VISIBLE_DEVICES`` names them, or their count.
    Raises ``ConfigError`` naming ``count_flag`` when the instances do not fit though one would, else ``size_flag``."""
    devices = list(range(visible_gpus)) if isinstance(visible_gpus, int) else list(visible_gpus)
    if gpus_per_instance < 1:
        raise ValueError(f"gpus_per_instance must be >= 1, got {gpus_per_instance}")
    need = first + n_instances * gpus_per_instance
    if need > len(devices):
        if first and first >= len(devices):
            raise ConfigError("--base-gpu-id", f"{first} is past the last of the {len(devices)} visible GPUs")
        seen = f"{len(devices)} visible GPU{'s' if len(devices) != 1 else ''}"
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            seen += f" (CUDA_VISIBLE_DEVICES={cvd})"
        start = f" from --base-gpu-id {first}" if first else ""
        each = f" ({size})" if size else ""
        if first + gpus_per_instance <= len(devices):
            fit = (len(devices) - first) // gpus_per_instance
            raise ConfigError(count_flag, f"{n_instances} instances of {gpus_per_instance} GPU(s) each{each} need "
                                          f"{need - first} GPUs{start}, but this node has {seen}: at most {fit} "
                                          f"fit; start fewer, or make each smaller")
        raise ConfigError(size_flag, f"one instance needs {gpus_per_instance} GPU(s){each}{start}, but this node has "
                                     f"{seen}")
    return [PlacementSpec(base_gpu_id=first + k * gpus_per_instance, gpus=gpus_per_instance,
                          devices=tuple(devices[first + k * gpus_per_instance:first + (k + 1) * gpus_per_instance]))
            for k in range(n_instances)]


def visible_gpus() -> list[int] | None:
    """The CUDA devices this process sees, named as ``CUDA_VISIBLE_DEVICES`` names them (their indices when it is
    unset or names them otherwise, e.g. by UUID); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    n = torch.cuda.device_count()  # already restricted to CUDA_VISIBLE_DEVICES
    names = [s.strip() for s in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if s.strip()]
    if len(names) >= n and all(s.isdigit() for s in names[:n]):
        return [int(s) for s in names[:n]]
    return list(range(n))


_COUNT_FLAG = {Mode.ADAPTIVE: "--prorsa-instances", Mode.STATIC: "--pd-static", Mode.COLOCATED: "--pd-colocated"}


def size_flag_of(args: Any) -> str:
    """The flag that makes one instance this large (named when even one does not fit)."""
    if replicas(args) > 1:
        return "--dp-size"
    if int(getattr(args, "pp_size", 1) or 1) > 1 and int(args.tp_size or 1) == 1:
        return "--pp-size"
    return "--tp-size"


def plan_front(config: ProrsaConfig, args: Any, visible: list[int] | int | None) -> list[PlacementSpec] | None:
    """The placement of the instances a front in ``config``'s mode starts, for SGLang's parsed record ``args`` of the
    user's flags and the ``visible`` devices (None: no CUDA, nothing placed). Raises ``ConfigError`` naming the flag."""
    if visible is None or config.instance_count == 0:
        return None
    if int(getattr(args, "gpu_id_step", 1) or 1) != 1:
        raise ConfigError("--gpu-id-step", "the front gives each instance its own contiguous devices (step 1); choose "
                                           "which devices it uses with CUDA_VISIBLE_DEVICES (and --base-gpu-id)")
    if int(getattr(args, "nnodes", 1) or 1) > 1:
        raise ConfigError("--nnodes", "a front starts its instances on its own node; an instance spanning nodes "
                                      "joins the front with --prorsa-controller instead")
    first = int(getattr(args, "base_gpu_id", 0) or 0)
    if first < 0:
        raise ConfigError("--base-gpu-id", f"must be >= 0, got {first}")
    return plan(visible, config.instance_count, instance_gpus(args), first,
                count_flag=_COUNT_FLAG.get(config.mode, "--prorsa-instances"), size_flag=size_flag_of(args),
                size=size_text(args))
