"""How many GPUs one engine instance occupies, from its own SGLang arguments: what it reports (``gpus`` of
``GET /prorsa/status``), what Eq. 1's G counts (``Instance.gpus``) and what a front places (``controller/placement.py``).
"""

from __future__ import annotations

from typing import Any

from sglang_prorsa.srt.common.parallel import scheduler_processes


def instance_gpus(args: Any) -> int:
    """The GPUs one instance with SGLang's parsed record ``args`` (a ``ServerArgs``) occupies on its node."""
    # Attention DP (--attn-dp-size, or the deprecated --enable-dp-attention --dp-size N that SGLang turns into it)
    # splits the tensor-parallel group; only data-parallel replicas (plain --dp-size) take GPUs of their own.
    return scheduler_processes(args)
