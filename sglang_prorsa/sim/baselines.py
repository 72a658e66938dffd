"""Static PD ratios a user would pick without an oracle, beside the best static ratio that ``compare`` and the grid
find by simulating every ratio (which no user can do before running).

Three baselines, each a prefill-instance count for a model, a workload and a cluster (``baselines``):

* **paper optimum** (``paper_optimum``): the paper's best static ratios for MiMo-V2.5-Pro on 8 instances -- math 4:4,
  coding agent 5:3, general agent 3:5 prefill:decode (the evaluation's role-switching comparison; quoted in
  benchmarks/bench_sim_grid.py's ``PAPER``) -- taken as a recipe: the same share of the cluster's GPUs goes to prefill
  whatever the model, since a user would copy the published ratio. Workloads the paper did not run (our
  research_agent and document_agent, and mixes) have none.
* **1:1** (``one_to_one``): half the GPUs prefill.
* **flow balance** (``flow_balance``): the split that maximises the bottleneck bound slime documents, computed from the
  workload's means and the model's perf parameters (below).

Rounding, for the first two: the cluster holds ``N = gpus // gpus_per_instance`` instances of the prefill shape; the
target ``f * N`` (f the prefill share) is rounded to the nearest integer with halves going to decode (4.5 -> 4; 1:1 on
N instances is then ``N // 2``, adaptive's default starting split), and every baseline is clamped to the static ratios
the cluster can run (``runner.static_ratios``: at least one prefill and one decode instance). With the stage-specific
decode shape (``decode_shape="wide"``) decode instances take the GPUs prefill leaves, in whole wide instances.

Flow balance. slime's "Understand the RL system you are building" page (github.com/THUDM/slime,
docs/en/advanced/rl-systems.md, section PD) states, for n_P prefill and n_D decode engines of measured throughputs
mu_P, mu_D requests/s, a KV payload S_KV per request and a network bandwidth B_KV, the flow-conservation bound

    lambda <= min(n_P * mu_P, n_D * mu_D, B_KV / S_KV)

and advises balancing n_P * mu_P ~ n_D * mu_D. There mu_P and mu_D are measurements under the target workload; here
they come from the workload's means and the model's perf parameters (perf_model.py), so nothing is simulated. With,
per request (means over sampled trajectory plans of the workload, ``workload_means``): n new prompt tokens, c cached
prompt tokens, prompt p = c + n, o output tokens; a PD prefill rank's prefix cache keeps each trajectory's previous
prompt, so turn k > 0 prefills only what turn k - 1 added (its output and tool result) and its c is turn k - 1's prompt
(every such turn is assumed to hit; the first turn has c = 0):

    mu_P  = R_P / T_P,  T_P = b_P * n / chunk + a_P * n + a_ctx * n * (c + n / 2)
            perf_model's chunk cost T_P summed over the request's tokens, the chunk's fixed cost b_P shared by the
            ``chunk`` tokens a saturated rank packs into each iteration; R_P ranks prefill in parallel.
    S     = p + o / 2 + r
            a decoding request's time-averaged KV (its context grows from p to p + o) plus SGLang's
            --num-reserved-decode-tokens headroom r that admission keeps per running request (instance.py).
    step(B) = b_D + s_D * B + k_D * B * (p + o / 2)
            perf_model's decode step of B requests holding their mean context.
    mu_D  = R_D * B_max / (o * step(B_max))
            one decode instance at its batch limit B_max = max_running_per_rank: B_max requests per rank, each done
            after o steps.
    kv_D  = R_D * max(1, K / S) / (o * step(B_kv)),  B_kv = max(1, min(B_max, K / S))
            the KV bound by Little's law: K KV tokens per rank hold K / S requests at once, and each stays its mean
            decode duration o * step(B_kv), at the batch the KV lets the rank run (at least one: an empty rank always
            admits a request). min(mu_D, kv_D) = R_D * B_kv / (o * step(B_kv)).
    xi_P, xi_D = R * rank_NIC_bytes_per_s / (p * kv_bytes_per_token)
            slime's third term, the KV transfer: each request's prompt KV crosses one prefill rank's and one decode
            rank's NICs (cluster.py), so it scales with each side's ranks rather than being one constant.

    lambda(n_P) = min(n_P * min(mu_P, xi_P), n_D * min(mu_D, kv_D, xi_D)),  n_D the decode instances n_P leaves

and the baseline is the n_P among the static ratios that maximises lambda (ties: the fewest prefill instances).

Where this goes beyond slime's statement: mu_P and mu_D are computed, not measured; the KV-capacity term kv_D (decode
KV over the footprint of a request, by Little's law; the reading of B_KV / S_KV the project's issue asks for) is added
to the decode side; slime's B_KV / S_KV, network bandwidth over KV payload, is kept as the per-side transfer terms
xi_P, xi_D. Left out: the re-prefill of carried-over contexts after an asynchronous weight update, prefix-cache
misses (routing, eviction), the spread of prompt and output lengths (the bound uses means, and T_P and step are not
linear in them), cross-rank imbalance, and tool, sandbox and reward time (a rate bound says nothing of how many
requests are in flight; a light load leaves every split idle).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sglang_prorsa.sim.config import ClusterConfig, ModelConfig, RolloutConfig, Shape
from sglang_prorsa.sim.paper import PAPER_OPTIMA
from sglang_prorsa.sim.runner import static_ratios
from sglang_prorsa.sim.workloads import workload_tasks
from sglang_prorsa.workload.generator import WorkloadGenerator
from sglang_prorsa.workload.presets import TaskProfile

# The paper's best static prefill:decode ratios for MiMo-V2.5-Pro on 8 instances (see the module docstring).
BASELINES = ("paper optimum", "1:1", "flow balance")
MEANS_TRAJECTORIES = 1000  # sampled trajectory plans per task for the workload's means
MEANS_SEED = 0  # the same means whatever a run's seed


@dataclass(frozen=True)
class Baseline:
    """A baseline's split, or ``prefill_instances is None`` with ``note`` saying why there is none."""

    name: str
    prefill_instances: int | None
    decode_instances: int | None
    note: str  # how the split was chosen, or why there is none

    @property
    def label(self) -> str | None:
        """``p:d`` as compare and the grid label static runs, or None."""
        return None if self.prefill_instances is None else f"{self.prefill_instances}:{self.decode_instances}"

    def to_dict(self) -> dict:
        return {"name": self.name, "prefill_instances": self.prefill_instances,
                "decode_instances": self.decode_instances, "label": self.label, "note": self.note}


