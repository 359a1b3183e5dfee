"""One fused attention_inputs step (Qwen3-4B shapes: 32 q / 8 kv heads, d 128,
bf16, page 64, q/k norm, full rotary) of `tokens` tokens in one sequence, for
Nsight Compute (scripts/profile_inputs.sh): run twice (warm-up, then the
profiled launches: rows_kernel for the queries, kv_write_kernel for keys and
values). Usage: python3 scripts/profile_inputs.py [tokens]"""
import sys

import torch

import tileinfer_attn  # noqa: F401  (registers the ops)

ops = torch.ops.tileinfer_attn


def main():
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    hq, hkv, d, page = 32, 8, 128, 64
    dev, dt = "cuda", torch.bfloat16
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=dev, dtype=dt)
    q = qkv[:, :hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(tokens, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(tokens, hkv, d)
    pages = (tokens + page - 1) // page
    k_cache = torch.zeros(pages, hkv, page, d, device=dev, dtype=dt)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.randperm(pages, device=dev, dtype=torch.int32).view(1, pages)
    lens = torch.tensor([tokens], dtype=torch.int32, device=dev)
    cu = torch.tensor([0, tokens], dtype=torch.int32, device=dev)
    cos_sin = torch.randn(max(tokens, 4096), d, device=dev)
    w = torch.rand(d, device=dev, dtype=dt) + 0.5
    q_out = torch.empty_like(q)
    for _ in range(2):
        ops.attention_inputs(q_out, k_cache, v_cache, q, k, v, tables, lens, cu, cos_sin, d, w, w, 1e-6)
    torch.cuda.synchronize()
    print("profile_inputs: ok", tokens)


if __name__ == "__main__":
    main()
