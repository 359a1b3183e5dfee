#!/usr/bin/env bash
# Nsight Compute on the decode kernels (bf16 and int8 cache), after
# scripts/gpu_build.sh: speed of light, occupancy, warp stall reasons, and the
# scheduler's issue rate. Clocks are left as they are (--clock-control none).
#   bash scripts/profile_decode.sh [batch] [context]      (default 8 32768)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
"$ncu" --clock-control none --kernel-name regex:attention_tile_kernel --launch-skip 1 --launch-count 1 \
  --kernel-name-base demangled --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" python3 scripts/profile_decode.py "$@" 2>&1 | grep -v "^==PROF==" >/tmp/ncu_bf16_int8.txt
# The two profiled launches: the first is bf16 (launch-skip 1 skips its warm-up);
# profile the int8 one with a second pass that skips the three launches before it.
"$ncu" --clock-control none --kernel-name regex:attention_tile_kernel --launch-skip 3 --launch-count 1 \
  --kernel-name-base demangled --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" python3 scripts/profile_decode.py "$@" 2>&1 | grep -v "^==PROF==" >>/tmp/ncu_bf16_int8.txt
grep -E "attention_tile_kernel|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Registers Per|Shared Memory Config|Block Limit|Stall|stall|issue_stalled" /tmp/ncu_bf16_int8.txt | sed -E 's/attention_tile_kernel<tileinfer::TileConfig<([^>]*)>.*/kernel \1/' | cut -c1-200
cp /tmp/ncu_bf16_int8.txt "${OUT:-/tmp}/ncu_decode.txt" 2>/dev/null || true
