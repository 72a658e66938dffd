"""Weight sync through the front: the two control calls that cannot be fanned out with one body, made right or
refused before any instance sees them (``control_ops.py`` fans out the rest as they came).

``POST /init_weights_update_group`` builds one torch process group over the trainer and every instance: the trainer
is rank 0 and each instance's GPUs take ranks ``rank_offset + tp_rank`` (SGLang 0.5.23,
``model_runner_components/weight_updater.py``). The same body sent to every instance would give them all the same
ranks and the group would never form, so the front assigns each instance its own ``rank_offset``: 1 plus the GPUs of
the instances before it, in registry order (the order ``GET /workers`` lists), an instance's GPUs being
``tp_size * pp_size`` from its ``/get_server_info`` (1 when it does not say). ``world_size`` must then be 1 plus all
their GPUs -- a trainer that counted otherwise would wait for ranks that never come, so it is refused with 400 naming
``world_size`` and the value expected. A ``rank_offset`` in the body is the front's to set: it is accepted only as
1, the offset a trainer written for one engine sends (and the one the first instance gets).

``POST /update_weights_from_tensor`` carries CUDA-IPC handles (``serialized_named_tensors``) that open only in the
process group of the GPU that made them: sent to several instances it cannot be right for all of them, so with more
than one live instance it is refused with 400 ``unsupported`` pointing to ``/update_weights_from_distributed`` or
``/update_weights_from_disk``; with one it goes through.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from fastapi.responses import JSONResponse

from sglang_prorsa.srt.common.http_utils import coded_error
from sglang_prorsa.srt.common.messages import Code

GROUP_PATH = "/init_weights_update_group"
TENSOR_PATH = "/update_weights_from_tensor"


@dataclass(frozen=True)
class Plan:
    """Per-instance bodies (instance id -> body) and what the front's answer adds for the caller."""

    bodies: dict[str, bytes]
    answer: dict[str, Any] = field(default_factory=dict)


def gpus_of(server_info: Any) -> int:
    """An instance's GPUs in a weight-update group: ``tp_size * pp_size`` of its ``/get_server_info``, else 1."""
    if not isinstance(server_info, dict):
        return 1
    total = 1
    for key in ("tp_size", "pp_size"):
        value = server_info.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            total *= value
    return total


def rank_offsets(gpus: list[int]) -> list[int]:
    """Each instance's first rank: the trainer is rank 0, then every instance's GPUs in turn."""
    out, first = [], 1
    for n in gpus:
        out.append(first)
        first += n
    return out


def check_group(body: dict[str, Any], gpus: list[int]) -> tuple[str, str, dict[str, Any]] | None:
    """What is wrong with an ``init_weights_update_group`` body for instances of ``gpus`` GPUs, as (field, message,
    detail); None when nothing is."""
    expected = 1 + sum(gpus)
    detail = {"world_size": expected, "rank_offsets": rank_offsets(gpus), "gpus": gpus}
    size = body.get("world_size")
    if not isinstance(size, int) or isinstance(size, bool):
        return "world_size", f"must be an integer: 1 (the trainer) + {sum(gpus)} instance GPUs = {expected}", detail
    if size != expected:
        return ("world_size", f"must be 1 (the trainer) + {sum(gpus)} GPUs of the {len(gpus)} instances = {expected}, "
                f"got {size}", detail)
    offset = body.get("rank_offset")
    if offset is not None and (offset != 1 or isinstance(offset, bool)):
        return ("rank_offset", f"is assigned by the front (each instance gets its own: {detail['rank_offsets']}); "
                f"leave it out or send 1, got {offset!r}", detail)
    return None


def group_bodies(body: dict[str, Any], ids: list[str], gpus: list[int]) -> dict[str, dict[str, Any]]:
    return {iid: {**body, "rank_offset": offset} for iid, offset in zip(ids, rank_offsets(gpus))}


async def _gpus(http: Any, inst: Any) -> int:
    try:
        status, info = await http.get(inst.url + "/get_server_info", timeout_s=30)
    except (OSError, asyncio.TimeoutError, aiohttp.ClientError):
        return inst.gpus
    if status == 200:
        inst.gpus = gpus_of(info)
    return inst.gpus


async def plan(front: Any, path: str, body: bytes, targets: list[Any]) -> Plan | JSONResponse | None:
    """The call's per-instance bodies, the refusal to answer instead, or None: the body goes to every instance as it
    came. Runs under the orchestrator's lock, over the instances the call is then sent to."""
    if path == TENSOR_PATH and len(targets) > 1:
        return coded_error(400, Code.UNSUPPORTED,
                           f"field 'serialized_named_tensors': tensors passed as CUDA-IPC handles open only on the "
                           f"GPU that made them and cannot reach {len(targets)} instances; use "
                           "/update_weights_from_distributed (a process group over every instance: "
                           "/init_weights_update_group) or /update_weights_from_disk",
                           field="serialized_named_tensors")
    if path != GROUP_PATH or not targets:
        return None
    payload = orjson.loads(body) if body else {}
    gpus = list(await asyncio.gather(*(_gpus(front.http, i) for i in targets)))
    problem = check_group(payload, gpus)
    if problem is not None:
        name, message, detail = problem
        return coded_error(400, Code.INVALID, f"field '{name}': {message}", field=name, detail=detail)
    ids = [i.instance_id for i in targets]
    bodies = {iid: orjson.dumps(b) for iid, b in group_bodies(payload, ids, gpus).items()}
    return Plan(bodies, {"rank_offsets": dict(zip(ids, rank_offsets(gpus))), "world_size": 1 + sum(gpus)})
