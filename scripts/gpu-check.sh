#!/usr/bin/env bash
# What issue 14 needs measured on an NVIDIA GPU, in one go, from the unpacked
# attnlab-cuda-dist.tar.gz (scripts/build-cuda.sh puts this script in dist/):
#
#   tar xzf attnlab-cuda-dist.tar.gz && dist/gpu-check.sh [STEP...]
#
# Steps (default: all, in this order; each a few minutes at most on an H100):
#   devices  the GPU opens (driver, libraries, PTX)
#   tests    ATTNLAB_REQUIRE_GPU=1 dist/gpu-tests: every fused kernel, flash attention, the
#            reduced precisions and every mechanism x encoding against the CPU
#   bench    ms/step of the reference and the large configuration in f32, tf32 and bf16, with
#            the fused kernels off (ATTNLAB_CUDA_KERNELS=0) for comparison, and the PyTorch
#            references (plain eager; SDPA + TF32; SDPA + bf16) side by side
#   to99     time to 99% on the reference configuration, attnlab (f32, tf32) and PyTorch eager
#   kernels  kernels per training step (ncu, 3 steps of the reference configuration)
# Results go to $OUT (default gpu-results/): one log per step, JSON lines from the benches.
# PYTHON (default python3) must have torch with CUDA for the references.
set -uo pipefail

DIST="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-gpu-results}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
ATTNLAB="$DIST/attnlab-cuda"
LARGE=(--set model.d_model=512 --set task.seq_len=1024 --set task.vocab_size=2048)

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }
bench() { # bench LABEL ARGS...: one JSON line, prefixed with the label
  local label="$1"; shift
  printf '%s ' "$label" >>"$OUT/bench.jsonl"
  "$ATTNLAB" bench --format json --set train.device=cuda:0 "$@" 2>>"$OUT/bench.err" \
    | tail -1 >>"$OUT/bench.jsonl"
}

run_devices() {
  step devices
  "$ATTNLAB" devices 2>&1 | tee "$OUT/devices.log"
}

run_tests() {
  step tests
  ATTNLAB_REQUIRE_GPU=1 "$DIST/gpu-tests" --nocapture --test-threads 1 2>&1 | tee "$OUT/tests.log" | tail -20
}

run_bench() {
  step bench
  : >"$OUT/bench.jsonl"
  for p in f32 tf32 bf16; do
    bench "reference-$p" --steps-only --set train.precision=$p
    bench "large-$p" --steps-only --steps 10 --set train.precision=$p "${LARGE[@]}"
  done
  ATTNLAB_CUDA_KERNELS=0 bench "reference-f32-composed" --steps-only
  ATTNLAB_CUDA_KERNELS=0 bench "large-f32-composed" --steps-only --steps 10 "${LARGE[@]}"
  for args in "" "--d 512 --T 1024 --vocab 2048"; do
    # shellcheck disable=SC2086 # word splitting of the size arguments is wanted
    "$PYTHON" "$DIST/ref_mqar_torch_cuda.py" --steps-only $args >>"$OUT/torch.jsonl" 2>>"$OUT/bench.err"
    # shellcheck disable=SC2086
    "$PYTHON" "$DIST/ref_mqar_torch_fast.py" --modes eager,tf32,bf16 $args >>"$OUT/torch.jsonl" 2>>"$OUT/bench.err"
  done
  cat "$OUT/bench.jsonl" "$OUT/torch.jsonl"
}

run_to99() {
  step to99
  for p in f32 tf32; do
    "$ATTNLAB" bench --set train.device=cuda:0 --set train.precision=$p --format json 2>&1 \
      | tail -1 | sed "s/^/to99-$p /" | tee -a "$OUT/to99.jsonl"
  done
  "$PYTHON" "$DIST/ref_mqar_torch_cuda.py" 2>&1 | tail -1 | sed 's/^/to99-torch /' | tee -a "$OUT/to99.jsonl"
}

run_kernels() {
  step kernels
  # 5 warm-up steps and 3 timed ones: divide the count by 8 (evaluation is not run).
  ncu --csv --metrics gpu__time_duration.sum "$ATTNLAB" bench --steps-only --steps 3 \
    --set train.device=cuda:0 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
  local kernels
  kernels=$(grep -c '"gpu__time_duration.sum"' "$OUT/ncu.csv")
  echo "kernels in 8 training steps: $kernels (per step: $((kernels / 8)))" | tee "$OUT/kernels.txt"
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(devices tests bench to99 kernels)
for s in "${steps[@]}"; do
  case "$s" in
    devices | tests | bench | to99 | kernels) "run_$s" ;;
    *) echo "unknown step '$s': devices, tests, bench, to99 or kernels" >&2; exit 2 ;;
  esac
done
