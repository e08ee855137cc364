#!/usr/bin/env bash
# Every measurement the CUDA engine needs on an NVIDIA GPU, in one go, from the unpacked
# attnlab-cuda-dist.tar.xz (scripts/build-cuda.sh puts this script in dist/), run from the
# repository root (the presets and sweeps are read from there):
#
#   tar xJf attnlab-cuda-dist.tar.xz && dist/gpu-check.sh [STEP...]
#
# Steps (default: all, in this order). Each runs under its own time limit in seconds (the
# number after it; GPU_CHECK_LIMIT=<factor> scales them all), so one step that hangs cannot eat
# a short GPU lease; a step that hits it says so in its log and the next one starts.
#   devices   20  the GPU opens (driver, libraries, PTX)
#   tests    240  ATTNLAB_REQUIRE_GPU=1 dist/gpu-tests: every fused kernel, flash attention, the
#                 reduced precisions, replicas and every mechanism x encoding against the CPU;
#                 the training step again with flash attention (ATTNLAB_CUDA_FLASH=1)
#   resume   120  tests/training.rs's resume tests with ATTNLAB_TEST_DEVICE=cuda:0
#   bench    300  ms/step of the reference and the large configuration in f32, tf32 and bf16, the
#                 fused kernels off (ATTNLAB_CUDA_KERNELS=0) for comparison, and the PyTorch
#                 references (plain eager; SDPA + TF32; SDPA + bf16) side by side
#   mixers   150  ms/step of every mechanism (`attnlab mechanisms`) on the GPU in f32 at the
#                 reference configuration and at T 1024 (d 128, vocabulary 2048, B 8)
#   replicas  90  6 replicas of the sweep's cell shape as one group against one model
#   kernels  180  kernels per training step at the reference configuration (ncu: the launches of
#                 a 3-step run less those of a 1-step one, halved) and the time per kernel name
#   oom      120  d_model 8192 x 64 layers ends with the out-of-memory error, not a crash
#   to99     180  time to 99% on the reference configuration, attnlab (f32, tf32), PyTorch eager
#   threads  120  the CPU path with RAYON_NUM_THREADS=1,2,4,8,16 (reference and cell shapes)
#   sweep    600  the small Figure 1 sweep (sweeps/mqar_fig1_small.toml) on the GPU, wall time
# and, on request only:
#   flash    120  the reference and large configurations with flash attention (ATTNLAB_CUDA_FLASH=1)
#   profile  180  ncu: GPU time per kernel name over a large-configuration tf32 run
#   groupkernels 120  ncu: kernels of the sweep's cell shape alone and as a group of six, by name
#   mad      420  MAD-lite for softmax, linear attention, ReBased and retention on the GPU
#                 (sweeps/mad_lite_mechanisms.toml, issue 31): MAD's score per mechanism, and each
#                 run folder's preset.toml, summary.json and metrics.jsonl in $RESULTS/mad-runs/
#                 (collect them here with `attnlab sweep collect`); rerun it to go on
#   madmixers 420 the same for GLA, DeltaNet, Gated DeltaNet and Mamba-2 without a positional
#                 encoding (sweeps/mad_lite_mixers.toml), into $RESULTS/madmixers-runs/
# Results go to $RESULTS (default gpu-results/): one log per step, JSON lines from the benches.
# PYTHON (default python3) must have torch with CUDA for the references.
set -uo pipefail

