#!/usr/bin/env bash
# Builds and runs scripts/decode_timeline.cu (block timelines of the decode
# kernel and a plain read of the same pages) on a Hopper GPU. No torch needed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DTILEINFER_TIMELINE \
  -Icsrc/include scripts/decode_timeline.cu -o "$out/decode_timeline"
"$out/decode_timeline"
