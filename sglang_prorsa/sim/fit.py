"""Fit the perf model's per-rank costs (perf_model.py) from measurements of our real servers.

Input, either a JSON file of samples::

    {"prefill": [[batch_tokens, context_tokens, seconds], ...],     # one prefill forward of batch_tokens new tokens
     "decode":  [[batch_size, total_context_tokens, seconds], ...]}  # one decode step

or a running SGLang server on the loopback interface, timed through ``/generate``: prefill = a request with
``max_new_tokens = 1`` on a fresh random prompt (no prefix-cache hit); decode step = (time for N tokens - time for
1 token) / (N - 1) for a batch of concurrent requests. Both include HTTP overhead; fine for the order of magnitude
the simulator needs, not a kernel benchmark.

Least squares with non-negative coefficients (a negative cost would be extrapolated into negative times):
    prefill  s = b_P + a_P*n + a_ctx*n*(c + n/2)        decode  s = b_D + s_D*B + k_D*C
With ``--pd-url`` (a PD deployment of the same model: a front or router over a prefill and a decode instance), the
same 1-token requests are also timed through it (``"pd_prefill"`` samples); what a PD round trip costs beyond the
fitted prefill (bootstrap, KV transfer, the extra hop) becomes ``transfer_latency_s``, the median over samples.
The output is the base model's config with the fitted numbers and their provenance in ``sources``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from sglang_prorsa.sim.config import load_model

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def nonnegative_lstsq(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: refit without the columns that come out negative."""
    active = list(range(design.shape[1]))
    coef = np.zeros(design.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(design[:, active], target, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        active = [c for c, v in zip(active, sol) if v >= 0] if (sol >= 0).any() else []
    return coef


def fit_prefill(samples: list[list[float]]) -> tuple[dict[str, float], float]:
    """(iter_base_s, per_token_s, per_token_ctx_s) and the R² of the fit."""
    n, c, s = (np.array(col, dtype=float) for col in zip(*samples))
    design = np.column_stack([np.ones_like(n), n, n * (c + n / 2)])
    coef = nonnegative_lstsq(design, s)
    return {"iter_base_s": coef[0], "per_token_s": coef[1], "per_token_ctx_s": coef[2]}, _r2(design @ coef, s)


def fit_decode(samples: list[list[float]]) -> tuple[dict[str, float], float]:
    """(iter_base_s, per_seq_s, per_ctx_token_s) and the R² of the fit."""
    b, c, s = (np.array(col, dtype=float) for col in zip(*samples))
    design = np.column_stack([np.ones_like(b), b, c])
    coef = nonnegative_lstsq(design, s)
    return {"iter_base_s": coef[0], "per_seq_s": coef[1], "per_ctx_token_s": coef[2]}, _r2(design @ coef, s)


def fit_pd_overhead(pd_samples: list[list[float]], prefill: dict[str, float]) -> float:
    """Median seconds a 1-token request through a PD pair takes beyond the fitted prefill of the same prompt."""
    b, a, a_ctx = prefill["iter_base_s"], prefill["per_token_s"], prefill["per_token_ctx_s"]
    extra = sorted(s - (b + a * n + a_ctx * n * (c + n / 2)) for n, c, s in pd_samples)
    return max(0.0, extra[len(extra) // 2])


SAMPLE_STAGES = ("prefill", "decode", "pd_prefill")


def check_samples(samples: object) -> dict[str, list[list[float]]]:
    """The samples as ``fit_model`` reads them, or ValueError naming the first thing that is not: an object whose
    ``prefill`` / ``decode`` / ``pd_prefill`` entries (each optional) are lists of [n, context, seconds] numbers."""
    if not isinstance(samples, dict):
        raise ValueError(f"samples must be a JSON object with keys {list(SAMPLE_STAGES)}, got {type(samples).__name__}")
    unknown = sorted(set(samples) - set(SAMPLE_STAGES))
    if unknown:
        raise ValueError(f"unknown samples key {unknown[0]!r}; keys: {list(SAMPLE_STAGES)}")
    for stage, rows in samples.items():
        if not isinstance(rows, list):
            raise ValueError(f"samples[{stage!r}] must be a list of [n, context, seconds], got {type(rows).__name__}")
        for i, row in enumerate(rows):
            if not (isinstance(row, list) and len(row) == 3 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in row)):
                raise ValueError(f"samples[{stage!r}][{i}] must be [n, context, seconds] of numbers >= 0, got {row!r}")
    return samples


def fit_model(samples: dict[str, list[list[float]]], base: str, origin: str) -> tuple[dict, list[str]]:
    """The base model's config with every stage that has >= 3 samples fitted, and one report line per stage."""
    samples = check_samples(samples)
    config = load_model(base).to_dict()
    lines = []
    for stage, fitter in (("prefill", fit_prefill), ("decode", fit_decode)):
        rows = samples.get(stage) or []
        if len(rows) < 3:
            lines.append(f"{stage}: {len(rows)} samples, need >= 3; keeping {base}'s values")
            continue
        params, r2 = fitter(rows)
        config[stage] = params
        config["sources"][stage] = f"fitted by sglang_prorsa.sim.fit from {len(rows)} samples ({origin}); R^2 = {r2:.3f}"
        lines.append(f"{stage}: " + ", ".join(f"{k}={v:.3g}" for k, v in params.items()) + f"  R^2={r2:.3f}")
    pd = samples.get("pd_prefill") or []
    if pd:
        latency = fit_pd_overhead(pd, config["prefill"])
        config["transfer_latency_s"] = latency
        config["sources"]["transfer_latency_s"] = (
            f"fitted by sglang_prorsa.sim.fit: median PD overhead over {len(pd)} 1-token requests through a PD pair "
            f"beyond the fitted prefill ({origin})")
        lines.append(f"PD overhead (transfer_latency_s): {latency:.4f} s over {len(pd)} samples")
    return config, lines


def _r2(predicted: np.ndarray, measured: np.ndarray) -> float:
    total = float(((measured - measured.mean()) ** 2).sum())
    return 1.0 - float(((measured - predicted) ** 2).sum()) / total if total > 0 else 1.0


# ----- live measurement (loopback only) -----
def _generate(url: str, input_ids: list[int], max_new_tokens: int, timeout_s: float) -> float:
    body = json.dumps({"input_ids": input_ids, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}).encode()
    request = urllib.request.Request(url.rstrip("/") + "/generate", data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        response.read()
    return time.perf_counter() - start


def _fresh_ids(rng: random.Random, n: int) -> list[int]:
    """New random ids: no prefix-cache hit."""
    return [rng.randrange(100, 1000) for _ in range(n)]


def _loopback(url: str) -> None:
    host = urlparse(url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"refusing to measure {host!r}: only a server on the loopback interface")


def measure_prefill(url: str, prompt_lengths: list[int], repeats: int = 2, seed: int = 0,
                    timeout_s: float = 300.0) -> list[list[float]]:
    """[[n, 0, seconds]]: the fastest of ``repeats`` 1-token requests of n fresh tokens (no prefix-cache hit)."""
    _loopback(url)
    rng = random.Random(seed)
    return [[n, 0, min(_generate(url, _fresh_ids(rng, n), 1, timeout_s) for _ in range(repeats))]
            for n in prompt_lengths]


def measure(url: str, prompt_lengths: list[int], batches: list[int], decode_tokens: int = 32, repeats: int = 2,
            seed: int = 0, timeout_s: float = 300.0) -> dict[str, list[list[float]]]:
    """Time ``/generate`` on a server at ``url`` (127.0.0.1 / localhost only) into fit samples."""
    _loopback(url)
    prefill = measure_prefill(url, prompt_lengths, repeats, seed, timeout_s)
    rng = random.Random(seed + 1)
    decode, prompt = [], 256
    for batch in batches:
        def timed(tokens: int) -> float:
            prompts = [_fresh_ids(rng, prompt) for _ in range(batch)]
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=batch) as pool:
                list(pool.map(lambda ids: _generate(url, ids, tokens, timeout_s), prompts))
            return time.perf_counter() - start

        step = (timed(decode_tokens) - timed(1)) / (decode_tokens - 1)
        decode.append([batch, batch * (prompt + decode_tokens / 2), max(step, 0.0)])
    return {"prefill": prefill, "decode": decode}


# ----- command -----
def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--samples", help="JSON file with 'prefill' and/or 'decode' sample lists")
    src.add_argument("--url", help="a running SGLang server on 127.0.0.1 to time")
    parser.add_argument("--base", default="mimo_v25_pro", help="model config whose other fields are kept")
    parser.add_argument("--out", help="write the fitted model config here")
    parser.add_argument("--prompt-lengths", default="128,512,1024,2048", help="live: prefill lengths")
    parser.add_argument("--batches", default="1,4,8", help="live: decode batch sizes")
    parser.add_argument("--save-samples", help="live: also write the measured samples here")
    parser.add_argument("--pd-url", help="live: a PD deployment of the same model on 127.0.0.1, to fit its overhead "
                                         "(transfer_latency_s)")


def main(args: argparse.Namespace) -> int:
    if args.samples:
        samples, origin = json.loads(Path(args.samples).read_text()), f"samples file {Path(args.samples).name}"
    else:
        lengths = [int(x) for x in args.prompt_lengths.split(",")]
        samples = measure(args.url, lengths, [int(x) for x in args.batches.split(",")])
        if args.pd_url:
            samples["pd_prefill"] = measure_prefill(args.pd_url, lengths, seed=1)
        origin = f"live /generate timing of {args.url}" + (f" and {args.pd_url}" if args.pd_url else "")
        if args.save_samples:
            Path(args.save_samples).write_text(json.dumps(samples, indent=1))
    config, lines = fit_model(samples, args.base, origin)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps(config, indent=2))
        print(f"wrote {args.out}")
    return 0
