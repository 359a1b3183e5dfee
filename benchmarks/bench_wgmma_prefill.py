"""A/B of the Hopper wgmma prefill kernel (the default) against the mma.sync
tile kernel (TILEINFER_PREFILL_WGMMA=0), in one process (the switch is read at
every call): causal fresh prompts, Qwen3-4B heads (32 q / 8 kv), page 64,
d 128 (--d 64), bf16 (--fp16). Prints TFLOP/s of causal FLOPs (2 * 2 * L * L
/ 2 * d * Hq per prompt, SPEC section 7) and the ulps between the outputs.
A quick look without peers; bench_prefill.py times both next to cuDNN and flash.

    python3 benchmarks/bench_wgmma_prefill.py [--only 8k] [--fp16] [--d 64] [--reps 20]
"""
import argparse
import os

import torch

from tileinfer_attn.testing import make_problem, ulp_error

CASES = [("1x512", [512]), ("1x1k", [1024]), ("1x2k", [2048]), ("1x8k", [8192]), ("1x16k", [16384]), ("4x2k", [2048] * 4), ("8x512", [512] * 8)]
VARIANTS = [("tile kernel", {"TILEINFER_PREFILL_WGMMA": "0"}), ("wgmma (default)", {})]


def set_env(env):
    os.environ.pop("TILEINFER_PREFILL_WGMMA", None)
    os.environ.update(env)


def time_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dtype = torch.float16 if args.fp16 else torch.bfloat16
    ops = torch.ops.tileinfer_attn
    hq, hkv, d = 32, 8, args.d
    print(f"{torch.cuda.get_device_name()}  {dtype}  heads {hq}/{hkv}  d {d}  page 64  causal")
    print(f"{'case':8s} " + " ".join(f"{name:>18s}" for name, _ in VARIANTS) + "   (TFLOP/s; ulps between them)")
    for label, lens in CASES:
        if args.only and args.only not in label:
            continue
        p = make_problem(lens, lens, hq, hkv, d, 64, dtype=dtype, device="cuda", seed=0)
        flops = sum(2 * L * L * d * hq for L in lens)
        outs, cells = [], []
        for _, env in VARIANTS:
            set_env(env)
            out = torch.empty_like(p.q)
            ms = time_ms(lambda: ops.prefill(out, None, *p.args(), p.scale, True), args.reps)
            outs.append(out.clone())
            cells.append(f"{flops / ms / 1e9:18.1f}")
        set_env({})
        diffs = " ".join(f"{ulp_error(o, outs[0].double(), dtype):.2f}" for o in outs[1:])
        print(f"{label:8s} " + " ".join(cells) + f"   ({diffs})")


if __name__ == "__main__":
    main()
