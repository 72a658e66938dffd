#!/usr/bin/env bash
# One prepared GPU session for the KV export/import kernels (issue 5): build the CUDA extension, run the kernel tests
# on the GPU (CUDA extension, compiled Triton, torch path, cross-checked with the CPU build), then the benchmark for
# the CUDA and Triton backends. Everything it writes goes to $OUT (7 files at most):
#   run.log                         build + test + benchmark log
#   kv_export_cuda_cuda.{md,png,json}, kv_export_cuda_triton.{md,png,json}
#
# Made for the device tool's H200 box: its python3 has torch, triton, pytest, matplotlib and tqdm but not sglang and
# no network, so nothing is installed; the tests and the benchmark load kernels/ straight from this checkout.
# Usage (repo root):  bash benchmarks/gpu_kernels.sh        # about 5-8 minutes on one H200
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$REPO/benchmarks/results/gpu}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"

export PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"   # H100/H200; one architecture keeps the build short
export MAX_JOBS="${MAX_JOBS:-16}"
export SGLANG_PRORSA_EXT_DIR="${SGLANG_PRORSA_EXT_DIR:-/tmp/sglang-prorsa-ext}"
unset SGLANG_PRORSA_KV_BACKEND TRITON_INTERPRET

log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
status=0

cd "$REPO" || exit 1
log "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvcc --version | tail -1
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
} 2>&1 | tee -a "$LOG"

log "build the CPU and CUDA extensions (cached in $SGLANG_PRORSA_EXT_DIR)"
# Run from /tmp: the repo root's sglang_prorsa/ has no kernels/ subpackage until the project is installed.
(cd /tmp && "$PY" - "$REPO" <<'EOF'
import sys, time
sys.path.insert(0, sys.argv[1] + "/tests/unit/kernels")
from kv_kernels_path import ensure_kernels_importable
ensure_kernels_importable()
from sglang_prorsa.kernels import cpu_kv, cuda_kv
for name, mod in (("cpu", cpu_kv), ("cuda", cuda_kv)):
    t0 = time.time()
    mod.load()
    print(f"{name} extension ready in {time.time() - t0:.1f} s", flush=True)
EOF
) 2>&1 | tee -a "$LOG" || status=1

log "kernel tests on the GPU"
(cd /tmp && "$PY" -m pytest -q -p no:cacheprovider -o addopts= -rs \
    "$REPO/tests/unit/kernels/test_kv_gpu.py" "$REPO/tests/unit/kernels/test_kv_pages.py" \
    "$REPO/tests/unit/kernels/test_kv_triton.py") 2>&1 | tee -a "$LOG" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

for backend in cuda triton; do
  log "benchmark, backend $backend"
  # 8 KV heads x 128 (2 KiB rows, a Llama-3-8B-like layer) on the GPU; 32K tokens x 64 layers is an 8 GiB request.
  (cd /tmp && "$PY" "$REPO/benchmarks/bench_kv_export.py" --device cuda --backend "$backend" --heads 8 \
      --rounds 10 --max-request-mib 16384 --variant-tokens 16384 --out-dir "$OUT") 2>&1 \
    | grep -v "it/s]" | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

log "done, status $status; files in $OUT:"
ls -la "$OUT" | tee -a "$LOG"
exit $status
