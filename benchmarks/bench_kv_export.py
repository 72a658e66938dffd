#!/usr/bin/env python3
"""KV export/import bandwidth against a plain copy of the same bytes and a naive per-layer torch path.

For each request size (tokens x layers) a pool twice the request's size is filled, the request's pages are drawn
at random from it (the worst case for a gather), and these are timed, interleaved round by round so that a noisy
neighbour hits all of them alike:

* ``copy``           one contiguous tensor copy of the request's bytes: the physical limit;
* ``export``         KVPageCodec.export_pages into a preallocated buffer (``+ck``: with per-page checksums);
* ``import``         KVPageCodec.import_pages of that buffer into other free pages (``+ck``: verifying them);
* ``naive export``   per buffer ``index_select`` of the token slots, then ``torch.cat`` (into a preallocated buffer);
* ``naive import``   per buffer ``index_copy_`` of the token slots.

GB/s counts the request's KV bytes once (not read + write). Ratios are medians of per-round ratios.

    python benchmarks/bench_kv_export.py                   # CPU sweep, writes benchmarks/results/kv_export_cpu.*
    python benchmarks/bench_kv_export.py --device cuda     # same on a GPU
    python benchmarks/bench_kv_export.py --quick           # small sizes, a few seconds
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch


def _import_kernels() -> ModuleType:
    """``sglang_prorsa.kernels``, installed or, from a plain checkout (a bare GPU box), loaded from ``kernels/``."""
    try:
        return importlib.import_module("sglang_prorsa.kernels")
    except ImportError:
        pass
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    importlib.import_module("sglang_prorsa")
    spec = importlib.util.spec_from_file_location(
        "sglang_prorsa.kernels", repo / "kernels" / "__init__.py", submodule_search_locations=[str(repo / "kernels")]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


KVPageCodec = _import_kernels().KVPageCodec

logger = logging.getLogger("bench_kv_export")

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
METHODS = ("copy", "export", "export+ck", "import", "import+ck", "naive export", "naive import")


@dataclass(frozen=True)
class Case:
    """One request shape. MHA rows are ``heads x head_dim``; MLA rows are one latent of ``head_dim``."""

    tokens: int
    layers: int
    page_size: int = 16
    layout: str = "mha"
    heads: int = 1
    head_dim: int = 128
    dtype: str = "bf16"

    @property
    def buffers_per_layer(self) -> int:
        return 2 if self.layout == "mha" else 1

    @property
    def request_bytes(self) -> int:
        row = (self.heads if self.layout == "mha" else 1) * self.head_dim * DTYPES[self.dtype].itemsize
        return self.tokens * self.layers * self.buffers_per_layer * row

    def label(self) -> str:
        return (
            f"{self.layout} {self.tokens // 1024}K tok x {self.layers}L p{self.page_size} "
            f"{self.heads if self.layout == 'mha' else 1}x{self.head_dim} {self.dtype}"
        )


@dataclass
class Result:
    case: Case
    gbps: dict[str, float] = field(default_factory=dict)  # median GB/s per method
    ratio: dict[str, float] = field(default_factory=dict)  # median per-round ratio vs copy / vs naive
    backend: str = ""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _make_pool(case: Case, device: torch.device, pool_tokens: int) -> list[torch.Tensor]:
    shape = (pool_tokens, case.heads, case.head_dim) if case.layout == "mha" else (pool_tokens, 1, case.head_dim)
    n = case.layers * case.buffers_per_layer
    # Random bytes (not zeros) so that the pages are really resident and checksums see real data.
    return [torch.randint(0, 256, shape[:-1] + (shape[-1] * DTYPES[case.dtype].itemsize,), dtype=torch.uint8,
                          device=device).view(DTYPES[case.dtype]) for _ in range(n)]


def _codec(case: Case, buffers: list[torch.Tensor], backend: str | None) -> KVPageCodec:
    if case.layout == "mha":
        return KVPageCodec.from_mha(buffers[0::2], buffers[1::2], case.page_size, backend=backend)
    return KVPageCodec.from_mla(buffers, case.page_size, backend=backend)


def _slots(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    offsets = torch.arange(page_size, device=pages.device)
    return (pages[:, None] * page_size + offsets[None, :]).flatten()


def run_case(case: Case, device: torch.device, rounds: int = 5, backend: str | None = None,
             methods: tuple[str, ...] = METHODS) -> Result:
    """Times ``methods`` on ``case`` for ``rounds`` interleaved rounds (after one warm-up round)."""
    num_pages = case.tokens // case.page_size
    pool_pages = 2 * num_pages + 1  # page 0 is SGLang's padding page: never handed to a request
    buffers = _make_pool(case, device, pool_pages * case.page_size)
    codec = _codec(case, buffers, backend)
    order = torch.randperm(pool_pages - 1, device=device) + 1
    src_pages, dst_pages = order[:num_pages].contiguous(), order[num_pages:2 * num_pages].contiguous()
    src_slots, dst_slots = _slots(src_pages, case.page_size), _slots(dst_pages, case.page_size)
    nbytes = codec.layout.buffer_bytes(num_pages)
    assert nbytes == case.request_bytes
    out = torch.empty(nbytes, dtype=torch.uint8, device=device)
    exported = codec.export_pages(src_pages, checksum=True)
    copy_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    # The naive path works on byte views (torch has no index_copy_ for fp8; SGLang stores fp8 as uint8 anyway) and
    # writes its layer-major result into a preallocated buffer of the same size.
    byte_buffers = [b.view(torch.uint8) for b in buffers]
    naive_out = out.clone().view(-1, *byte_buffers[0].shape[1:])
    naive_parts = naive_out.split(case.tokens)

    actions: dict[str, Callable[[], object]] = {
        "copy": lambda: out.copy_(copy_src),
        "export": lambda: codec.export_pages(src_pages, out=out),
        "export+ck": lambda: codec.export_pages(src_pages, out=out, checksum=True),
        "import": lambda: codec.import_pages(exported.data, dst_pages),
        "import+ck": lambda: codec.import_pages(exported, dst_pages),
        "naive export": lambda: torch.cat([b.index_select(0, src_slots) for b in byte_buffers], out=naive_out),
        "naive import": lambda: [b.index_copy_(0, dst_slots, part) for b, part in zip(byte_buffers, naive_parts)],
    }
    times: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(rounds + 1):
        for m in methods:
            _sync(device)
            t0 = time.perf_counter()
            actions[m]()
            _sync(device)
            if r:  # round 0 warms caches, allocator and page tables
                times[m].append(time.perf_counter() - t0)
    result = Result(case, backend=codec.backend.name)
    for m in methods:
        result.gbps[m] = nbytes / statistics.median(times[m]) / 1e9
    for m in methods:
        if m != "copy" and "copy" in times:
            result.ratio[f"{m} / copy"] = statistics.median(c / t for c, t in zip(times["copy"], times[m]))
    for kind in ("export", "import"):
        if kind in times and f"naive {kind}" in times:
            result.ratio[f"{kind} / naive"] = statistics.median(
                n / t for n, t in zip(times[f"naive {kind}"], times[kind]))
        if kind in times and f"{kind}+ck" in times:
            result.ratio[f"{kind} ck cost"] = statistics.median(
                c / t - 1 for t, c in zip(times[kind], times[f"{kind}+ck"]))
    return result


def format_table(results: list[Result]) -> str:
    """Markdown table: GB/s per method, then the ratios that matter (vs copy, vs naive, checksum cost)."""
    methods = [m for m in METHODS if m in results[0].gbps]
    ratios = [k for k in ("export / copy", "import / copy", "export / naive", "import / naive",
                          "export ck cost", "import ck cost") if k in results[0].ratio]
    head = ["case", "MiB", "backend"] + [f"{m} GB/s" for m in methods] + ratios
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r.case.label(), f"{r.case.request_bytes / 2**20:.0f}", r.backend]
        cells += [f"{r.gbps[m]:.2f}" for m in methods]
        cells += [f"{100 * r.ratio[k]:+.0f}%" if k.endswith("ck cost") else f"{r.ratio[k]:.2f}" for k in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[Result], path: Path, title: str) -> None:
    """GB/s against request tokens, one panel per layer count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer_counts = sorted({r.case.layers for r in results})
    fig, axes = plt.subplots(1, len(layer_counts), figsize=(6 * len(layer_counts), 4.5), squeeze=False)
    for ax, layers in zip(axes[0], layer_counts):
        rows = sorted((r for r in results if r.case.layers == layers), key=lambda r: r.case.tokens)
        for m in METHODS:
            if m in rows[0].gbps:
                style = "k--" if m == "copy" else (":" if m.startswith("naive") else "-")
                ax.plot([r.case.tokens for r in rows], [r.gbps[m] for r in rows], style, marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("request tokens")
        ax.set_ylabel("GB/s (request bytes / time)")
        ax.set_title(f"{layers} layers")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cases(args: argparse.Namespace) -> tuple[list[Case], list[Case]]:
    """The size sweep and the layout/page-size/dtype sweep, minus cases over the memory cap."""
    sweep = [Case(t, layers, args.page_size, "mha", args.heads, args.head_dim, args.dtype)
             for layers in args.layers for t in args.tokens]
    variants = [Case(args.variant_tokens, args.layers[0], p, "mha", args.heads, args.head_dim, d)
                for p in (1, 16, 64) for d in ("bf16", "fp8")]
    variants += [Case(args.variant_tokens, args.layers[0], p, "mla", 1, 576, "bf16") for p in (1, 64)]
    cap = args.max_request_mib * 2**20

    def keep(c: Case) -> bool:
        if c.request_bytes > cap:
            logger.info("skipping %s: %d MiB is over --max-request-mib", c.label(), c.request_bytes >> 20)
            return False
        return True

    return [c for c in sweep if keep(c)], [c for c in variants if keep(c)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default=None, help="force a backend (cuda, triton, cpp, torch)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    p.add_argument("--layers", type=int, nargs="+", default=[32, 64])
    p.add_argument("--page-size", type=int, default=16)
    # One KV head of 128: a GQA model's per-GPU share under tensor parallelism (e.g. 8 KV heads over TP 8). It keeps
    # a 64-layer 32K-token request at 1 GiB on a 24 GB machine; rows stay 256 bytes, the hard case for a gather.
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--variant-tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-request-mib", type=int, default=1024)
    p.add_argument("--quick", action="store_true", help="small sizes and 3 rounds (a smoke run)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--no-variants", action="store_true", help="skip the page-size/dtype/MLA table")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.layers, args.rounds, args.variant_tokens = [1024, 4096], [32], 3, 1024
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    from tqdm import tqdm

    device = torch.device(args.device)
    sweep, variants = _cases(args)
    if args.no_variants:
        variants = []
    results: dict[str, list[Result]] = {"sweep": [], "variants": []}
    for name, cases in (("sweep", sweep), ("variants", variants)):
        for case in tqdm(cases, desc=name, file=sys.stderr):
            res = run_case(case, device, args.rounds, args.backend)
            logger.info("%s [%s]: export %.2f GB/s, copy %.2f GB/s", case.label(), res.backend,
                        res.gbps["export"], res.gbps["copy"])
            results[name].append(res)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    tag = f"{device.type}_{results['sweep'][0].backend if sweep else 'none'}"
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    header = (f"# KV export/import on {device.type} ({_device_name(device)}), torch threads {torch.get_num_threads()}, "
              f"{args.rounds} rounds, medians; load average at the end {load}\n")
    text = header + "\n## Request sizes\n\n" + format_table(results["sweep"]) if sweep else header
    if variants:
        text += "\n\n## Page sizes, dtypes and layouts\n\n" + format_table(results["variants"])
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"kv_export_{tag}.md").write_text(text + "\n")
    (args.out_dir / f"kv_export_{tag}.json").write_text(json.dumps(
        {k: [{"case": asdict(r.case), "gbps": r.gbps, "ratio": r.ratio, "backend": r.backend} for r in v]
         for k, v in results.items()}, indent=1))
    if sweep:
        plot(results["sweep"], args.out_dir / f"kv_export_{tag}.png",
             f"KV export/import vs plain copy ({tag}, page size {args.page_size}, {args.heads}x{args.head_dim} "
             f"{args.dtype} rows)")
    return 0


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()


if __name__ == "__main__":
    raise SystemExit(main())
