#!/usr/bin/env bash
# Builds and runs scripts/inputs_variants.cu (the fused inputs' two kernels on
# a 4096-token step, on full and capped grids, beside plain copies of the
# step's bytes; one process). With the path of an earlier inputs.cuh as the
# argument (git show REV:csrc/include/tileinfer/inputs.cuh > old.cuh), also
# that version's kernels, outputs compared bit for bit (built against the
# current common.cuh / paged_kv.cuh; inputs_variants.cu supplies what older
# headers took from them). VARIANTS, one sed expression per line, also builds
# and runs the harness on copies of inputs.cuh edited by each (for example
# VARIANTS='s/kQueryRowAhead = true/kQueryRowAhead = false/'). No torch needed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
old=()
if [[ $# -gt 0 ]]; then
  old=(-DOLD_INPUTS="\"$(realpath "$1")\"")
fi
# <dir>/tileinfer/inputs.cuh first in the include path; its neighbours from
# csrc/include/tileinfer (one file each, for #pragma once).
build() {  # build <binary> <dir>
  nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas -v \
    -I"$2" -Icsrc/include -Icsrc/include/tileinfer "${old[@]}" scripts/inputs_variants.cu -o "$1" 2>&1 \
    | grep -E "error|registers|spill" || true
}
build "$out/inputs_variants" csrc/include
"$out/inputs_variants"
i=0
while IFS= read -r expr; do
  [[ -n "$expr" ]] || continue
  i=$((i + 1))
  mkdir -p "$out/v$i/tileinfer"
  sed -e "$expr" csrc/include/tileinfer/inputs.cuh >"$out/v$i/tileinfer/inputs.cuh"
  echo "== variant $i: $expr"
  build "$out/inputs_variants_v$i" "$out/v$i"
  SKIP_HMUL=1 "$out/inputs_variants_v$i"
done <<<"${VARIANTS:-}"