DIST="$(cd "$(dirname "$0")" && pwd)"
RESULTS="${RESULTS:-gpu-results}"
PYTHON="${PYTHON:-python3}"
SCALE="${GPU_CHECK_LIMIT:-1}"
mkdir -p "$RESULTS"
ATTNLAB="$DIST/attnlab-cuda"
LARGE=(--set model.d_model=512 --set task.seq_len=1024 --set task.vocab_size=2048)
# The sweep's cell shape (issue 16): softmax, d 32, vocabulary 256, the ReBased preset's model.
CELL=(--preset presets/mqar_rebased.toml --set attention=softmax --set model.d_model=32
  --set task.vocab_size=256)

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }
# limited SECONDS CMD...: CMD under a time limit scaled by GPU_CHECK_LIMIT, saying so if it hit it.
limited() {
  local secs rc
  secs=$(awk -v s="$1" -v f="$SCALE" 'BEGIN { n = int(s * f); print n < 1 ? 1 : n }')
  shift
  timeout -k 10 "$secs" "$@"
  rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "!! time limit of ${secs} s reached: $*"
  return $rc
}
one_line() { # the JSON object on stdin as one line (nothing if it is not JSON)
  "$PYTHON" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))' 2>/dev/null
}
bench() { # bench LABEL ARGS...: one JSON line, prefixed with the label (alone if it failed)
  local label="$1" out; shift
  out=$("$ATTNLAB" bench --format json "$@" 2>>"$RESULTS/bench.err" | one_line)
  printf '%s %s\n' "$label" "$out" | tee -a "$RESULTS/bench.jsonl"
}

run_devices() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$RESULTS/devices.log"
  "$ATTNLAB" devices 2>&1 | tee -a "$RESULTS/devices.log"
}

run_tests() {
  ATTNLAB_REQUIRE_GPU=1 "$DIST/gpu-tests" --nocapture --test-threads 1 2>&1 | tee "$RESULTS/tests.log" \
    | grep -E '^test |panicked|left:|right:|assert|test result'
  # Training with flash attention (opt-in) against the CPU too.
  ATTNLAB_REQUIRE_GPU=1 ATTNLAB_CUDA_FLASH=1 "$DIST/gpu-tests" one_training_step --nocapture 2>&1 \
    | tee -a "$RESULTS/tests.log" | grep -E '^test |panicked|test result'
}

run_resume() {
  ATTNLAB_TEST_DEVICE=cuda:0 "$DIST/training-tests" resume --nocapture 2>&1 | tee "$RESULTS/resume.log" \
    | grep -E '^test |panicked|left:|right:|assert|test result'
}

bench_precisions() { # bench_precisions SUFFIX: both configurations in f32, tf32 and bf16
  for p in f32 tf32 bf16; do
    bench "reference-$p$1" --steps-only --set train.device=cuda:0 --set train.precision=$p
    bench "large-$p$1" --steps-only --steps 10 --set train.device=cuda:0 --set train.precision=$p "${LARGE[@]}"
  done
}

run_bench() {
  : >"$RESULTS/bench.jsonl"
  bench_precisions ""
  ATTNLAB_CUDA_KERNELS=0 bench "reference-f32-composed" --steps-only --set train.device=cuda:0
  ATTNLAB_CUDA_KERNELS=0 bench "large-f32-composed" --steps-only --steps 10 --set train.device=cuda:0 "${LARGE[@]}"
  for args in "" "--d 512 --T 1024 --vocab 2048"; do
    # shellcheck disable=SC2086 # word splitting of the size arguments is wanted
    "$PYTHON" "$DIST/ref_mqar_torch_cuda.py" --steps-only $args 2>>"$RESULTS/bench.err" \
      | sed "s/^/torch-eager-ref${args:+-large} /" | tee -a "$RESULTS/torch.jsonl"
    # shellcheck disable=SC2086
    "$PYTHON" "$DIST/ref_mqar_torch_fast.py" --modes eager,tf32,bf16 $args 2>>"$RESULTS/bench.err" \
      | sed "s/^/torch-fast${args:+-large} /" | tee -a "$RESULTS/torch.jsonl"
  done
}

run_mixers() {
  local m
  for m in $("$ATTNLAB" mechanisms --format csv | tail -n +2 | cut -d, -f1); do
    bench "mixer-$m" --steps-only --steps 10 --set train.device=cuda:0 --set attention="$m"
    bench "mixer-$m-T1024" --steps-only --steps 5 --set train.device=cuda:0 --set attention="$m" \
      --set task.seq_len=1024 --set task.vocab_size=2048 --set train.batch_size=8
  done
}

