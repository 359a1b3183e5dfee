#!/usr/bin/env bash
# Runs tests/sanitize_case.py (every CUDA attention op on small problems, then on
# bad device metadata) under compute-sanitizer and prints one verdict line per
# tool. Needs a built extension (scripts/gpu_build.sh) and a GPU.
#   scripts/sanitize.sh                      memcheck, racecheck, initcheck
#   scripts/sanitize.sh memcheck racecheck   some of them
# Logs: $SANITIZE_LOGDIR/<tool>.log (default /tmp/sanitize); a failing tool's
# first reports are also printed. Other environment: COMPUTE_SANITIZER (path of
# the tool), SANITIZE_ARGS (extra arguments for every tool, e.g. a kernel-name
# filter), SANITIZE_TOOL_TIMEOUT (seconds per tool, default 120; memcheck and
# initcheck take ~10 s, racecheck ~70 with a 2100-query prompt over an int8 cache
# on the warp-specialized prefill: all three fit in the 180 s that
# scripts/gpu_check.sh gives this script).
set -uo pipefail
cd "$(dirname "$0")/.."
san=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if [ ! -x "$san" ]; then
  echo "sanitize: compute-sanitizer not found (looked on PATH and in /usr/local/cuda/bin; set COMPUTE_SANITIZER)"
  exit 2
fi
tools=${*:-memcheck racecheck initcheck}
logdir=${SANITIZE_LOGDIR:-/tmp/sanitize}
mkdir -p "$logdir"
# One cudaMalloc per tensor: with PyTorch's caching allocator an access past a
# tensor usually lands inside the same cached block, where memcheck cannot see it.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
export PYTHONUNBUFFERED=1
# The extension is built in place (scripts/gpu_build.sh), not installed.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

status=0
for tool in $tools; do
  case_args=()
  case $tool in
    memcheck) ;;
    racecheck) ;;  # shared-memory hazards (the attention kernels' tiles)
    # initcheck: the bad-metadata cases leave partials of tokens of no sequence
    # unwritten (by design), which combine then reads: run the clean cases only.
    initcheck) case_args=(--clean-only) ;;
    synccheck) ;;
    *) echo "sanitize: unknown tool '$tool' (memcheck, racecheck, initcheck, synccheck)"; status=2; continue ;;
  esac
  log=$logdir/$tool.log
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${SANITIZE_TOOL_TIMEOUT:-120}" \
    "$san" --tool "$tool" --error-exitcode 97 --print-limit 20 ${SANITIZE_ARGS:-} \
    python3 tests/sanitize_case.py "${case_args[@]}" >"$log" 2>&1
  rc=$?
  summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
  if [ $rc -eq 0 ] && grep -q "sanitize_case: ok" "$log"; then
    verdict=PASS
  elif [ $rc -eq 124 ]; then
    verdict="TIMEOUT (no verdict)"
    status=1
  else
    verdict=FAIL
    status=1
  fi
  echo "$tool: $verdict (exit $rc, $(($(date +%s) - start)) s; ${summary:-no summary line}; log $log)"
  if [ "$verdict" = FAIL ]; then
    grep -E "^=+ |Error|error" "$log" | head -30 | sed "s/^/  $tool| /"
  fi
done
exit $status
