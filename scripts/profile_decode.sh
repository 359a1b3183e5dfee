#!/usr/bin/env bash
# Nsight Compute on the decode kernels (bf16 and int8 cache), after
# scripts/gpu_build.sh: speed of light, occupancy, warp stall reasons, and the
# scheduler's issue rate. Clocks are left as they are (--clock-control none).
#   bash scripts/profile_decode.sh [batch] [context]      (default 8 32768)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
report=${OUT:-$(mktemp -d)}/ncu_decode.txt
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
# One profiled launch after `skip` attention launches: the script runs bf16
# twice (warm-up, profiled), then int8 twice, so skip 1 is bf16 and skip 3 int8.
profile() {
  "$ncu" --clock-control none --kernel-name regex:attention_tile_kernel --launch-skip "$1" --launch-count 1 \
    --kernel-name-base demangled --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 scripts/profile_decode.py "${@:2}" 2>&1 | grep -v "^==PROF=="
}
{ profile 1 "$@"; profile 3 "$@"; } >"$report"
grep -E "attention_tile_kernel|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Registers Per|Shared Memory Config|Block Limit|Stall|stall|issue_stalled" "$report" | sed -E 's/attention_tile_kernel<tileinfer::TileConfig<([^>]*)>.*/kernel \1/' | cut -c1-200
echo "full report: $report"
