#!/usr/bin/env bash
# Builds and runs scripts/wgmma_selftest.cu (the wgmma descriptors, swizzled
# layouts and fragments of attention_wgmma.cuh against a CPU product) on a
# Hopper GPU. No torch needed; a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Icsrc/include \
  scripts/wgmma_selftest.cu -o "$out/wgmma_selftest"
"$out/wgmma_selftest"
