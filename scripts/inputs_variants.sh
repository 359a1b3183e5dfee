#!/usr/bin/env bash
# Builds and runs scripts/inputs_variants.cu (the fused inputs' queries kernel
# against variants, one process, outputs compared bit for bit). No torch needed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas -v \
  -Icsrc/include scripts/inputs_variants.cu -o "$out/inputs_variants" 2>&1 | grep -E "error|registers|spill" || true
"$out/inputs_variants"
