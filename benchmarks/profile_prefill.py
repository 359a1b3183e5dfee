"""Runs our prefill op on causal prompts of one length (one, or --batch of them)
over each cache kind (bf16, int8, fp8 per tensor, fp8 per vector), a few calls
each, for a profiler to watch (with --calls 0, one call each: -c 4 then takes
one kernel per cache):

    ncu --clock-control none -k regex:prefill_kernel -c 4 --section SpeedOfLight \\
        python3 benchmarks/profile_prefill.py --length 8192 --calls 0

Shapes as bench_int8.py's prefill (Qwen3-4B: 32 query heads, 8 KV heads, head
dim 128, page 64). Prints each cache's time per call (CUDA events, after a
warm-up call; without a profiler attached these match bench_int8.py's
figures only roughly: no graph, no rotation of inputs).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_peers as ap  # noqa: E402
import bench_int8  # noqa: E402
import common  # noqa: E402

CACHES = {"bf16": None, "int8": "int8", "fp8-tensor": "fp8_tensor", "fp8-vector": "fp8_vector"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192, help="prompt length (tokens)")
    parser.add_argument("--batch", type=int, default=1, help="prompts of that length in the step")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per cache, after one warm-up call (0: none)")
    parser.add_argument("--caches", default=",".join(CACHES), help=f"comma-separated, of {', '.join(CACHES)}")
    args = parser.parse_args()
    common.require_cuda_ops("profile_prefill.py")
    lens = [args.length] * args.batch
    p = bench_int8.make_pair(lens, lens, cap=1)[0]
    for name in args.caches.split(","):
        attr = CACHES[name]
        fn, fn_args = ap.ours_prefill(p) if attr is None else bench_int8.ours_quant(p, "prefill", attr)
        common.profiled_calls(fn, fn_args, args.calls, f"{name}, {args.batch} x {args.length}")


if __name__ == "__main__":
    main()
