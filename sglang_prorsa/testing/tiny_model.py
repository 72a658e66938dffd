"""Generate a small random-weight Llama-style model with a byte-level BPE tokenizer, locally and deterministically.

No model can be downloaded here, so tests and the launcher's embedded default serve a model made on the spot.
Same seed and options give byte-identical files: the tokenizer corpus is generated from the seed, BPE training runs
single-threaded, and the weights are drawn from a seeded CPU generator and saved with safetensors (sorted keys, fixed
metadata).

    python -m sglang_prorsa.testing.tiny_model --out DIR [--layers 2 --hidden 256 --heads 4 ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from sglang_prorsa.srt.common.paths import cache_root

# The words the tokenizer corpus is made of; their frequencies come from the seed.
_WORDS = (
    "the agent calls a tool and reads the result then writes code to fix the failing test "
    "prefill decode cache page token request trajectory reward sandbox rollout policy gradient "
    "def return import class self if else for while in not and or true false none print "
    "hello world question answer step think plan observe act search file open read write run "
    "zero one two three four five six seven eight nine ten hundred thousand plus minus equals"
).split()


@dataclass(frozen=True)
class TinyModelSpec:
    """Every option that changes the generated files (and so the cache key)."""

    seed: int = 0
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    vocab: int = 1024
    max_positions: int = 4096
    init_std: float = 0.08
    dtype: str = "float32"

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    weights = [rng.random() ** 3 + 0.01 for _ in _WORDS]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        words = rng.choices(_WORDS, weights=weights, k=n)
        line = " ".join(words)
        if rng.random() < 0.3:
            line += f" {rng.randint(0, 99999)}"
        if rng.random() < 0.2:
            line = line.capitalize() + "."
        out.append(line)
    return out


def _train_tokenizer(spec: TinyModelSpec, out: Path) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # single-threaded BPE counting keeps merge order stable
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|bos|>", "<|eos|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    # A minimal chat template so the OpenAI-style chat endpoint works on the tiny model.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(str(out))


def _write_model(spec: TinyModelSpec, out: Path, vocab_size: int, bos: int, eos: int, pad: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype=spec.dtype,
        architectures=["LlamaForCausalLM"],
    )
    config.save_pretrained(str(out))
    # Write our own weights instead of a model's random init, whose draw order may change between transformers
    # releases: a name-sorted walk over a fixed shape table with one seeded generator.
    h, hd = spec.hidden, spec.hidden // spec.heads
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab_size, h),
    }
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (spec.heads * hd, h),
            p + "self_attn.k_proj.weight": (spec.kv_heads * hd, h),
            p + "self_attn.v_proj.weight": (spec.kv_heads * hd, h),
            p + "self_attn.o_proj.weight": (h, spec.heads * hd),
            p + "mlp.gate_proj.weight": (spec.intermediate, h),
            p + "mlp.up_proj.weight": (spec.intermediate, h),
            p + "mlp.down_proj.weight": (h, spec.intermediate),
        })
    gen = torch.Generator().manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    tensors = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) * spec.init_std
        tensors[name] = t.to(dtype).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}, indent=2, sort_keys=True) + "\n"
    )


def generate(spec: TinyModelSpec, out: Path) -> Path:
    """Write the model to ``out`` (created; must not already hold files)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"--out {out} is not empty")
    _train_tokenizer(spec, out)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    _write_model(spec, out, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    (out / "prorsa_tiny_model.json").write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
    return out


def ensure_default_model(spec: TinyModelSpec | None = None, cache: Path | None = None) -> Path:
    """Return the cached model for ``spec`` under ``cache`` (default: ``paths.cache_root()``), generating it once
    (atomically: build in a temp dir, then rename)."""
    spec = spec or TinyModelSpec()
    target = Path(cache_root() if cache is None else cache) / "models" / f"tiny-llama-{spec.key()}"
    return cached_build(target, "prorsa_tiny_model.json", lambda out: generate(spec, out))


def cached_build(target: Path, marker: str, build: Callable[[Path], object]) -> Path:
    """``target``, built once by ``build(directory)`` (which writes ``marker`` last) in a temp dir and renamed into
    place, so a reader never sees a half-written model and two processes building at once leave one copy."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        build(tmp / "m")
        try:
            os.rename(tmp / "m", target)
        except OSError:  # another process won the race; theirs is identical
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def spec_from_argv(spec_class: type, description: str, argv: list[str] | None):
    """(parser, ``--out``, the spec): a generator's command line, one flag per field of its frozen spec."""
    defaults = spec_class()
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, type=Path, help="output directory (created; must be empty)")
    for field, default in asdict(defaults).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    args = p.parse_args(argv)
    return p, args.out, spec_class(**{k: getattr(args, k) for k in asdict(defaults)})


def main(argv: list[str] | None = None) -> None:
    p, out_dir, spec = spec_from_argv(TinyModelSpec, __doc__.split("\n\n")[0], argv)
    if spec.hidden % spec.heads or spec.heads % spec.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    try:
        out = generate(spec, out_dir)
    except FileExistsError as e:
        p.error(str(e))
    print(out)


if __name__ == "__main__":
    main()
