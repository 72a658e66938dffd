#!/usr/bin/env bash
# One prepared GPU validation run (docs/gpu.md): the KV kernels, a busy switch, memory release/resume racing a
# switch, routed experts across a move, TP 2 persist/resume. At most 8 minutes on one H200 or H100, no network: the
# models are generated locally. Each check prints PASS / FAIL / SKIP with its reason and time; the summary is
# $OUT/gpu_validate.json (or --out DIR; default benchmarks/results/gpu_validate/), the console copy
# gpu_validate.log beside it. Exit status 1 if any check FAILed.
#
# Usage (repo root):  bash benchmarks/gpu_validate.sh [--dry-run] [--out DIR] [--only NAME ...] [--budget-s S]
# The interpreter: $PYTHON if set, else the project's venv (the Makefile's), else python3. It must hold sglang for
# the server checks (they SKIP, saying so, where it does not).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1

out_dir="${OUT:-$REPO/benchmarks/results/gpu_validate}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --out) out_dir="${args[$((i + 1))]:-$out_dir}" ;;
    --out=*) out_dir="${args[$i]#--out=}" ;;
  esac
done
mkdir -p "$out_dir"
LOG="$out_dir/gpu_validate.log"

if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
else
  # The Makefile's venv: $CACHE/venv-<first 12 hex of sha256(requirements/base.txt)>.
  cache="$(python3 -I sglang_prorsa/srt/common/paths.py 2>/dev/null || true)"
  key="$(sha256sum requirements/base.txt 2>/dev/null | cut -c1-12)"
  if [ -n "$cache" ] && [ -x "$cache/venv-$key/bin/python" ]; then PY="$cache/venv-$key/bin/python"; else PY=python3; fi
fi

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"   # H100/H200: one architecture keeps the kernel build short
export MAX_JOBS="${MAX_JOBS:-16}"
export SGLANG_PRORSA_EXT_DIR="${SGLANG_PRORSA_EXT_DIR:-/tmp/sglang-prorsa-ext}"
unset SGLANG_PRORSA_KV_BACKEND TRITON_INTERPRET
# Not installed (a bare checkout on a machine with its own python): import the package from the checkout.
if ! (cd /tmp && PYTHONSAFEPATH=1 "$PY" -c 'import sglang_prorsa' >/dev/null 2>&1); then
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi

{ echo "== gpu_validate: $PY, out $out_dir"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} 2>&1 | tee "$LOG"
# A hard cap over the script's own budget (--budget-s; by default 390 s on one GPU, 570 s with two): its summary is
# written after every check.
timeout --kill-after=15 660 "$PY" "$REPO/benchmarks/gpu_validate.py" "$@" 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
