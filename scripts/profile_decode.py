"""One decode step of bf16 and of int8 cache on Qwen3-4B shapes, for Nsight
Compute (scripts/profile_decode.sh): each is run twice (warm-up, then the
profiled launch). Usage: python3 scripts/profile_decode.py [batch] [context]"""
import sys

import torch

import tileinfer_attn as ti  # noqa: F401  (registers the ops)

ops = torch.ops.tileinfer_attn


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
    hq, hkv, d, page = 32, 8, 128, 64
    dev = "cuda"
    pages = batch * ctx // page
    tables = torch.randperm(pages, device=dev, dtype=torch.int32).view(batch, -1).contiguous()
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    shape = (pages, hkv, page, d)
    for kind in ("bf16", "int8"):
        if kind == "bf16":
            kc = torch.randn(shape, device=dev, dtype=torch.bfloat16)
            vc = torch.randn(shape, device=dev, dtype=torch.bfloat16)
            kw = {}
        else:
            kc = torch.randint(-127, 128, shape, device=dev, dtype=torch.int8)
            vc = torch.randint(-127, 128, shape, device=dev, dtype=torch.int8)
            kw = dict(k_scale=torch.rand(shape[:3], device=dev) * 0.02, v_scale=torch.rand(shape[:3], device=dev) * 0.02,
                      k_smooth=torch.rand(hkv, d, device=dev) + 0.5)
        for _ in range(2):
            ops.attention(out, q, kc, vc, tables, lens, cu, 1, d ** -0.5, True, **kw)
        torch.cuda.synchronize()
        del kc, vc
    print("profile_decode: ok", batch, ctx)


if __name__ == "__main__":
    main()
