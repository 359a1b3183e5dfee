#!/usr/bin/env bash
# Builds and runs scripts/inputs_variants.cu (the fused inputs' two kernels on
# a 4096-token step, alone and as a pair, one process). With the path of an
# earlier inputs.cuh as the argument (git show REV:csrc/include/tileinfer/inputs.cuh
# > old.cuh), also that version's kernels, outputs compared bit for bit (built
# against the current common.cuh / paged_kv.cuh; inputs_variants.cu supplies
# what older headers took from them). No torch needed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
old=()
if [[ $# -gt 0 ]]; then
  old=(-DOLD_INPUTS="\"$(realpath "$1")\"" -Icsrc/include/tileinfer)
fi
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas -v \
  -Icsrc/include "${old[@]}" scripts/inputs_variants.cu -o "$out/inputs_variants" 2>&1 | grep -E "error|registers|spill" || true
"$out/inputs_variants"
