"""Instance performance model: how long one forward iteration of an engine instance takes, and KV transfer times.

An instance is one expert-parallel group with ``dp_ranks`` attention data-parallel ranks (§3.2) of one ``Shape``
(config.py; prefill and decode instances may differ: stage-specific parallelism). Each rank runs its own scheduler
and, per iteration, either a prefill chunk or a decode step over its running batch, as SGLang does without mixed
batches. MoE layers are collective across the ranks, so **an iteration of the instance lasts as long as its slowest
rank**: when one rank prefills a chunk while the others decode, the decoders wait. That wait is the colocation
interference of §3.2 / §5.3; with ``dp_ranks = 1`` there is none, and a PD-disaggregated decode instance still loses
time to cross-rank imbalance (metrics.py keeps the two apart).

Per-rank costs (parameters from the model config; fit.py fits them from measurements):

    prefill chunk of n new tokens after c tokens of context:  T_P = b_P + a_P*n + a_ctx*n*(c + n/2)
    decode step of B sequences holding C context tokens:      T_D = b_D + s_D*B + k_D*C

The attention term of T_P integrates the causal context over the chunk (token i attends to c + i tokens). A request of
x tokens with h cached is prefilled in ceil((x - h) / chunk) chunks (``prefill_request_s``).

KV transfer (P->D, and the persist / reload of a switch): a rank's KV is sharded over its GPUs (TP), each GPU sends its
shard over its own NIC (§5.1: one 400 Gbps NIC per GPU), so a rank moves ``gpus_per_rank x transfer_gbytes_per_s``;
transfers through the same rank's NICs queue (cluster.py keeps each rank's NIC busy-until time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sglang_prorsa.sim.config import ModelConfig, Shape

PROFILE_POINTS = (256, 1024, 4096, 8192, 16384, 32768, 65536, 131072)


class PerfModel:
    def __init__(self, model: ModelConfig, shape: Shape | None = None) -> None:
        self.model = model
        self.shape = shape or model.shape("same")
        self.chunk = model.chunk_tokens
        self.ranks = self.shape.dp_ranks
        self.gpus = self.shape.gpus_per_instance
        p, d = self.shape.prefill, self.shape.decode
        self._p = (p.iter_base_s, p.per_token_s, p.per_token_ctx_s)
        self._d = (d.iter_base_s, d.per_seq_s, d.per_ctx_token_s)
        self.rank_bytes_per_s = self.shape.gpus_per_rank * model.transfer_gbytes_per_s * 1e9

    # ----- per-rank iteration costs -----
    def prefill_iteration_s(self, new_tokens: float, context_before: float = 0.0) -> float:
        """One chunk of ``new_tokens`` on one rank, attending to ``context_before`` earlier tokens plus itself."""
        if new_tokens <= 0:
            return 0.0
        base, per_token, per_ctx = self._p
        return base + per_token * new_tokens + per_ctx * new_tokens * (context_before + new_tokens / 2)

    def decode_step_s(self, batch: int, total_context: float) -> float:
        """One decode step of ``batch`` sequences holding ``total_context`` KV tokens on one rank."""
        if batch <= 0:
            return 0.0
        base, per_seq, per_ctx = self._d
        return base + per_seq * batch + per_ctx * total_context

    @staticmethod
    def synchronised(rank_times: Sequence[float]) -> tuple[float, float]:
        """(iteration time, idle rank-seconds): every rank waits for the slowest one at the MoE collective."""
        slowest = max(rank_times, default=0.0)
        return slowest, sum(slowest - t for t in rank_times)

    # ----- whole requests -----
    def prefill_request_s(self, prompt_tokens: float, cached_tokens: float = 0.0) -> float:
        """The request alone on one rank, chunk after chunk, skipping its cached prefix."""
        done, total, seconds = float(cached_tokens), float(prompt_tokens), 0.0
        while done < total:
            n = min(self.chunk, total - done)
            seconds += self.prefill_iteration_s(n, done)
            done += n
        return seconds

    def profiled_theta(self, prompt_tokens: float) -> float:
        """θ^P from offline profiling (§4.2): cold full-prompt tokens per second per *instance* (ranks in parallel)."""
        return self.ranks * prompt_tokens / max(self.prefill_request_s(prompt_tokens), 1e-9)

    def cold_profile_points(self) -> list[tuple[float, float]]:
        """(prompt tokens, instance-seconds per request) of cold prefills, ranks in parallel: the θ model's prior."""
        return [(float(x), self.prefill_request_s(x) / self.ranks) for x in PROFILE_POINTS]

    # ----- KV -----
    @property
    def kv_tokens_per_rank(self) -> int:
        return self.shape.kv_tokens_per_rank

    @property
    def kv_tokens_per_instance(self) -> int:
        """C^D_KV of Eq. 1 for an instance of this shape."""
        return self.shape.kv_tokens_per_rank * self.ranks

    @property
    def max_running_per_instance(self) -> int:
        return self.shape.max_running_per_rank * self.ranks

    def transfer_s(self, tokens: float) -> float:
        """Wire time of ``tokens`` of KV through one rank's NICs, latency excluded (cluster.py queues it)."""
        return tokens * self.model.kv_bytes_per_token / self.rank_bytes_per_s if tokens > 0 else 0.0

    @property
    def switch_s(self) -> float:
        return self.model.switch_s

    def chunks(self, new_tokens: float) -> int:
        return max(1, math.ceil(new_tokens / self.chunk))
