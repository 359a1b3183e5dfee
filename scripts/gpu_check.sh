#!/usr/bin/env bash
# The one call on the GPU machine: builds the extension, runs the tests that need
# the GPU, scripts/sanitize.sh, the benchmarks, and prints a short summary last.
#
#   bash scripts/gpu_check.sh                  # ~8 minutes: full build, tests, --quick benchmarks
#
# Options (environment):
#   SKIP_BUILD=1     use the extension already built in place (or built without a
#                    GPU by scripts/device_prebuild.sh and carried along)
#   PYTEST_ARGS="tests"   what pytest runs (default: -m gpu -n 12 tests, the tests
#                    that need the GPU over 12 workers; CI runs the CPU ones)
#   SKIP_TESTS=1     no pytest            SKIP_SANITIZE=1  no scripts/sanitize.sh
#   SKIP_BENCH=1     no benchmarks        BENCH_ONLY=decode,prefill,inputs,model,int8  (subset)
#   FULL=1           full benchmark grids instead of --quick (several minutes more)
#   BENCH_ARGS="..." extra flags for every benchmark, e.g. "--only 32k --no-plot"
#   TILEINFER_NO_FLASHINFER=1   leave FlashInfer out even when its wheels are there
#   GIT_COMMIT=<sha> GIT_DIRTY=0|1   the commit the result files record, where the
#                    tree here is a copy without .git (with .git, git says it)
#   TEST_TIMEOUT / SANITIZE_TIMEOUT / BENCH_TIMEOUT / FI_TIMEOUT   seconds per step
#                    (480 / 180 / 210 / 330: FlashInfer's background JIT, from the start)
#
# FlashInfer as a peer: its wheels travel in .whl/ (git-ignored), fetched once in
# the checkout with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl flashinfer-python==0.5.0 apache-tvm-ffi==0.1.3
# (0.5.0 is a pure-Python wheel that JIT-compiles its kernels; apache-tvm-ffi is its
# one dependency missing from a plain torch install). Send .whl/ along with the tree;
# this script installs the wheels into /tmp/site, sets FLASHINFER_CUDA_ARCH_LIST=9.0a
# and JIT-compiles the kernels the benchmarks use in the background while our
# extension builds. Without the wheels the benchmarks leave FlashInfer out.
#
# Results: each benchmark writes benchmarks/results/<name>.json and <name>.png
# (prefill, decode, inputs, model, int8), replacing the previous ones; a benchmark
# that fails leaves no file rather than a stale one. The summary prints their
# tables as README shows them (benchmarks/report.py --print).
#
# Files under $OUT, when set (three plain files): gpu_check.log (build, tests,
# sanitizer and benchmark logs in one file), summary.txt, and results.tgz: the
# JSON and PNG files this run wrote, at the top of the archive, so that
#   tar xzf results.tgz -C benchmarks/results
# puts them in place in a checkout. Without $OUT the log and summary go to /tmp and
# the results are already in benchmarks/results/.
#
# Exit status: 0 when every step that ran exited 0, else 1; the summary's last
# line lists the failed steps (a sanitizer FAIL or TIMEOUT makes sanitize.sh
# exit non-zero).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
OUTDIR=${OUT:-$WORK}
mkdir -p "$OUTDIR"
RESULTS=benchmarks/results
WROTE=()  # result files written by this run
T0=$(date +%s)
step() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; collect_logs; }
# One log file and the results archive under $OUTDIR, rewritten after every
# step: a run stopped at its time limit still brings back what it did.
collect_logs() {
  for part in flashinfer build tests sanitize bench_prefill bench_decode bench_inputs bench_model bench_int8; do
    [ -f "$WORK/$part.log" ] || continue
    echo "=================================== $part.log"
    cat "$WORK/$part.log"
  done >"$OUTDIR/gpu_check.log"
  if [ -n "${OUT:-}" ] && [ ${#WROTE[@]} -gt 0 ]; then
    tar czf "$OUTDIR/results.tgz" -C "$RESULTS" "${WROTE[@]}"
  fi
}
FAILED=""  # steps that did not exit 0: listed in the summary, and the exit status
fail() { FAILED="${FAILED:+$FAILED }$1"; }
want_bench() { [ -z "${BENCH_ONLY:-}" ] || [[ ",${BENCH_ONLY}," == *",$1,"* ]]; }

step "start: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null)"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"

# --- FlashInfer (optional peer) ------------------------------------------------
FI_PID=""
if [ -z "${TILEINFER_NO_FLASHINFER:-}" ] && ls .whl/flashinfer_python-*.whl >/dev/null 2>&1; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl >"$WORK/flashinfer.log" 2>&1; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
    heads="128"; [ -n "${FULL:-}" ] && heads="64 128 256"
    # timeout kills the whole process group (nvcc and ninja too) when it runs over.
    timeout "${FI_TIMEOUT:-330}" python3 benchmarks/attention_peers.py --warm-flashinfer $heads \
      >>"$WORK/flashinfer.log" 2>&1 &
    FI_PID=$!
    step "flashinfer installed from .whl; JIT warm-up in the background (pid $FI_PID, ${FI_TIMEOUT:-330}s max)"
  else
    step "flashinfer wheels present but pip install failed (see log)"
  fi
else
  step "flashinfer: not carried (.whl/flashinfer_python-*.whl absent) or disabled"
fi

# --- build ------------------------------------------------------------------------
BUILD_STATUS="skipped"
if [ -z "${SKIP_BUILD:-}" ]; then
  step "build (MAX_JOBS=16, ptxas verbose)"
  if MAX_JOBS=16 TILEINFER_PTXAS_VERBOSE=1 OUT="$WORK" bash scripts/gpu_build.sh; then
    BUILD_STATUS="ok"
  else
    BUILD_STATUS="FAILED"
    fail build
  fi
  step "build: $BUILD_STATUS"
fi

# --- tests ------------------------------------------------------------------------
if [ -z "${SKIP_TESTS:-}" ]; then
  args=${PYTEST_ARGS:--m gpu -n 12 tests}
  # Each pytest worker's torch would start one CPU thread per core, and a
  # dozen workers' spinning threads starve each other (the CPU soak, 4 s
  # alone, passed 300 s among 15 such workers), so the workers share the cores.
  workers=$(sed -nE 's/.*-n *([0-9]+).*/\1/p' <<<"$args")
  threads=$(( $(nproc) / ${workers:-1} )); [ "$threads" -lt 1 ] && threads=1
  step "tests: pytest $args, OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} (timeout ${TEST_TIMEOUT:-480}s)"
  # shellcheck disable=SC2086
  # TILEINFER_REQUIRE_CUDA=1: a build without some op's CUDA kernel fails
  # (tests/test_devices.py) instead of passing as skips.
  TILEINFER_REQUIRE_CUDA=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} timeout "${TEST_TIMEOUT:-480}" \
    python3 -m pytest -q -p no:cacheprovider $args >"$WORK/tests.log" 2>&1
  rc=$?
  grep -E "^(FAILED|ERROR)" "$WORK/tests.log" | head -20
  tail -1 "$WORK/tests.log"
  [ $rc -eq 124 ] && echo "TESTS TIMED OUT after ${TEST_TIMEOUT:-480}s"
  [ $rc -ne 0 ] && fail "tests(exit $rc)"
  step "tests: exit $rc"
fi

# --- sanitizer --------------------------------------------------------------------
if [ -z "${SKIP_SANITIZE:-}" ] && [ -f scripts/sanitize.sh ]; then
  step "scripts/sanitize.sh (timeout ${SANITIZE_TIMEOUT:-180}s)"
  timeout "${SANITIZE_TIMEOUT:-180}" bash scripts/sanitize.sh >"$WORK/sanitize.log" 2>&1
  rc=$?
  tail -5 "$WORK/sanitize.log"
  [ $rc -ne 0 ] && fail "sanitize(exit $rc)"
  step "sanitize: exit $rc"
fi

# --- benchmarks -------------------------------------------------------------------
if [ -z "${SKIP_BENCH:-}" ]; then
  if [ -n "$FI_PID" ]; then
    step "waiting for the flashinfer warm-up"
    wait "$FI_PID"
    rc=$?
    [ $rc -eq 124 ] && echo "flashinfer warm-up timed out after ${FI_TIMEOUT:-330}s"
    grep -E "^flashinfer " "$WORK/flashinfer.log"
    # Only the kernels that compiled are used (a failed JIT would be retried per case).
    ok=$(grep -E "^flashinfer (decode|decode_fp8|prefill) d[0-9]+: ok" "$WORK/flashinfer.log" | awk '{print $2}' | sort -u | paste -sd,)
    if [ -n "$ok" ]; then export TILEINFER_FLASHINFER_OPS=$ok; else export TILEINFER_NO_FLASHINFER=1; fi
    step "flashinfer: using ${ok:-nothing}"
  fi
  flags="--quick"; [ -n "${FULL:-}" ] && flags=""
  for b in prefill decode inputs model int8; do
    f=benchmarks/bench_$b.py
    want_bench "$b" || continue
    [ -f "$f" ] || { step "$f absent"; continue; }
    step "bench_$b $flags (timeout ${BENCH_TIMEOUT:-210}s)"
    rm -f "$RESULTS/$b.json" "$RESULTS/$b.png"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-210}" python3 "$f" $flags ${BENCH_ARGS:-} >"$WORK/bench_$b.log" 2>&1
    rc=$?
    RAN="${RAN:+$RAN,}$b"
    for x in json png; do [ -f "$RESULTS/$b.$x" ] && WROTE+=("$b.$x"); done
    [ $rc -eq 124 ] && echo "bench_$b TIMED OUT after ${BENCH_TIMEOUT:-210}s (no JSON written)"
    [ $rc -ne 0 ] && fail "bench_$b(exit $rc)"
    # What was skipped and why, then the tables (they start after an empty line).
    grep -E "^\s+\[skip\]" "$WORK/bench_$b.log" | head -12
    sed -n '/^$/,$p' "$WORK/bench_$b.log" | grep -v -E "^   wrote|^\s+\[skip\]" | head -80
    step "bench_$b: exit $rc"
  done
