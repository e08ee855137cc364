#!/usr/bin/env bash
# Builds the CUDA binary of attnlab on a machine WITHOUT a system CUDA toolkit or GPU, using the
# compiler, headers and libraries NVIDIA publishes as Python wheels (CUDA 13.0). The result runs on
# a Linux x86_64 machine with an NVIDIA driver for CUDA >= 13.0 (R580+) and the CUDA 13 libraries.
#
#   scripts/build-cuda.sh                      # sm_90 (H100/H200)
#   CUDA_COMPUTE_CAP=80 scripts/build-cuda.sh  # A100; 89 for L4/RTX 40xx, 120 for RTX 50xx
#
# Output in dist/, everything a GPU machine without Rust needs:
#   attnlab-cuda (launcher) and attnlab-cuda.bin (stripped binary);
#   gpu-tests (launcher) and gpu-tests.bin (tests/gpu.rs, CPU vs GPU) and training-tests(.bin)
#   (tests/training.rs, run with ATTNLAB_TEST_DEVICE=cuda:0 for resuming on the GPU) unless
#   GPU_TESTS=0;
#   stub/libcuda.so.1 (used only where no driver is installed, see the launcher);
#   ref_mqar_torch_cuda.py, ref_mqar_torch.py and ref_mqar_torch_fast.py (the PyTorch references,
#   for `attnlab bench --torch / --torch-fast`); gpu-check.sh (every GPU measurement in one go);
# and all of dist/ as attnlab-cuda-dist.tar.xz.
# Environment: CUDA_COMPUTE_CAP (default 90), CUDA_WHEELS_DIR (default .cuda-wheels),
#              CARGO_TARGET_DIR (default target), PYTHON (default python3), JOBS (default 2),
#              GPU_TESTS (default 1).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${CUDA_WHEELS_DIR:-$ROOT/.cuda-wheels}"
PYTHON="${PYTHON:-python3}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
JOBS="${JOBS:-2}"

# CUDA 13.0 (update 2) wheels. 13.0 rather than the newest: the kernels are shipped as PTX, which a
# driver only loads if it knows that PTX version, so the oldest 13.x reaches the most drivers; and
# cudarc 0.19.10 (candle 0.11.1) knows CUDA versions up to 13.4 only.
WHEELS=(
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-cccl==13.0.85
  nvidia-cublas==13.1.0.3 nvidia-curand==10.4.0.35
)

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "CUDA wheels into $CACHE/venv"
if [ ! -x "$CACHE/venv/bin/pip" ]; then
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$CACHE/venv"
fi
"$CACHE/venv/bin/pip" install -q --disable-pip-version-check "${WHEELS[@]}"
CU13="$("$CACHE/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
[ -x "$CU13/bin/nvcc" ] || { echo "error: no nvcc in $CU13/bin after installing the wheels" >&2; exit 1; }

# A toolkit-shaped tree for the build scripts: cudaforge (candle-kernels) takes nvcc from PATH and
# the headers beside it; cudarc links with -lcuda -lcublas ... and looks under $CUDA_HOME/lib.
# The wheels ship only versioned sonames (libcublas.so.13), so lib/ gets the unversioned names,
# plus a stub libcuda.so: the driver library is not in any wheel and comes with the GPU's driver.
step "toolkit tree in $CACHE/toolkit"
TK="$CACHE/toolkit"
rm -rf "$TK"
mkdir -p "$TK/lib"
for d in bin include nvvm; do ln -s "$CU13/$d" "$TK/$d"; done
for so in "$CU13"/lib/lib*.so.*; do
  name="$(basename "$so")"
  ln -s "$so" "$TK/lib/$name"
  ln -sf "$so" "$TK/lib/${name%%.so.*}.so"
done
cp "$CU13"/lib/*.a "$TK/lib/"

# The stub exports every driver API entry point (after cuda.h's _v2/_v3 renames) and each returns
# CUDA_ERROR_STUB_LIBRARY (34), so cuInit fails cleanly and attnlab falls back to the CPU.
STUB_C="$CACHE/libcuda_stub.c"
{
  echo '#include <cuda.h>'
  echo '#define STUB(f) int f(void) { return 34; }'
  echo 'ATTNLAB_STUBS_BEGIN'
  grep -oE 'CUDAAPI[[:space:]]+cu[A-Za-z0-9_]+[[:space:]]*\(' "$CU13/include/cuda.h" \
    | sed -E 's/CUDAAPI[[:space:]]+//; s/[[:space:]]*\(//' | sort -u | sed 's/.*/STUB(&)/'
} >"$STUB_C"
gcc -E -P -I"$CU13/include" "$STUB_C" | sed -n '/ATTNLAB_STUBS_BEGIN/,$p' | tail -n +2 \
  | grep -v '^[[:space:]]*$' | sort -u >"$CACHE/libcuda_stub.i.c"
