"""Generate a small random-weight Qwen2-MoE model, locally and deterministically, for tests of routed experts.

The sibling of ``tiny_model.py`` (whose dense Llama has no experts to route to): the same byte-level BPE tokenizer
(copied from the dense model of the same seed, so prompts tokenize alike), a ``Qwen2MoeForCausalLM`` config that
SGLang serves, and weights drawn from one seeded CPU generator over a name-sorted shape table, saved with
safetensors (sorted keys, fixed metadata). Same spec, same bytes. The router's weights are drawn wider than the rest
so that the experts a token picks are far from ties: a routing decision then does not flip between two runs of the
same request batched differently (fp32 on CPU differs by ~1e-5 there).

    python -m sglang_prorsa.testing.tiny_moe --out DIR [--layers 2 --experts 8 --top-k 2 ...]
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_prorsa.srt.common.paths import cache_root
from sglang_prorsa.testing.tiny_model import TinyModelSpec, cached_build, ensure_default_model, spec_from_argv

# The tokenizer's files (the dense model's), copied as they are.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class TinyMoeSpec:
    """Every option that changes the generated files (and so the cache key)."""

    seed: int = 0
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    experts: int = 8
    top_k: int = 2
    moe_intermediate: int = 64
    max_positions: int = 4096
    init_std: float = 0.08
    router_std: float = 0.5
    dtype: str = "float32"

    def key(self) -> str:
        # The tokenizer comes from the dense model of the same seed: its key is part of ours.
        blob = json.dumps({**asdict(self), "tokenizer": TinyModelSpec(seed=self.seed).key()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _shapes(spec: TinyMoeSpec, vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor SGLang's Qwen2MoeForCausalLM loads (HF names; no shared expert: its size is 0)."""
    h, hd = spec.hidden, spec.hidden // spec.heads
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (spec.heads * hd, h),
            p + "self_attn.q_proj.bias": (spec.heads * hd,),
            p + "self_attn.k_proj.weight": (spec.kv_heads * hd, h),
            p + "self_attn.k_proj.bias": (spec.kv_heads * hd,),
            p + "self_attn.v_proj.weight": (spec.kv_heads * hd, h),
            p + "self_attn.v_proj.bias": (spec.kv_heads * hd,),
            p + "self_attn.o_proj.weight": (h, spec.heads * hd),
            p + "mlp.gate.weight": (spec.experts, h),
            # Built by SGLang whatever the shared expert's size (unused without one): loaded, never left unset.
            p + "mlp.shared_expert_gate.weight": (1, h),
        })
        for e in range(spec.experts):
            q = f"{p}mlp.experts.{e}."
            shapes.update({
                q + "gate_proj.weight": (spec.moe_intermediate, h),
                q + "up_proj.weight": (spec.moe_intermediate, h),
                q + "down_proj.weight": (h, spec.moe_intermediate),
            })
    return shapes


def _write_model(spec: TinyMoeSpec, out: Path, vocab: int, bos: int, eos: int, pad: int) -> None:
    import torch
    from safetensors.torch import save_file

    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "vocab_size": vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": 2 * spec.hidden,  # the dense MLP of non-MoE layers: none here (decoder_sparse_step 1)
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "qkv_bias": True,
        "num_experts": spec.experts,
        "num_experts_per_tok": spec.top_k,
        "moe_intermediate_size": spec.moe_intermediate,
        "shared_expert_intermediate_size": 0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": False,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": spec.dtype,
    }
    # Written as plain JSON (not through transformers' config class, whose defaults change between releases).
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = torch.Generator().manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    tensors = {}
    for name, shape in sorted(_shapes(spec, vocab).items()):
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        else:
            std = spec.router_std if name.endswith("mlp.gate.weight") else spec.init_std
            t = torch.randn(shape, generator=gen) * std
        tensors[name] = t.to(dtype).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}, indent=2, sort_keys=True) + "\n"
    )


def generate(spec: TinyMoeSpec, out: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write the model to ``out`` (created; must not already hold files). The tokenizer is copied from
    ``tokenizer_dir`` (default: the cached dense tiny model of the same seed, generated if missing)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"--out {out} is not empty")
    src = Path(tokenizer_dir) if tokenizer_dir is not None else ensure_default_model(TinyModelSpec(seed=spec.seed))
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    _write_model(spec, out, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    (out / "prorsa_tiny_moe.json").write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
    return out


def ensure_moe_model(spec: TinyMoeSpec | None = None, cache: Path | None = None) -> Path:
    """Return the cached MoE model for ``spec`` under ``cache`` (default: ``paths.cache_root()``), generating it once
    (atomically: build in a temp dir, then rename)."""
    spec = spec or TinyMoeSpec()
    target = Path(cache_root() if cache is None else cache) / "models" / f"tiny-qwen2moe-{spec.key()}"
    if (target / "prorsa_tiny_moe.json").exists():
        return target
    tokenizer_dir = ensure_default_model(TinyModelSpec(seed=spec.seed), cache=cache)
    return cached_build(target, "prorsa_tiny_moe.json", lambda out: generate(spec, out, tokenizer_dir))


def main(argv: list[str] | None = None) -> None:
    p, out_dir, spec = spec_from_argv(TinyMoeSpec, __doc__.split("\n\n")[0], argv)
    if spec.hidden % spec.heads or spec.heads % spec.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if not 0 < spec.top_k <= spec.experts:
        p.error("--top-k must be in [1, --experts]")
    try:
        out = generate(spec, out_dir)
    except FileExistsError as e:
        p.error(str(e))
    print(out)


if __name__ == "__main__":
    main()
