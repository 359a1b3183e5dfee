"""Runs one decode step of bench_decode.py's batch-invariant table, under the
default split rule and the batch-invariant one, a few calls each, for a
profiler to watch (with --calls 0, one call each: -c 2 then takes the
default's decode kernel and the invariant plan's):

    ncu --clock-control none -k regex:attention_tile_kernel -c 2 --section SpeedOfLight \\
        --section WarpStateStats --section SourceCounters -o /tmp/walk \\
        python3 benchmarks/profile_decode.py --case "MQA 32/1 1x32k" --calls 0

--case is a row of bench_decode.py's INVARIANT_CASES (MQA 32/1 1x32k, 1x1k,
28/4 24x4k, ...). Prints each plan's time per call (CUDA events, after a
warm-up call; no graph and no rotation of inputs, so these match
bench_decode.py's graph replays only roughly).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_peers as ap  # noqa: E402
import bench_decode  # noqa: E402
import common  # noqa: E402


def main():
    cases = {label: (batch, ctx, cfg) for label, batch, ctx, cfg in bench_decode.INVARIANT_CASES}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="MQA 32/1 1x32k", choices=sorted(cases), help="the step")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per plan, after one warm-up call (0: none)")
    args = parser.parse_args()
    common.require_cuda_ops("profile_decode.py")
    batch, ctx, cfg = cases[args.case]
    p = bench_decode.sets_of(batch, ctx, 1, cfg, cap=1)[0]
    for plan, invariant in (("default", False), ("batch-invariant", True)):
        fn, fn_args = ap.ours_attention(p, batch_invariant=invariant)
        common.profiled_calls(fn, fn_args, args.calls, f"{plan}, {args.case}")


if __name__ == "__main__":
    main()
