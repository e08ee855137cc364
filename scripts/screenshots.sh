#!/usr/bin/env bash
# Starts the workbench under Xvfb on a shipped preset, trains it until its attention is saved,
# and writes a screenshot of every view to assets/screenshots/ (then prints frame times).
# Needs: apt-get install xvfb libgl1-mesa-dri libegl1 (OpenGL software rendering, no GPU needed;
# add mesa-vulkan-drivers to compare with ATTNLAB_RENDERER=wgpu).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${2:-assets/screenshots}"
cargo build --release
mkdir -p "$out"
# A throwaway home, so the screenshots do not depend on (or change) a user's saved state.
home="$(mktemp -d)"
# Default: the shipped softmax preset with 2000 training rows, so two evaluations come quickly.
preset="${1:-$home/mqar_softmax_quick.toml}"
if [ -z "${1:-}" ]; then
    sed 's/^train_examples = 20000$/train_examples = 2000/' presets/mqar_softmax.toml > "$preset"
fi
HOME="$home" XDG_DATA_HOME="$home" ATTNLAB_PRESET="$preset" ATTNLAB_SCREENSHOTS="$out" \
    xvfb-run -a -s "-screen 0 1400x900x24" ./target/release/attnlab
ls -l "$out"