@dataclass(frozen=True)
class WorkloadMeans:
    """Per-request means of a workload (every turn of every trajectory is one request)."""

    new_tokens: float  # n: prompt tokens a PD prefill rank computes (the rest is its prefix cache's)
    cached_tokens: float  # c: the previous turn's prompt (0 on a first turn)
    output_tokens: float  # o
    requests_per_trajectory: float

    @property
    def prompt_tokens(self) -> float:
        return self.new_tokens + self.cached_tokens


@dataclass(frozen=True)
class FlowBalance:
    """The flow-balance split and the quantities it was computed from (rates in requests per second)."""

    baseline: Baseline
    means: WorkloadMeans
    mu_p: float  # one prefill instance
    mu_d: float  # one decode instance at its batch limit
    kv_d: float  # one decode instance's KV bound (Little's law)
    xi_p: float  # one prefill instance's NICs (KV transfer)
    xi_d: float  # one decode instance's NICs
    decode_batch: float  # B_kv: the requests per decode rank the KV and the batch limit allow
    kv_footprint_tokens: float  # S
    bound: float  # lambda at the chosen split (0 when there is no split)

    def to_dict(self) -> dict:
        return {"baseline": self.baseline.to_dict(), "means": {
            "new_tokens": self.means.new_tokens, "cached_tokens": self.means.cached_tokens,
            "output_tokens": self.means.output_tokens, "requests_per_trajectory": self.means.requests_per_trajectory},
            "mu_p": self.mu_p, "mu_d": self.mu_d, "kv_d": self.kv_d, "xi_p": self.xi_p, "xi_d": self.xi_d,
            "decode_batch": self.decode_batch, "kv_footprint_tokens": self.kv_footprint_tokens, "bound": self.bound}


