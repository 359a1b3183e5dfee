"""INT8 KV cache benchmark: speed of our attention on an int8 cache against our
own bf16 cache in the same run, and the accuracy int8 costs.

Shapes: Qwen3-4B attention (32 query heads, 8 KV heads, head dim 128, page 64).
- Decode, one query per sequence, batch x context (1,1k) (1,4k) (1,8k) (1,16k)
  (1,32k) (8,32k) (32,4k): the `attention` op (decode + combine, as
  bench_decode.py times bf16) on the int8 cache and on the bf16 cache holding
  the same data, both as CUDA-graph replays. Reported: us, speedup (t_bf16 /
  t_int8; int8 reads about half the bytes, so ~1.8x is the bound at long
  contexts), achieved GB/s of the bytes each must
  read (int8: k and v int8 plus their fp32 scales, 2 x L x Hkv x (d + 4) per
  sequence; bf16: 2 x L x Hkv x d x 2) and % of the copy bandwidth measured in
  this run. The int8 call passes k_smooth (ones, PagedKVCache's default), as a
  model does.
- Prefill, causal, one prompt of 2k / 8k / 16k: the prefill op on int8 vs
  bf16, TFLOP/s of causal FLOPs (2 * 2 * L * L / 2 * d * Hq, as bench_prefill.py).
- Accuracy (no timing): a decode step of several sequences whose keys, values
  and queries are written through cache_write into a bf16 cache and an int8
  cache (plain, and smoothed with key_smoothing_factors of the same keys),
  relative error ||out - exact|| / ||exact|| against float64 attention on the
  unquantized (bf16) inputs; on plain random keys and on keys with outlier
  channels (x40, queries / 40 there, as tests/test_int8_smoothing.py builds
  them). Rows: the bf16 cache (the kernels' own rounding, for reference), int8
  plain and smoothed, and float64 attention on each dequantized int8 cache (the
  quantization error alone).

The int8 cache holds the bf16 cache's data quantized (per vector, scale =
amax / 127), so each int8 row's `rel diff` to the bf16 row is a sanity check
(~1e-2 from quantization; a broken kernel gives ~1).

Without a GPU (CPU smoke run): tiny contexts, the CPU ops, host timers; the
numbers mean nothing, the run checks the script.

Writes benchmarks/results/int8.json and int8.png.

    python3 benchmarks/bench_int8.py [--quick] [--only 32k] [--no-prefill] [--no-accuracy] [--out-dir DIR]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_peers as ap  # noqa: E402
import common  # noqa: E402

NAME = "int8"
QWEN3 = dict(hq=32, hkv=8, d=128)
PAGE = 64

# (label, batch, context)
DECODE_CASES = [
    ("1x1k", 1, 1024),
    ("1x4k", 1, 4096),
    ("1x8k", 1, 8192),
    ("1x16k", 1, 16384),
    ("1x32k", 1, 32768),
    ("8x32k", 8, 32768),
    ("32x4k", 32, 4096),
]
PREFILL_CASES = [("1x2k", 2048), ("1x8k", 8192), ("1x16k", 16384)]
# CPU smoke run (no CUDA device): the same code paths on tiny sizes.
SMOKE_DECODE = [("1x256", 1, 256), ("2x512", 2, 512)]
SMOKE_PREFILL = [("1x128", 128)]

INT8 = "tileinfer int8 (attention op)"
BF16 = "tileinfer bf16 (attention op)"
PRE_INT8 = "tileinfer int8 prefill"
PRE_BF16 = "tileinfer bf16 prefill"
OUTLIERS = [5, 77, 100]  # outlier key channels (tests/test_int8_smoothing.py)


# ----------------------------------------------------------------------------- int8 problems

def quantize(x: torch.Tensor, smooth=None):
    """Symmetric per-vector int8 quantization of a pool [pages, hkv, page, d], as
    cache_write does (keys divided by smooth [hkv, d] first): (int8, fp32 scales)."""
    xf = x.float()
    if smooth is not None:
        xf = xf / smooth[None, :, None, :]
    amax = xf.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(xf / scale.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q, scale.contiguous()


def int8_bytes(p: ap.Problem) -> int:
    """Bytes an int8 attention must read: k and v (1 byte per element) plus one
    fp32 scale per vector, of every position once."""
    return 2 * sum(p.lens) * p.hkv * (p.d + 4)


def make_pair(lens, q_lens, cap):
    """Input sets of one case with the bf16 pools and, attached as p.int8, the
    same data quantized (shared by all sets, like the pools). Enough sets that
    the int8 ones alone exceed 3 x L2 (the bf16 ones are larger)."""
    one = ap.make_sets(lens, q_lens, QWEN3["hq"], QWEN3["hkv"], QWEN3["d"], page=PAGE, n_sets=1)[0]
    n_sets = common.sets_for(int8_bytes(one) + 2 * one.q.numel() * one.q.element_size(), cap=cap)
    if n_sets > 1:
        del one
        sets = ap.make_sets(lens, q_lens, QWEN3["hq"], QWEN3["hkv"], QWEN3["d"], page=PAGE, n_sets=n_sets)
    else:
        sets = [one]
    k8, ks = quantize(sets[0].k_cache)
    v8, vs = quantize(sets[0].v_cache)
    smooth = torch.ones(QWEN3["hkv"], QWEN3["d"], dtype=torch.float32, device=k8.device)
    for p in sets:
        p.int8 = dict(k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs, k_smooth=smooth)
    return sets


def ours_int8(p: ap.Problem, op: str, causal: bool = True):
    """Our `attention` or `prefill` op on the int8 cache of p (fn returns out)."""
    out = torch.empty_like(p.q)
    i8 = p.int8
    f = getattr(torch.ops.tileinfer_attn, op)

    def fn(out, q, kc, vc, bt, sl, cu, ks, vs, sm):
        if op == "prefill":
            f(out, None, q, kc, vc, bt, sl, cu, p.max_q_len, p.scale, causal, ks, vs, sm)
        else:
            f(out, q, kc, vc, bt, sl, cu, p.max_q_len, p.scale, causal, ks, vs, sm)
        return out
    return fn, (out, p.q, i8["k_cache"], i8["v_cache"], p.block_tables, p.seq_lens, p.cu_seqlens_q,
                i8["k_scale"], i8["v_scale"], i8["k_smooth"])


# Split counts timed on one sequence besides the split rule's 32 (rows of role
# "dev"): whether more blocks than the rule gives pay on the int8 loop.
INT8_SPLITS = [48]


def free_memory():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- decode and prefill

def run_decode(label, batch, ctx, args, ceil, errors):
    sets = make_pair([ctx] * batch, [1] * batch, cap=64)
    nbytes = {INT8: int8_bytes(sets[0]), BF16: ap.kv_bytes(sets[0])}
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    impls = [(BF16, lambda p: ap.ours_attention(p), True),
             (INT8, lambda p: ours_int8(p, "attention"), True)]  # int8 last: a fault then costs no bf16 row
    if batch == 1:  # more blocks than the split rule's 32 (the int8 loop is latency-bound at 2 blocks per SM)
        for splits in INT8_SPLITS:
            impls.append((f"int8 decode+combine, {splits} splits",
                          lambda p, s=splits: ap.ours_decode_combine(p, s, int8=p.int8), True, "dev"))
    rows = ap.time_impls(label, impls, sets, errors, ours=INT8, base=[BF16], metrics=lambda t: {},
                         extra=dict(batch=batch, ctx=ctx, n=1, page=PAGE, **QWEN3), **kw)
    for r in rows:  # both caches are ours
        if r["impl"] == BF16:
            r["role"] = "ours"
    del sets
    free_memory()
    t = {r["impl"]: r["us"] for r in rows}
    for r in rows:
        r["kv_bytes"] = nbytes[BF16 if r["impl"] == BF16 else INT8]
        r["mb_read"] = r["kv_bytes"] / 1e6
        r["gbps"] = r["kv_bytes"] / (r["us"] * 1e-6) / 1e9
        r["pct_copy"] = 100 * r["gbps"] / ceil["copy_gbps"] if ceil.get("copy_gbps") else None
        # t_bf16 / t_int8, on both rows of the case: > 1 when int8 is faster (a
        # split-count row: t_bf16 over its own time).
        t8 = t.get(INT8) if r["impl"] == BF16 else r["us"]
        r["speedup"] = t[BF16] / t8 if BF16 in t and t8 else None
    return rows


def run_prefill(label, length, args, ceil, errors):
    sets = make_pair([length], [length], cap=16)
    flops = ap.attention_flops(sets[0], causal=True)
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    impls = [(PRE_BF16, lambda p: ap.ours_prefill(p), True),
             (PRE_INT8, lambda p: ours_int8(p, "prefill"), True)]

    def metrics(t):
        tflops = flops / t.seconds / 1e12
        return dict(tflops=tflops, pct_gemm=100 * tflops / ceil["gemm_tflops"] if ceil.get("gemm_tflops") else None)
    rows = ap.time_impls(label, impls, sets, errors, ours=PRE_INT8, base=[PRE_BF16], metrics=metrics,
                         extra=dict(lens=[length], page=PAGE, **QWEN3), **kw)
    for r in rows:  # both caches are ours
        r["role"] = "ours"
    del sets
    free_memory()
    t = {r["impl"]: r["us"] for r in rows}
    for r in rows:
        r["speedup"] = t[PRE_BF16] / t[PRE_INT8] if PRE_BF16 in t and PRE_INT8 in t else None
    return rows


# ----------------------------------------------------------------------------- accuracy

def accuracy(keys_kind, batch, length, device, errors, seed=0):
    """Rows of relative errors of one decode step against float64 attention on
    the unquantized bf16 inputs (see the module docstring)."""
    import tileinfer_attn as ti
    ref = common.load_reference()
    from tileinfer_attn.testing import rel_error

    ops = torch.ops.tileinfer_attn
    hq, hkv, d = QWEN3["hq"], QWEN3["hkv"], QWEN3["d"]
    g = torch.Generator().manual_seed(seed)
    tokens = batch * length
    keys = torch.randn(tokens, hkv, d, generator=g)
    values = torch.randn(tokens, hkv, d, generator=g)
    q = torch.randn(batch, hq, d, generator=g)
    if keys_kind == "outlier channels":
        keys[..., OUTLIERS] *= 40.0
        q[..., OUTLIERS] /= 40.0
    k, v, q = (t.bfloat16().to(device) for t in (keys, values, q))
    pages = math.ceil(length / PAGE)
    num_pages = batch * pages + 1
    perm = torch.randperm(num_pages, generator=g)[: batch * pages].view(batch, pages)
    tables = perm.int().to(device)
    lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    cu_all = (torch.arange(batch + 1, dtype=torch.int32) * length).to(device)  # every position, one step
    cu_one = torch.arange(batch + 1, dtype=torch.int32, device=device)  # then one query per sequence
    shape = (num_pages, hkv, PAGE, d)
    scale = d ** -0.5

    bf16 = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(2)]
    ops.cache_write(*bf16, k, v, tables, lens, cu_all)
    exact = ref.paged_attention(q, *bf16, tables, lens, cu_one, 1, scale, True, exact=True)
    rows = []

    def row(impl, out):
        rows.append(dict(keys=keys_kind, impl=impl, batch=batch, ctx=length, rel_error=rel_error(out, exact)))

    def attend(kc, vc, **quant):
        out = torch.empty_like(q)
        ops.attention(out, q, kc, vc, tables, lens, cu_one, 1, scale, True, quant.get("k_scale"),
                      quant.get("v_scale"), quant.get("k_smooth"))
        return out

    common.attempt(f"accuracy {keys_kind} bf16 cache", lambda: row("bf16 cache (attention op)", attend(*bf16)),
                   errors)
    for name, smooth in (("int8", None), ("int8 smoothed", ti.key_smoothing_factors(k).to(device))):
        pools = [torch.zeros(shape, dtype=torch.int8, device=device) for _ in range(2)]
        quant = dict(k_scale=torch.ones(shape[:3], device=device), v_scale=torch.ones(shape[:3], device=device),
                     k_smooth=smooth)
        ops.cache_write(*pools, k, v, tables, lens, cu_all, quant["k_scale"], quant["v_scale"], smooth)
        common.attempt(f"accuracy {keys_kind} {name}", lambda: row(f"{name} cache (attention op)",
                                                                     attend(*pools, **quant)), errors)
        row(f"{name}: float64 on the dequantized cache",
            ref.paged_attention(q, *pools, tables, lens, cu_one, 1, scale, True, exact=True, **quant))
    if device == "cuda":
        torch.cuda.synchronize()
    return rows


# ----------------------------------------------------------------------------- main

def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--no-prefill", action="store_true", help="skip the prefill cases")
    p.add_argument("--no-accuracy", action="store_true", help="skip the accuracy table")
    args = p.parse_args()
    env = common.print_header(NAME)
    ceil = common.measure_ceilings(quick=args.quick, skip=args.no_ceilings)
    mod, why = common.load_tileinfer()
    cuda = torch.cuda.is_available()
    if cuda:
        missing = [n for n in ("prefill", "decode", "combine", "cache_write") if not common.has_cuda_kernel(n)[0]]
        ours = (not missing, common.has_cuda_kernel(missing[0])[1] if missing else "")
    else:
        ours = (mod is not None, why or "")
        print("   no CUDA device: CPU smoke run (tiny sizes, CPU ops, host timers; the numbers mean nothing)")
    print(f"   tileinfer ops: {'yes' if ours[0] else 'skipped: ' + ours[1]}")
    errors, rows, prefill, acc = [], [], [], []
    if not ours[0]:
        errors.append(dict(label="tileinfer", error=ours[1]))
    else:
        for label, batch, ctx in (DECODE_CASES if cuda else SMOKE_DECODE):
            if args.only and args.only not in label:
                continue
            print(f"-- decode {label}: {batch} x {ctx} positions, 32/8 heads, d 128, page {PAGE}")
            rows += common.attempt(f"decode {label}", lambda a=(label, batch, ctx): run_decode(*a, args, ceil, errors),
                                   errors) or []
        if not args.no_prefill:
            for label, length in (PREFILL_CASES if cuda else SMOKE_PREFILL):
                if args.only and args.only not in label:
                    continue
                print(f"-- prefill {label}: causal, 32/8 heads, d 128, page {PAGE}")
                prefill += common.attempt(f"prefill {label}",
                                          lambda a=(label, length): run_prefill(*a, args, ceil, errors), errors) or []
        if not args.no_accuracy and (not args.only or args.only in "accuracy"):
            batch, length = (4, 4096) if args.quick else (8, 8192)
            if not cuda:
                batch, length = 2, 256
            print(f"-- accuracy: decode step of {batch} sequences x {length} positions, against float64 on the "
                  f"unquantized bf16 inputs")
            for kind in ("random keys", "outlier channels"):
                acc += common.attempt(f"accuracy {kind}",
                                      lambda k=kind: accuracy(k, batch, length, "cuda" if cuda else "cpu", errors),
                                      errors) or []

    common.print_table(rows, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"),
                              ("int8 speedup", "speedup", ".2f"), ("GB/s", "gbps", ".0f"), ("%copy", "pct_copy", ".0f"),
                              ("MB read", "mb_read", ".1f"), ("rel diff", "rel_diff", ".1e"), ("mode", "mode", ""),
                              ("sets", "sets", ""), ("role", "role", "")],
                       title=f"\n{NAME} decode (GB/s of the bytes each cache must read: int8 k+v + fp32 scales, or "
                             f"bf16 k+v; speedup = t_bf16 / t_int8; rel diff: int8 vs bf16 output)")
    if prefill:
        common.print_table(prefill, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"),
                                     ("TFLOP/s", "tflops", ".0f"), ("%gemm", "pct_gemm", ".0f"),
                                     ("int8 speedup", "speedup", ".2f"), ("rel diff", "rel_diff", ".1e"),
                                     ("mode", "mode", "")],
                           title=f"\n{NAME} prefill (causal FLOPs; speedup = t_bf16 / t_int8)")
    if acc:
        common.print_table(acc, [("keys", "keys", ""), ("impl", "impl", ""), ("rel error", "rel_error", ".2e"),
                                 ("batch", "batch", ""), ("ctx", "ctx", "")],
                           title=f"\n{NAME} accuracy (||out - exact|| / ||exact||, exact: float64 on the "
                                 f"unquantized bf16 inputs)")
    common.save(NAME, dict(env=env, ceilings=ceil, status=dict(ours=ours), rows=rows, prefill=prefill,
                           accuracy=acc, errors=errors), args)


if __name__ == "__main__":
    main()