fi

# --- collect: one log, the results archive, the summary -------------------------
collect_logs
{
  echo
  echo "================ gpu_check summary ================"
  echo "build: $BUILD_STATUS"
  if [ -f "$WORK/tests.log" ]; then
    echo "tests: $(grep -E "[0-9]+ (passed|failed|error)" "$WORK/tests.log" | tail -1 | sed 's/^=* *//; s/ *=*$//')"
  fi
  [ -f "$WORK/sanitize.log" ] && grep -E "^(memcheck|racecheck|initcheck|synccheck): " "$WORK/sanitize.log" | sed 's/^/sanitize /'
  if [ -n "${RAN:-}" ]; then
    python3 benchmarks/report.py --print --names "$RAN"
    for b in ${RAN//,/ }; do
      n=$(grep -c "\[skip\]" "$WORK/bench_$b.log")
      [ "$n" -gt 0 ] && echo "bench_$b: $n skipped or failed measurements (see the log)"
    done
  fi
  if [ -n "$FAILED" ]; then echo "FAILED STEPS: $FAILED"; else echo "every step that ran exited 0"; fi
} | tee "$OUTDIR/summary.txt"
step "done (log: $OUTDIR/gpu_check.log)"
[ -z "$FAILED" ]  # the exit status: 1 when a step failed