run_replicas() {
  bench "replicas-gpu" --steps-only "${CELL[@]}" --set train.device=cuda:0 --replicas 6
  bench "replicas-cpu" --steps-only --steps 10 "${CELL[@]}" --set train.device=cpu --replicas 6
}

ncu_launches() { # ncu_launches NAME STEPS ARGS...: kernel launches of a bench run of STEPS steps
  local name="$1" steps="$2"; shift 2
  ncu --clock-control none --csv --metrics gpu__time_duration.sum "$ATTNLAB" bench --steps-only \
    --steps "$steps" --set train.device=cuda:0 "$@" >"$RESULTS/ncu-$name.csv" 2>"$RESULTS/ncu-$name.err"
  grep -c '"gpu__time_duration.sum"' "$RESULTS/ncu-$name.csv"
}

kernel_times() { # kernel_times CSV: total GPU time and launches per kernel name, largest first
  # Values carry thousands separators ("41,074,123"): drop them with the quotes.
  awk -F'","' '/gpu__time_duration.sum/ { gsub(/[",]/, "", $NF); t[$5] += $NF; n[$5]++ }
    END { for (k in t) printf "%12d ns %6d x  %s\n", t[k], n[k], substr(k, 1, 110) }' "$1" \
    | sort -rn | head -40
}

run_kernels() {
  local one three
  one=$(ncu_launches 1 1)
  three=$(ncu_launches 3 3)
  echo "kernel launches: 1-step run $one, 3-step run $three; per training step: $(((three - one) / 2))" \
    | tee "$RESULTS/kernels.txt"
  kernel_times "$RESULTS/ncu-3.csv" | tee -a "$RESULTS/kernels.txt"
}

run_profile() { # where the large configuration's time goes (tf32, 6 steps: 5 warm-up and 1)
  echo "large tf32, ATTNLAB_CUDA_FLASH=${ATTNLAB_CUDA_FLASH:-0}: $(ncu_launches large 1 \
    --set train.precision=tf32 "${LARGE[@]}") launches" | tee "$RESULTS/profile.txt"
  kernel_times "$RESULTS/ncu-large.csv" | tee -a "$RESULTS/profile.txt"
}

run_groupkernels() { # what a group of replicas launches that one model does not
  echo "cell alone: $(ncu_launches cell 1 "${CELL[@]}") launches; the replicas bench (a group of \
six, then one alone): $(ncu_launches cell-group 1 "${CELL[@]}" --replicas 6)" | tee "$RESULTS/groupkernels.txt"
  kernel_times "$RESULTS/ncu-cell.csv" | tee -a "$RESULTS/groupkernels.txt"
  kernel_times "$RESULTS/ncu-cell-group.csv" | tee -a "$RESULTS/groupkernels.txt"
}

run_flash() { # flash attention (opt-in, ATTNLAB_CUDA_FLASH=1) against the default explicit path
  ATTNLAB_CUDA_FLASH=1 bench_precisions -flash
}

run_oom() {
  "$ATTNLAB" train presets/mqar_softmax.toml --set train.device=cuda:0 --set model.d_model=8192 \
    --set model.n_layers=64 >"$RESULTS/oom.log" 2>&1
  echo "exit status $?" >>"$RESULTS/oom.log"
  tail -5 "$RESULTS/oom.log"
}

run_to99() {
  for p in f32 tf32; do
    "$ATTNLAB" bench --set train.device=cuda:0 --set train.precision=$p --format json \
      2>>"$RESULTS/bench.err" | one_line | sed "s/^/to99-$p /" | tee -a "$RESULTS/to99.jsonl"
  done
  "$PYTHON" "$DIST/ref_mqar_torch_cuda.py" 2>&1 | tail -1 | sed 's/^/to99-torch /' | tee -a "$RESULTS/to99.jsonl"
}