# ----- workload means -----
def workload_means(tasks: str | Sequence[TaskProfile], trajectories: int = MEANS_TRAJECTORIES,
                   seed: int = MEANS_SEED, rollout: RolloutConfig | None = None) -> WorkloadMeans:
    """Means over ``trajectories`` plans of each task (a mix's groups take its tasks in turn, so each task gets as
    many trajectories), drawn as the simulator draws them (workload/generator.py); ``rollout.scale``, when set,
    shrinks them as the trainer does (in groups of ``rollout.group_size``)."""
    task_list = workload_tasks(tasks) if isinstance(tasks, str) else list(tasks)
    if not task_list or trajectories < 1:
        raise ValueError("workload_means needs at least one task and one trajectory")
    requests = new = cached = output = 0.0
    for task in task_list:
        generator = WorkloadGenerator(task, seed)
        plans = [generator.plan(i) for i in range(trajectories)]
        if rollout is not None and rollout.scale is not None:
            size = rollout.group_size
            plans = [p for g in range(0, len(plans), size) for p in rollout.scale.apply_group(plans[g:g + size])]
        for plan in plans:
            prompt, previous = plan.first_prompt_tokens, 0
            for turn in plan.turns:
                requests += 1
                new += prompt - previous
                cached += previous
                output += turn.output_tokens
                previous, prompt = prompt, prompt + turn.output_tokens + turn.tool_result_tokens
    trajectories_total = len(task_list) * trajectories
    return WorkloadMeans(new / requests, cached / requests, output / requests, requests / trajectories_total)


@functools.lru_cache(maxsize=64)
def _means_of(workload: str) -> WorkloadMeans:
    """``workload_means`` of a named workload, drawn once per process (the grid asks for each cell's many times)."""
    return workload_means(workload)


# ----- per-instance rates -----
def prefill_rate(shape: Shape, chunk_tokens: int, means: WorkloadMeans) -> float:
    """mu_P: requests per second one saturated prefill instance of ``shape`` completes."""
    p = shape.prefill
    n, c = means.new_tokens, means.cached_tokens
    seconds = p.iter_base_s * n / chunk_tokens + p.per_token_s * n + p.per_token_ctx_s * n * (c + n / 2)
    return shape.dp_ranks / seconds if seconds > 0 else math.inf


def decode_step_s(shape: Shape, batch: float, means: WorkloadMeans) -> float:
    """step(B): one decode step of ``batch`` requests holding their mean context p + o / 2."""
    d = shape.decode
    return d.iter_base_s + d.per_seq_s * batch + d.per_ctx_token_s * batch * (means.prompt_tokens
                                                                            + means.output_tokens / 2)


def kv_footprint(model: ModelConfig, means: WorkloadMeans) -> float:
    """S: a decoding request's time-averaged KV tokens plus the admission headroom SGLang keeps for it."""
    return means.prompt_tokens + means.output_tokens / 2 + model.reserved_decode_tokens


def decode_rates(model: ModelConfig, shape: Shape, means: WorkloadMeans) -> tuple[float, float, float]:
    """(mu_D, kv_D, B_kv) of one decode instance of ``shape``."""
    o, b_max = means.output_tokens, shape.max_running_per_rank
    held = shape.kv_tokens_per_rank / kv_footprint(model, means)  # K / S requests per rank
    b_kv = max(1.0, min(float(b_max), held))
    mu_d = shape.dp_ranks * b_max / (o * decode_step_s(shape, b_max, means))
    kv_d = shape.dp_ranks * max(held, 1.0) / (o * decode_step_s(shape, b_kv, means))
    return mu_d, kv_d, b_kv


def transfer_rate(model: ModelConfig, shape: Shape, means: WorkloadMeans) -> float:
    """xi: requests per second whose prompt KV one instance's NICs carry (each rank's NICs one transfer at a time)."""
    rank_bytes_per_s = shape.gpus_per_rank * model.transfer_gbytes_per_s * 1e9
    payload = means.prompt_tokens * model.kv_bytes_per_token
    return shape.dp_ranks * rank_bytes_per_s / payload if payload > 0 else math.inf


# ----- the baselines -----
def _static(cluster: ClusterConfig) -> ClusterConfig:
    return replace(cluster, mode="static", prefill_instances=0)


def _decode_instances(model: ModelConfig, cluster: ClusterConfig, prefill: int) -> int:
    return replace(cluster, mode="static", prefill_instances=prefill).split(model)[1]


def _share(name: str, share: float, model: ModelConfig, cluster: ClusterConfig, how: str) -> Baseline:
    """The split giving prefill ``share`` of the cluster's prefill-shape instances, rounded half to decode, clamped."""
    ratios = static_ratios(model, _static(cluster))
    n = cluster.gpus // model.gpus_per_instance
    if not ratios:
        return Baseline(name, None, None, f"{cluster.gpus} GPUs hold no static split of {model.gpus_per_instance}-GPU "
                                          "instances")
    target = share * n
    p = math.ceil(target - 0.5)  # nearest, halves to decode
    clamped = min(max(p, ratios[0]), ratios[-1])
    note = f"{how}: {share:g} x {n} instances = {target:g} -> {p}" + (
        f", clamped to {clamped}" if clamped != p else "")
    return Baseline(name, clamped, _decode_instances(model, cluster, clamped), note)


