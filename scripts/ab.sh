#!/usr/bin/env bash
# A / B of two builds on one GPU machine: an earlier revision (the base) and
# the working tree (the candidate), built side by side, then one command run
# on each in turn, several rounds, so that both see the same card, clocks and
# neighbours. Figures of "builds A/B on one machine" (docs/PERFORMANCE.md)
# come from runs like this.
#
# Where the checkout is (git is there; the GPU machine gets a copy without it):
#   bash scripts/ab.sh --prepare <rev>      # .ab/base = the files of <rev> (git-ignored)
# then on the GPU machine, with .ab carried along:
#   bash scripts/ab.sh [--rounds N] [--no-build] -- <command...>
# e.g.
#   bash scripts/ab.sh -- python3 benchmarks/bench_prefill.py --only "1x8k d256" --no-ceilings --no-plot --out-dir /tmp/ab
#
# The command runs from each tree's root with that tree's extension first on
# PYTHONPATH; each line it prints comes back prefixed "base rN: " or
# "cand rN: ". Builds: both at once with scripts/gpu_build.sh, MAX_JOBS
# (default 16) shared between them; logs in /tmp/ab_build_{base,cand}/.
# Exit status: 1 if a build failed, else 0 (a failing command shows in its
# own output).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base=$root/.ab/base

if [ "${1:-}" = "--prepare" ]; then
  rev=${2:?"--prepare needs a revision"}
  rm -rf .ab/base && mkdir -p .ab/base
  git archive "$rev" | tar x -C .ab/base
  echo "base: $(git rev-parse --short "$rev") in .ab/base; carry .ab to the GPU machine"
  exit 0
fi

rounds=2
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --no-build) build=""; shift ;;
    --) shift; break ;;
    *) echo "usage: scripts/ab.sh --prepare <rev> | [--rounds N] [--no-build] -- <command...>" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "ab.sh: no command given (after --)" >&2; exit 2; }
[ -f "$base/setup.py" ] || { echo "ab.sh: $base has no tree; run scripts/ab.sh --prepare <rev> first" >&2; exit 2; }

if [ -n "$build" ]; then
  jobs=$(( ${MAX_JOBS:-16} / 2 )); [ "$jobs" -ge 1 ] || jobs=1
  mkdir -p /tmp/ab_build_base /tmp/ab_build_cand
  (cd "$base" && OUT=/tmp/ab_build_base MAX_JOBS=$jobs bash scripts/gpu_build.sh 2>&1 | sed "s/^/base build: /") &
  pid_base=$!
  (OUT=/tmp/ab_build_cand MAX_JOBS=$jobs bash scripts/gpu_build.sh 2>&1 | sed "s/^/cand build: /") &
  pid_cand=$!
  failed=""
  wait $pid_base || failed="$failed base"
  wait $pid_cand || failed="$failed cand"
  [ -z "$failed" ] || { echo "ab.sh: build FAILED:$failed"; exit 1; }
fi

for r in $(seq 1 "$rounds"); do
  for side in base cand; do
    dir=$root; [ $side = base ] && dir=$base
    (cd "$dir" && PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} "$@" 2>&1 | sed "s/^/$side r$r: /")
  done
done
