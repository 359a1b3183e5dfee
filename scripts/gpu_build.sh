#!/usr/bin/env bash
# Builds the extension in place (tileinfer_attn/_C*.so) on the GPU machine, with
# the log under $OUT when set. Passes TILEINFER_PTXAS_VERBOSE through (see setup.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export MAX_JOBS=${MAX_JOBS:-16}
log=${OUT:-/tmp}/build.log
start=$(date +%s)
if ! python3 setup.py build_ext --inplace >"$log" 2>&1; then
  grep -n -E "error|Error" "$log" | head -40
  tail -30 "$log"
  echo "BUILD FAILED (log: $log)"
  exit 1
fi
grep -E "spill|stack frame" "$log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c | head -20 || true
echo "build ok in $(( $(date +%s) - start )) s"