def paper_optimum(model: ModelConfig, workload: str | RolloutConfig, cluster: ClusterConfig) -> Baseline:
    """The paper's MiMo-V2.5-Pro static optimum for the workload's task, scaled to the cluster; None for a workload
    the paper did not run."""
    preset = workload.preset if isinstance(workload, RolloutConfig) else workload
    if preset not in PAPER_OPTIMA:
        why = "a mix of tasks" if "+" in preset else "a task the paper did not run"
        given = ", ".join(f"{k} {a}:{b}" for k, (a, b) in PAPER_OPTIMA.items())
        return Baseline("paper optimum", None, None,
                        f"no paper optimum for {preset!r} ({why}; the paper gives {given} on 8 MiMo-V2.5-Pro instances)")
    a, b = PAPER_OPTIMA[preset]
    return _share("paper optimum", a / (a + b), model, cluster, f"paper {a}:{b} on 8 MiMo-V2.5-Pro instances")


def one_to_one(model: ModelConfig, cluster: ClusterConfig) -> Baseline:
    """Half the GPUs prefill."""
    return _share("1:1", 0.5, model, cluster, "half prefill")


def flow_balance(model: ModelConfig, workload: str | RolloutConfig, cluster: ClusterConfig,
                 means: WorkloadMeans | None = None) -> FlowBalance:
    """The split maximising lambda(n_P) (module docstring), with its intermediate quantities."""
    rollout = workload if isinstance(workload, RolloutConfig) else None
    if means is None:
        if rollout is not None and rollout.scale is not None:
            means = workload_means(rollout.preset, rollout=rollout)
        else:
            means = _means_of(rollout.preset if rollout is not None else str(workload))
    static = _static(cluster)
    prefill_shape, decode_shape = static.shapes(model)
    mu_p = prefill_rate(prefill_shape, model.chunk_tokens, means)
    mu_d, kv_d, b_kv = decode_rates(model, decode_shape, means)
    xi_p, xi_d = transfer_rate(model, prefill_shape, means), transfer_rate(model, decode_shape, means)
    side_p, side_d = min(mu_p, xi_p), min(mu_d, kv_d, xi_d)
    best: tuple[float, int, int] | None = None
    for p in static_ratios(model, static):
        d = _decode_instances(model, cluster, p)
        bound = min(p * side_p, d * side_d)
        if best is None or bound > best[0]:  # strictly better: ties keep the fewer prefill instances
            best = (bound, p, d)
    if best is None:
        baseline = Baseline("flow balance", None, None, f"{cluster.gpus} GPUs hold no static split")
        return FlowBalance(baseline, means, mu_p, mu_d, kv_d, xi_p, xi_d, b_kv, kv_footprint(model, means), 0.0)
    bound, p, d = best
    limit = "prefill" if p * side_p <= d * side_d else "decode"
    binding = {"decode batch": mu_d, "decode KV": kv_d, "decode NICs": xi_d}
    what = min(binding, key=lambda k: binding[k]) if limit == "decode" else (
        "prefill" if mu_p <= xi_p else "prefill NICs")
    note = (f"lambda = min(n_P min(mu_P, xi_P), n_D min(mu_D, kv_D, xi_D)) is largest at {p}:{d}: {bound:.3g} "
            f"req/s, {what}-bound; per instance mu_P {mu_p:.3g}, mu_D {mu_d:.3g}, kv_D {kv_d:.3g} req/s")
    return FlowBalance(Baseline("flow balance", p, d, note), means, mu_p, mu_d, kv_d, xi_p, xi_d, b_kv,
                       kv_footprint(model, means), bound)


def baselines(model: ModelConfig, workload: str | RolloutConfig, cluster: ClusterConfig) -> dict[str, Baseline]:
    """Every baseline by name (``BASELINES`` order)."""
    return {"paper optimum": paper_optimum(model, workload, cluster), "1:1": one_to_one(model, cluster),
            "flow balance": flow_balance(model, workload, cluster).baseline}