run_threads() {
  for n in 1 2 4 8 16; do
    RAYON_NUM_THREADS=$n bench "threads-$n-reference" --steps-only --steps 20 --set train.device=cpu
    RAYON_NUM_THREADS=$n bench "threads-$n-cell" --steps-only --steps 20 "${CELL[@]}" --set train.device=cpu
  done
}

run_sweep() {
  local file=sweeps/gpu-check-fig1-small.toml
  sed -e 's/^set = \[/set = ["train.device=cuda:0", /' -e 's|^out = .*|out = "runs/gpu-check-fig1-small"|' \
    sweeps/mqar_fig1_small.toml >"$file"
  rm -rf runs/gpu-check-fig1-small
  local started=$SECONDS
  "$ATTNLAB" sweep "$file" >"$RESULTS/sweep.log" 2>&1
  echo "sweep: exit $?, $((SECONDS - started)) s wall" | tee -a "$RESULTS/sweep.log"
  tail -20 "$RESULTS/sweep.log"
}

# mad_sweep STEP SWEEP: the shipped MAD-lite sweep SWEEP on the GPU, its score in
# $RESULTS/STEP-score.txt and its run folders' records in $RESULTS/STEP-runs/.
mad_sweep() {
  local step=$1 file=sweeps/gpu-check-$2.toml
  local out; out=$(sed -n 's/^out = "\(.*\)"$/\1/p' "sweeps/$2.toml")
  sed -e 's/^set = \[/set = ["train.device=cuda:0", /' "sweeps/$2.toml" >"$file"
  local started=$SECONDS
  # The sweep stops a minute before the step's limit, so that what it finished is always
  # collected and copied (a rerun goes on from there).
  limited "$(awk -v f="$SCALE" 'BEGIN { print int(420 - 60 / f) }')" \
    "$ATTNLAB" sweep "$file" >"$RESULTS/$step.log" 2>&1
  echo "$step: exit $?, $((SECONDS - started)) s wall" | tee -a "$RESULTS/$step.log"
  rm -f "$file" # sweeps/ holds the shipped sweeps only (a test compiles each in)
  [ -d "$out" ] || { echo "$step: no run finished"; return 1; }
  "$ATTNLAB" sweep collect "$out" 2>&1 | tee "$RESULTS/$step-score.txt" | tail -30
  # The records only (no checkpoints), so that the results archive stays small.
  (cd "$out" && find . \( -name preset.toml -o -name summary.json -o -name metrics.jsonl \) \
    -print0 | tar --null -T - -cf -) | (mkdir -p "$RESULTS/$step-runs" && cd "$RESULTS/$step-runs" && tar xf -)
}

run_mad() { mad_sweep mad mad_lite_mechanisms; }
run_madmixers() { mad_sweep madmixers mad_lite_mixers; }

# `gpu-check.sh --step STEP` runs one step without a limit: the loop below calls itself so, under one.
[ "${1:-}" = --step ] && { "run_$2"; exit; }
declare -A LIMIT=([devices]=20 [tests]=240 [resume]=120 [bench]=300 [mixers]=150 [replicas]=90 [kernels]=180
  [oom]=120 [to99]=180 [threads]=120 [sweep]=600 [flash]=120 [profile]=180 [groupkernels]=120
  [mad]=420 [madmixers]=420)
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(devices tests resume bench mixers replicas kernels oom to99 threads sweep)
for s in "${steps[@]}"; do
  [ -n "${LIMIT[$s]:-}" ] || { echo "unknown step '$s': ${!LIMIT[*]}" >&2; exit 2; }
done
for s in "${steps[@]}"; do
  step "$s"
  limited "${LIMIT[$s]}" "$0" --step "$s" 2>&1 | tee -a "$RESULTS/steps.log"
done
