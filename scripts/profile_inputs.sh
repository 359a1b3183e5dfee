#!/usr/bin/env bash
# Nsight Compute on the fused attention_inputs kernels (rows_kernel: queries;
# kv_write_kernel: keys and values), after scripts/gpu_build.sh: speed of
# light, memory workload, occupancy, warp stall reasons. Issue 5's open
# question: why a large step reads and writes at ~47% of copy bandwidth.
# Clocks are left as they are (--clock-control none).
#   bash scripts/profile_inputs.sh [tokens]      (default 4096)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
report=${OUT:-$(mktemp -d)}/ncu_inputs.txt
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
# The script runs the op twice; skip the first pair of launches.
"$ncu" --clock-control none --kernel-name regex:"rows_kernel|kv_write_kernel" --launch-skip 2 --launch-count 2 \
  --kernel-name-base demangled --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 scripts/profile_inputs.py "$@" 2>&1 | grep -v "^==PROF==" >"$report"
grep -E "rows_kernel|kv_write_kernel|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Registers Per|Block Limit|Stall|stall|issue_stalled" \
  "$report" | cut -c1-200
echo "full report: $report"
