#!/usr/bin/env bash
# A / B of builds on one GPU machine: an earlier revision (the base), the
# working tree (the candidate) and, if prepared, more candidates (a revision
# with patches applied), built side by side, then one command run on each in
# turn, several rounds, so that all see the same card, clocks and
# neighbours. Figures of "builds A/B on one machine" (docs/PERFORMANCE.md)
# come from runs like this.
#
# Where the checkout is (git is there; the GPU machine gets a copy without it):
#   bash scripts/ab.sh --prepare <rev>                      # .ab/base = the files of <rev> (git-ignored)
#   bash scripts/ab.sh --prepare <rev> <name> [patch...]    # .ab/<name> = <rev> with the patches applied
# then on the GPU machine, with .ab carried along:
#   bash scripts/ab.sh [--rounds N] [--no-build] [--no-cand] -- <command...>
# e.g.
#   bash scripts/ab.sh -- python3 benchmarks/bench_prefill.py --only "1x8k d256" --no-ceilings --no-plot --out-dir /tmp/ab
#
# The trees: base, every other prepared .ab/<name> (in name order), and
# the working tree as "cand" (left out with --no-cand). The command runs
# from each tree's root with that tree's extension first on PYTHONPATH;
# each line it prints comes back prefixed "<tree> rN: ". Builds: all at
# once with scripts/gpu_build.sh, MAX_JOBS (default 16) shared between
# them; logs in /tmp/ab_build_<tree>/ (--no-build: every tree must hold the
# extension built by an earlier call; carrying .ab again replaces the trees).
# Exit status: 1 if a build failed, 2 for bad usage or an unbuilt tree, else 0
# (a failing command shows in its own output).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "${1:-}" = "--prepare" ]; then
  rev=${2:?"--prepare needs a revision"}
  name=${3:-base}
  case "$name" in cand | */* | .*) echo "ab.sh: '$name' cannot name a tree" >&2; exit 2 ;; esac
  shift $(( $# < 3 ? $# : 3 ))
  rm -rf ".ab/$name" && mkdir -p ".ab/$name"
  git archive "$rev" | tar x -C ".ab/$name"
  for patch in "$@"; do
    git apply --directory=".ab/$name" "$patch" || { echo "ab.sh: $patch does not apply to $rev" >&2; exit 1; }
  done
  echo "$name: $(git rev-parse --short "$rev")${*:+ + $*} in .ab/$name; carry .ab to the GPU machine"
  exit 0
fi

rounds=2
build=1
cand=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --no-build) build=""; shift ;;
    --no-cand) cand=""; shift ;;
    --) shift; break ;;
    *) echo "usage: scripts/ab.sh --prepare <rev> [name [patch...]] | [--rounds N] [--no-build] [--no-cand] -- <command...>" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "ab.sh: no command given (after --)" >&2; exit 2; }
[ -f .ab/base/setup.py ] || { echo "ab.sh: .ab/base has no tree; run scripts/ab.sh --prepare <rev> first" >&2; exit 2; }

names=(base)
for d in .ab/*/; do
  n=$(basename "$d")
  [ "$n" != base ] && [ -f "$d/setup.py" ] && names+=("$n")
done
[ -n "$cand" ] && names+=(cand)
tree_dir() { if [ "$1" = cand ]; then echo "$root"; else echo "$root/.ab/$1"; fi; }

if [ -z "$build" ]; then
  # A tree carried again to the GPU machine arrives without the extension an
  # earlier call built in it.
  for n in "${names[@]}"; do
    compgen -G "$(tree_dir "$n")/tileinfer_attn/_C*.so" >/dev/null ||
      { echo "ab.sh: --no-build, but tree $n has no built extension (carrying .ab again replaces the built trees)" >&2; exit 2; }
  done
else
  jobs=$(( ${MAX_JOBS:-16} / ${#names[@]} )); [ "$jobs" -ge 1 ] || jobs=1
  pids=()
  for n in "${names[@]}"; do
    mkdir -p "/tmp/ab_build_$n"
    (cd "$(tree_dir "$n")" && OUT=/tmp/ab_build_$n MAX_JOBS=$jobs bash scripts/gpu_build.sh 2>&1 | sed "s/^/$n build: /") &
    pids+=($!)
  done
  failed=""
  for k in "${!names[@]}"; do wait "${pids[$k]}" || failed="$failed ${names[$k]}"; done
  [ -z "$failed" ] || { echo "ab.sh: build FAILED:$failed"; exit 1; }
fi

for r in $(seq 1 "$rounds"); do
  for n in "${names[@]}"; do
    dir=$(tree_dir "$n")
    (cd "$dir" && PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} "$@" 2>&1 | sed "s/^/$n r$r: /")
  done
done
