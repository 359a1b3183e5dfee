"""A/B of the Hopper wgmma prefill kernel (the default) against the mma.sync
tile kernel (TILEINFER_PREFILL_WGMMA=0), in one process (the switch is read at
every call): causal fresh prompts, Qwen3-4B heads (32 q / 8 kv), page 64,
d 128 (--d 64), bf16 (--fp16). Prints TFLOP/s of causal FLOPs (2 * 2 * L * L
/ 2 * d * Hq per prompt, SPEC section 7) and the ulps between the outputs.
A quick look without peers; bench_prefill.py times both next to cuDNN and flash.

    python3 benchmarks/bench_wgmma_prefill.py [--only 8k] [--fp16] [--d 64] [--rep-ms 100]
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.load_tileinfer()  # puts the checkout on sys.path
from tileinfer_attn.testing import make_problem, ulp_error  # noqa: E402

CASES = [("1x512", [512]), ("1x1k", [1024]), ("1x2k", [2048]), ("1x8k", [8192]), ("1x16k", [16384]), ("4x2k", [2048] * 4), ("8x512", [512] * 8)]
VARIANTS = [("tile kernel", {"TILEINFER_PREFILL_WGMMA": "0"}), ("wgmma (default)", {})]


def set_env(env):
    os.environ.pop("TILEINFER_PREFILL_WGMMA", None)
    os.environ.update(env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--rep-ms", type=float, default=100.0, help="timed milliseconds per variant (common.bench)")
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
            t = common.bench(lambda: ops.prefill(out, None, *p.args(), p.scale, True), rep_ms=args.rep_ms)
            outs.append(out.clone())
            cells.append(f"{flops / t.seconds / 1e12:18.1f}")
        set_env({})
        diffs = " ".join(f"{ulp_error(o, outs[0].double(), dtype):.2f}" for o in outs[1:])
        print(f"{label:8s} " + " ".join(cells) + f"   ({diffs})")


if __name__ == "__main__":
    main()
