#!/usr/bin/env bash
# Launcher for the CUDA build, copied by scripts/build-cuda.sh to dist/attnlab-cuda (which starts
# dist/attnlab-cuda.bin) and dist/gpu-tests (dist/gpu-tests.bin, the test binary of tests/gpu.rs).
# The binaries link the NVIDIA driver library (libcuda.so.1) and the CUDA 13 libraries
# dynamically, so without them the loader would refuse to start it. This finds them first:
# - CUDA libraries: the system's (ldconfig, LD_LIBRARY_PATH), else a pip install (PyTorch's
#   nvidia/cu13 wheels); missing ones are named and attnlab does not start.
# - Driver: where none is installed, the stub beside this script stands in; every driver call
#   then fails, attnlab says so and runs on the CPU.
set -eu
here="$(dirname "$(readlink -f "$0")")"
cache="$(ldconfig -p 2>/dev/null || true)"

have() {
  case "$cache" in *"$1 "*) return 0 ;; esac
  local d
  for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/$1" ] && return 0; done
  return 1
}

missing_libs() {
  local lib out=""
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
    have "$lib" || out="$out $lib"
  done
  echo "$out"
}

export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
if [ -n "$(missing_libs)" ]; then
  for py in python3 python; do
    lib="$("$py" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)" || continue
    [ -d "$lib" ] && LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
  done
fi
missing="$(missing_libs)"
if [ -n "$missing" ]; then
  echo "attnlab-cuda: CUDA 13 libraries not found:$missing" >&2
  echo "  install the CUDA 13 toolkit, or \`pip install nvidia-cublas nvidia-cuda-runtime nvidia-curand\`," >&2
  echo "  or add their directory to LD_LIBRARY_PATH; use the CPU build of attnlab otherwise." >&2
  exit 127
fi
if ! have libcuda.so.1; then
  echo "attnlab-cuda: no NVIDIA driver (libcuda.so.1) found; CUDA devices will not open, runs use the CPU" >&2
  LD_LIBRARY_PATH="$here/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
exec "$here/$(basename "$0").bin" "$@"
