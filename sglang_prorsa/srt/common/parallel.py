"""An instance's data-parallel layout, read from SGLang's server arguments (0.5.23) on either side of SGLang's own
resolution of them.

SGLang 0.5.23 spells attention DP ``--attn-dp-size N``; the deprecated ``--dp-size N --enable-dp-attention`` is
turned into it by SGLang's resolution (its resolved view has ``attn_dp_size = N``, ``dp_size = 1``, the flag cleared;
the record's attributes keep what was given). Every reading of the layout goes through these functions, which give
the same answer for both spellings, on the record as given and on SGLang's resolved view.
"""

from __future__ import annotations

from typing import Any


def _int(args: Any, name: str) -> int:
    return max(int(getattr(args, name, 1) or 1), 1)


def attention_dp(args: Any) -> bool:
    """Attention DP is on: the attention layers run data-parallel inside one tensor-parallel group."""
    return bool(getattr(args, "enable_dp_attention", False)) or _int(args, "attn_dp_size") > 1


def attention_groups(args: Any) -> int:
    """Attention-DP groups per replica (1 without attention DP): each has its own scheduler loop, queues and KV pool."""
    if _int(args, "attn_dp_size") > 1:
        return _int(args, "attn_dp_size")
    return _int(args, "dp_size") if getattr(args, "enable_dp_attention", False) else 1


def replicas(args: Any) -> int:
    """Plain data-parallel replicas (``--dp-size`` without attention DP): each takes GPUs of its own."""
    return 1 if getattr(args, "enable_dp_attention", False) else _int(args, "dp_size")


def dp_ranks(args: Any) -> int:
    """The DP ranks SGLang's DP controller starts: one scheduler group each, each with a control channel of ours."""
    return replicas(args) * attention_groups(args)


def scheduler_processes(args: Any) -> int:
    """Scheduler processes of one instance: TP ranks x PP stages x replicas (attention DP splits the TP group)."""
    return _int(args, "tp_size") * _int(args, "pp_size") * replicas(args)
