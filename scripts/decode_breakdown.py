"""Where the time of one decode-path step goes: the device time of each kernel
(decode tile kernel, combine) of the attention op, from the PyTorch profiler
(CUPTI), with every launch the ordinary way (TILEINFER_NO_PDL=1, so kernels do
not overlap and their durations add up), next to the step's CUDA-graph replay
time with and without PDL. bf16 and int8 caches, Qwen3-4B heads (32 / 8, d 128,
page 64). Several input sets rotate so the cache is read from DRAM.

    python3 scripts/decode_breakdown.py [--reps 50]
"""
import argparse
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import attention_peers as ap  # noqa: E402
import bench_int8  # noqa: E402
import common  # noqa: E402

CASES = [  # (label, batch, context, queries per sequence)
    ("1x32k", 1, 32768, 1),
    ("1x8k", 1, 8192, 1),
    ("8x32k", 8, 32768, 1),
    ("verify16 1x8k", 1, 8192, 16),
    ("verify16 1x2k", 1, 2048, 16),
    ("verify4 1x8k", 1, 8192, 4),
]


def kernel_times(fn, sets, reps):
    """Mean device microseconds per step of each kernel name (short form)."""
    for args in sets:
        fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
    per = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.split("<")[0].split("(")[0].replace("void ", "").replace("tileinfer::", "")
            per[name].append(e.time_range.elapsed_us())
    return {k: (statistics.median(v), len(v) / reps) for k, v in per.items()}


def graph_us(fn, sets):
    """Per-step time of a CUDA graph of 20 steps (as bench_decode times)."""
    t = common.bench(fn, sets, graph=True, rep_ms=30, warmup_ms=5)
    return t.median_us


def main():
    mod, why = common.load_tileinfer()
    if mod is None:
        sys.exit(f"decode_breakdown: {why}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    rows = []
    for label, batch, ctx, n in CASES:
        kinds = ("bf16", "int8") if n == 1 and batch == 1 else ("bf16",)
        sets = bench_int8.make_pair([ctx] * batch, [n] * batch, cap=8) if "int8" in kinds else \
            ap.make_sets([ctx] * batch, [n] * batch, 32, 8, 128, n_sets=common.sets_for(2 * batch * ctx * 8 * 256, cap=8))
        for kind in kinds:
            if kind == "int8":
                made = [bench_int8.ours_int8(p, "attention") for p in sets]
            else:
                made = [ap.ours_attention(p) for p in sets]
            fn = made[0][0]
            arg_sets = [m[1] for m in made]
            os.environ["TILEINFER_NO_PDL"] = "1"
            ks = kernel_times(fn, arg_sets, args.reps)
            ev_nopdl = graph_us(fn, arg_sets)
            del os.environ["TILEINFER_NO_PDL"]
            ev_pdl = graph_us(fn, arg_sets)
            parts = ", ".join(f"{k} {v[0]:.1f} us x{v[1]:.0f}" for k, v in sorted(ks.items(), key=lambda kv: -kv[1][0]))
            rows.append((f"{label} {kind}", ev_nopdl, ev_pdl, parts))
            print(f"{label} {kind}: graph step no PDL {ev_nopdl:.1f} us, PDL {ev_pdl:.1f} us; kernels (no PDL): {parts}",
                  flush=True)
        del sets
        torch.cuda.empty_cache()
    print("\ncase | step no PDL us | step PDL us | kernels (device us, no PDL)")
    for r in rows:
        print(f"{r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]}")


if __name__ == "__main__":
    main()
