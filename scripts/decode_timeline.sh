#!/usr/bin/env bash
# Builds and runs scripts/decode_timeline.cu (block timelines of the decode
# kernel) on a Hopper GPU. No torch needed. `int8-splits`: the int8 split
# rules compared instead; `bf16-splits`: one sequence with 32 / 48 / 64 splits;
# `quick`: the cases that moved in past A / B runs; `floor`: kernels that only
# read one 32k sequence's bytes, against the decode kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DTILEINFER_TIMELINE \
  -Icsrc/include scripts/decode_timeline.cu -o "$out/decode_timeline"
"$out/decode_timeline" "$@"
