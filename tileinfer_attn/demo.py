"""End-to-end demo: a paged KV cache with a few sequences, prefill then decode
steps through the ops, each step checked against exact attention.

    python -m tileinfer_attn.demo [--device cpu|cuda] [--dtype bf16|fp16|fp32|int8|fp8] [--steps N]

Builds a PagedKVCache (2 layers, Qwen3-4B-like heads: 32 query / 8 KV heads,
head_dim 128), adds sequences of different lengths, and runs one prefill step
then decode steps (one of them a 4-token speculative verify step, one after a
fork) through the ops: layer 0 cache_write + attention, layer 1
attention_inputs (RMSNorm + RoPE + cache write, fused) + attention.
Every step of every layer is compared with float64 attention over the same
cache (tileinfer_attn.reference.paged_attention(exact=True)); prints errors and
timings and exits with status 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import tileinfer_attn as ti
from tileinfer_attn import reference as R
from tileinfer_attn.cache import QUANT_DTYPES
from tileinfer_attn.testing import rel_error, ulp_error

NUM_LAYERS, HQ, HKV, D = 2, 32, 8, 128
NEEDED_OPS = ("attention_inputs", "attention", "prefill", "decode", "combine")


def cuda_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    missing = [op for op in NEEDED_OPS
               if not torch._C._dispatch_has_kernel_for_dispatch_key(f"tileinfer_attn::{op}", "CUDA")]
    if missing:
        return False, f"this build has no CUDA kernel for {', '.join(missing)}"
    return True, ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32", "int8", "fp8"], default="bf16")
    ap.add_argument("--steps", type=int, default=4, help="decode steps after the prefill")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    device = args.device
    if device == "auto":
        ok, why = cuda_ready()
        device = "cuda" if ok else "cpu"
        if not ok:
            print(f"device: cpu ({why})")
    elif device == "cuda":
        ok, why = cuda_ready()
        if not ok:
            print(f"cannot run on cuda: {why}")
            return 2
    if device == "cuda":
        print(f"device: cuda ({torch.cuda.get_device_name()})")

    cache_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int8": torch.int8,
                   "fp8": torch.float8_e4m3fn}[args.dtype]
    dtype = torch.bfloat16 if cache_dtype in QUANT_DTYPES else cache_dtype
    ps = args.page_size
    torch.manual_seed(args.seed)
    cache = ti.PagedKVCache(NUM_LAYERS, num_pages=64, num_kv_heads=HKV, head_dim=D, page_size=ps,
                            dtype=cache_dtype, device=device, max_seqs=8)
    if cache.quantized:
        cache.k_smooth.uniform_(0.5, 2.0)
    cos_sin = ti.rope_cos_sin_cache(D, 8 * 1024, device=device)
    norm_w = [(torch.rand(2, D, device=device) + 0.5).to(dtype) for _ in range(NUM_LAYERS)]  # q_norm, k_norm
    scale = D ** -0.5
    print(cache)

    def layer_step(layer, md):
        """One layer of one step: fused inputs, then attention. Returns the
        output, the queries attention saw, and the elapsed seconds."""
        n = md.num_tokens
        q = torch.randn(n, HQ, D, device=device).to(dtype)
        k = torch.randn(n, HKV, D, device=device).to(dtype)
        v = torch.randn(n, HKV, D, device=device).to(dtype)
        k_cache, v_cache = cache.layer_cache(layer)[:2]
        kw = cache.quant_kwargs(layer)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if layer % 2 == 0:
            # Layer without q/k norm or RoPE (inputs already prepared): a plain cache write.
            ti.cache_write(k_cache, v_cache, k, v, md.block_tables, md.seq_lens, md.cu_seqlens_q, **kw)
            q_rot = q
        else:
            # Qwen3-style layer: RMSNorm + RoPE + cache write fused.
            q_rot = ti.attention_inputs(q, k, v, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q,
                                        cos_sin, q_norm_weight=norm_w[layer][0], k_norm_weight=norm_w[layer][1],
                                        **kw)
        out = ti.attention(q_rot, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q, md.max_q_len,
                           scale, md.causal, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        return out, q_rot, time.perf_counter() - t0

    failures = 0

    def run_step(name, seqs, q_lens):
        nonlocal failures
        md = cache.prepare_step(seqs, q_lens)
        errs, secs, bad = [], 0.0, 0
        for layer in range(NUM_LAYERS):
            out, q_rot, dt = layer_step(layer, md)
            secs += dt
            k_cache, v_cache = cache.layer_cache(layer)[:2]
            ref = R.paged_attention(q_rot, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q,
                                    md.max_q_len, scale, md.causal, exact=True, **cache.quant_kwargs(layer))
            if dtype == torch.float32:
                err, ok = rel_error(out, ref), rel_error(out, ref) <= 1e-5
                errs.append(f"{err:.1e} rel")
            else:
                err = ulp_error(out, ref, dtype)
                ok = err <= 4
                errs.append(f"{err:.2f} ulp")
            bad += not ok
        failures += bad
        lens = [cache.seq_len(s) for s in seqs]
        print(f"{name:<22} seqs={seqs} queries={q_lens} lengths={lens}  "
              f"error/layer: {', '.join(errs)}  time: {secs * 1e3:.2f} ms ({NUM_LAYERS} layers)"
              + ("  MISMATCH" if bad else ""))

    prompt = [300, 77, 2 * ps + 1, ps]
    seqs = [cache.add() for _ in prompt]
    run_step("prefill", seqs, prompt)
    for i in range(args.steps):
        if i == 1:
            run_step("verify (4 tokens)", seqs, [4, 1, 1, 1])
        elif i == 2:
            child = cache.fork(seqs[1])
            seqs.append(child)
            run_step("decode after fork", seqs, [1] * len(seqs))
        else:
            run_step(f"decode {i}", seqs, [1] * len(seqs))
    for s in seqs:
        cache.free(s)
    print(f"pages free after freeing every sequence: {cache.num_free_pages}/{cache.num_pages}")
    if failures:
        print(f"FAILED: {failures} layer step(s) beyond tolerance (4 ulps; fp32 1e-5)")
        return 1
    print("OK: every step matches exact attention")
    return 0


if __name__ == "__main__":
    sys.exit(main())