mkdir -p "$TK/lib/stubs"
gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$TK/lib/stubs/libcuda.so" "$CACHE/libcuda_stub.i.c"
ln -s libcuda.so "$TK/lib/stubs/libcuda.so.1"

export CUDA_HOME="$TK" CUDA_PATH="$TK" CUDA_ROOT="$TK" CUDA_TOOLKIT_ROOT_DIR="$TK"
export PATH="$TK/bin:$PATH"
export CUDAFORGE_THREADS="$JOBS"
# No debug info: the CUDA target dir stays lean and the binary small.
export CARGO_PROFILE_RELEASE_DEBUG=false
# The stub is for linking only; at run time the loader finds the real libcuda.so.1.
export LIBRARY_PATH="$TK/lib:$TK/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"

step "cargo build --release --features cuda (CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP)"
nvcc --version | tail -1
cd "$ROOT"
nice -n 15 cargo build --release --features cuda --bin attnlab -j "$JOBS"

test_binary() { # the path of the release test binary of tests/$1.rs, built with CUDA
  nice -n 15 cargo test --release --features cuda --test "$1" --no-run -j "$JOBS" \
    --message-format=json | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}
if [ "${GPU_TESTS:-1}" = 1 ]; then
  step "cargo test --release --features cuda --test gpu --test training --no-run"
  GPU_TEST_BIN="$(test_binary gpu)"
  TRAINING_TEST_BIN="$(test_binary training)"
  [ -n "$GPU_TEST_BIN" ] && [ -n "$TRAINING_TEST_BIN" ] \
    || { echo "error: cargo named no test binary for tests/gpu.rs or tests/training.rs" >&2; exit 1; }
fi

step "dist/"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
rm -rf "$ROOT/dist"
mkdir -p "$ROOT/dist/stub"
install_bin() { # $1 built binary, $2 name in dist/
  cp "$1" "$ROOT/dist/$2.bin"
  strip "$ROOT/dist/$2.bin"
  cp "$ROOT/scripts/attnlab-cuda-launcher.sh" "$ROOT/dist/$2"
  chmod +x "$ROOT/dist/$2"
}
install_bin "$TARGET/release/attnlab" attnlab-cuda
[ -n "${GPU_TEST_BIN:-}" ] && install_bin "$GPU_TEST_BIN" gpu-tests
[ -n "${TRAINING_TEST_BIN:-}" ] && install_bin "$TRAINING_TEST_BIN" training-tests
cp "$TK/lib/stubs/libcuda.so" "$ROOT/dist/stub/libcuda.so.1"
cp "$ROOT/scripts/ref_mqar_torch_cuda.py" "$ROOT/scripts/gpu-check.sh" "$ROOT/dist/"
for ref in ref_mqar_torch.py ref_mqar_torch_fast.py; do
  if [ -f "$ROOT/../shared/bench/$ref" ]; then
    cp "$ROOT/../shared/bench/$ref" "$ROOT/dist/"
  else
    echo "warning: ../shared/bench/$ref not found: gpu-check.sh's PyTorch rows will be missing" >&2
  fi
done
# One archive to carry to the GPU machine (the binaries are mostly PTX text, which compresses).
# xz: 30 MB where gzip made 65 MB, which with the repository no longer fit the 64 MiB that a
# GPU lease's working tree may carry.
rm -f "$ROOT/attnlab-cuda-dist.tar.gz"
tar -C "$ROOT" -cf - dist | xz -6 -T"$JOBS" >"$ROOT/attnlab-cuda-dist.tar.xz"
ls -l "$ROOT/dist" "$ROOT/attnlab-cuda-dist.tar.xz"
echo "needs at run time:"
readelf -d "$ROOT/dist/attnlab-cuda.bin" | grep NEEDED
