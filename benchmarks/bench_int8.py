"""Quantized KV cache benchmark (int8; fp8 e4m3 with per-tensor or per-vector
scales): speed of our attention on each quantized cache against our own bf16
cache in the same run, and the accuracy each costs.

Shapes: Qwen3-4B attention (32 query heads, 8 KV heads, head dim 128, page 64).
- Decode, one query per sequence, batch x context (1,1k) (1,4k) (1,8k) (1,16k)
  (1,32k) (8,32k) (32,4k) (128,2k), and MQA (32/1 heads) at (1,4k) (1,32k)
  (32,4k), whose 32 packed rows take the 16-row decode tile for one sequence
  and the 64-row tile for more (dev rows: each quantized cache on the 64-row
  tile): the `attention` op (decode + combine, as bench_decode.py times
  bf16) on the int8, fp8 per-tensor and fp8 per-vector caches and on the
  bf16 cache holding the same data, all as CUDA-graph replays. Reported: us,
  speedup (t_bf16 / t of the cache; a quantized cache reads about half the
  bytes, so ~1.8x is the bound at long contexts),
  achieved GB/s of the bytes each must read (k and v of one byte plus, per
  vector, their fp32 scales: 2 x L x Hkv x (d + 4) per sequence; fp8 per
  tensor 2 x L x Hkv x d; bf16: 2 x L x Hkv x d x 2) and % of the copy
  bandwidth measured in this run. The per-vector calls pass k_smooth (ones,
  PagedKVCache's default), as a model does; the fp8 per-tensor scales are
  amax / 448 of the pools (a calibrated scale).
- Prefill, causal, one prompt of 2k / 8k / 16k, 16 prompts of 1k (a varlen
  batch) and a 2k chunk after a 6k cached prefix: the prefill op on each
  cache, TFLOP/s of causal FLOPs (2 * 2 * L * L / 2 * d * Hq for a prompt,
  as bench_prefill.py); dev rows:
  each quantized cache with every tile through the converter warps
  (TILEINFER_PREFILL_OWN_KV=0, without the pass over the step's own keys and
  values), and for the chunk without prefix rows
  (TILEINFER_PREFILL_PREFIX_MB=0: the prefix's tiles through the converters).
- Mixed steps (CUDA only), a prompt chunk beside single-query decodes, 16
  prompts and a lone prompt through the `attention` op on each cache, as
  graph replays. A step of two sequences or more runs its prefill beside
  its decodes (prefill.cu), a lone prompt in turn, its decodes on a side
  stream after the prefill grid; dev rows time the former with the parts in
  turn (TILEINFER_MIXED_DECODE_SMS=0), the latter with the decodes first on
  the caller's stream (TILEINFER_MIXED_SIDE_STREAM=0).
- Accuracy (no timing): a decode step whose keys, values and queries are
  written through cache_write into a bf16 cache and each quantized cache
  (ACCURACY_CACHES: int8 and fp8 per vector, plain and smoothed with
  key_smoothing_factors of the same keys; fp8 per tensor with calibrated
  scales), relative error ||out - exact|| / ||exact|| against float64
  attention on the unquantized (bf16) inputs; on plain random keys, on keys
  with outlier channels (x40, queries / 40 there, as
  tests/test_int8_smoothing.py builds them) and on a long context (32k
  positions) with 4 strongly attended positions. Rows: each cache through
  the attention op, and float64 attention on each dequantized cache (the
  quantization error alone). Without a GPU it runs the CPU ops (their
  dequantization in fp32), at the GPU's sizes for the long context.

The quantized caches hold the bf16 cache's data quantized, so each row's
`rel diff` to the bf16 row is a sanity check (~1e-2 from quantization; a
broken kernel gives ~1).

Without a GPU (CPU smoke run): tiny contexts, the CPU ops, host timers; the
numbers mean nothing, the run checks the script (the accuracy table is
meaningful: no timing).

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

MQA = dict(hq=32, hkv=1, d=128)

# (label, batch, context, heads)
DECODE_CASES = [
    ("1x1k", 1, 1024, QWEN3),
    ("1x4k", 1, 4096, QWEN3),
    ("1x8k", 1, 8192, QWEN3),
    ("1x16k", 1, 16384, QWEN3),
    ("1x32k", 1, 32768, QWEN3),
    ("8x32k", 8, 32768, QWEN3),
    ("32x4k", 32, 4096, QWEN3),
    ("128x2k", 128, 2048, QWEN3),
    ("MQA 32/1 1x4k", 1, 4096, MQA),
    ("MQA 32/1 1x32k", 1, 32768, MQA),
    ("MQA 32/1 32x4k", 32, 4096, MQA),
]
# (label, queries, positions), a list each (a sequence each): prompts, a
# varlen batch of prompts, and a chunk after a cached prefix.
PREFILL_CASES = [("1x2k", [2048], [2048]), ("1x8k", [8192], [8192]), ("1x16k", [16384], [16384]),
                 ("16x1k", [1024] * 16, [1024] * 16), ("2k chunk at 8k", [2048], [8192])]
# CPU smoke run (no CUDA device): the same code paths on tiny sizes.
SMOKE_DECODE = [("1x256", 1, 256, QWEN3), ("2x512", 2, 512, QWEN3)]
SMOKE_PREFILL = [("1x128", [128], [128])]

INT8 = "tileinfer int8 (attention op)"
BF16 = "tileinfer bf16 (attention op)"
PRE_INT8 = "tileinfer int8 prefill"
PRE_BF16 = "tileinfer bf16 prefill"
# The quantized caches timed beside bf16: impl row name -> (the problem's
# attribute holding its pools, the prefill row name).
FP8_TENSOR = "tileinfer fp8 per tensor (attention op)"
FI_FP8 = "flashinfer fp8 decode (per tensor)"
QUANT = {
    INT8: ("int8", PRE_INT8),
    FP8_TENSOR: ("fp8_tensor", "tileinfer fp8 per tensor prefill"),
    "tileinfer fp8 per vector (attention op)": ("fp8_vector", "tileinfer fp8 per vector prefill"),
}
OUTLIERS = [5, 77, 100]  # outlier key channels (tests/test_int8_smoothing.py)


# ----------------------------------------------------------------------------- int8 problems

def quantize(x: torch.Tensor, dtype=torch.int8, per_tensor=False):
    """Symmetric quantization of a pool [pages, hkv, page, d] into int8 or
    float8_e4m3fn, as cache_write does: (pool, fp32 scales [pages, hkv, page],
    or [1] per tensor: amax / 448 over the pool, as a calibrated scale)."""
    ref = common.load_reference()
    scale = x.float().abs().amax().reshape(1) / ref.QUANT_MAX[dtype] if per_tensor else None
    q, scale = ref.quantize(x, dtype, scale)
    return q, scale.contiguous()


def quant_bytes(p: ap.Problem, per_tensor=False) -> int:
    """Bytes a quantized attention must read: k and v (1 byte per element) plus,
    per vector, one fp32 scale per vector, of every position once."""
    return 2 * sum(p.lens) * p.hkv * (p.d + (0 if per_tensor else 4))


def make_pair(lens, q_lens, cap, heads=QWEN3):
    """Input sets of one case with the bf16 pools and, attached as p.int8,
    p.fp8_tensor and p.fp8_vector, the same data quantized (shared by all
    sets, like the pools). Enough sets that the quantized ones alone exceed
    3 x L2 (the bf16 ones are larger)."""
    hq, hkv, d = heads["hq"], heads["hkv"], heads["d"]
    one = ap.make_sets(lens, q_lens, hq, hkv, d, page=PAGE, n_sets=1)[0]
    n_sets = common.sets_for(quant_bytes(one) + 2 * one.q.numel() * one.q.element_size(), cap=cap)
    if n_sets > 1:
        del one
        sets = ap.make_sets(lens, q_lens, hq, hkv, d, page=PAGE, n_sets=n_sets)
    else:
        sets = [one]
    smooth = torch.ones(hkv, d, dtype=torch.float32, device=sets[0].k_cache.device)
    for attr, dtype, per_tensor in (("int8", torch.int8, False), ("fp8_tensor", torch.float8_e4m3fn, True),
                                    ("fp8_vector", torch.float8_e4m3fn, False)):
        k8, ks = quantize(sets[0].k_cache, dtype, per_tensor)
        v8, vs = quantize(sets[0].v_cache, dtype, per_tensor)
        pools = dict(k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs, k_smooth=None if per_tensor else smooth)
        for p in sets:
            setattr(p, attr, pools)
    return sets


def ours_quant(p: ap.Problem, op: str, attr: str = "int8", causal: bool = True):
    """Our `attention` or `prefill` op on the quantized cache p.<attr> (fn returns out)."""
    out = torch.empty_like(p.q)
    i8 = getattr(p, attr)
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

def run_decode(label, batch, ctx, heads, args, ceil, errors):
    sets = make_pair([ctx] * batch, [1] * batch, cap=64, heads=heads)
    nbytes = {BF16: ap.kv_bytes(sets[0]), **{name: quant_bytes(sets[0], attr == "fp8_tensor")
                                             for name, (attr, _) in QUANT.items()}}
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    # The quantized caches last: a fault then costs no bf16 row.
    impls = [(BF16, lambda p: ap.ours_attention(p), True)] + [
        (name, lambda p, a=attr: ours_quant(p, "attention", a), True) for name, (attr, _) in QUANT.items()]
    fi, _ = ap.load_flashinfer()
    if fi is not None and ap.flashinfer_allowed("decode_fp8"):  # the same fp8 pools, per-tensor scales
        impls.append((FI_FP8, lambda p: ap.flashinfer_decode(p, fp8=p.fp8_tensor), True))
    if batch == 1 and heads == QWEN3:  # more blocks than the split rule's 32 (the int8 loop is latency-bound)
        for splits in INT8_SPLITS:
            impls.append((f"int8 decode+combine, {splits} splits",
                          lambda p, s=splits: ap.ours_decode_combine(p, s, int8=p.int8), True, "dev"))
    if 16 < heads["hq"] // heads["hkv"] <= 32:  # launches of 17-32 rows: each cache on the 64-row tile too
        for name, (attr, _) in QUANT.items():
            impls.append((f"{name.split(' (')[0]} on the 64-row tile",
                          lambda p, a=attr: ap.on_decode_row_tile(64, ours_quant(p, "attention", a)), True, "dev"))
    rows = ap.time_impls(label, impls, sets, errors, ours=INT8, base=[BF16], metrics=lambda t: {},
                         extra=dict(batch=batch, ctx=ctx, n=1, page=PAGE, **heads), **kw)
    for r in rows:  # every cache is ours
        if r["impl"] == BF16 or r["impl"] in QUANT:
            r["role"] = "ours"
    del sets
    free_memory()
    t = {r["impl"]: r["us"] for r in rows}
    nbytes[FI_FP8] = nbytes[FP8_TENSOR]
    for r in rows:
        r["kv_bytes"] = nbytes.get(r["impl"], nbytes[INT8])
        r["mb_read"] = r["kv_bytes"] / 1e6
        r["gbps"] = r["kv_bytes"] / (r["us"] * 1e-6) / 1e9
        r["pct_copy"] = 100 * r["gbps"] / ceil["copy_gbps"] if ceil.get("copy_gbps") else None
        # t_bf16 / t_quantized: > 1 when the quantized cache is faster (the
        # bf16 row: over the int8 time; a split-count row: over its own time).
        t8 = t.get(INT8) if r["impl"] == BF16 else r["us"]
        r["speedup"] = t[BF16] / t8 if BF16 in t and t8 else None
    return rows


def run_prefill(label, q_lens, lens, args, ceil, errors):
    sets = make_pair(lens, q_lens, cap=16)
    flops = ap.attention_flops(sets[0], causal=True)
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    impls = [(PRE_BF16, lambda p: ap.ours_prefill(p), True)] + [
        (pre, lambda p, a=attr: ours_quant(p, "prefill", a), True) for attr, pre in QUANT.values()]
    # Dev rows: every tile through the converter warps, without the pass over
    # the step's own keys and values (prefill.cu, TILEINFER_PREFILL_OWN_KV).
    impls += [(f"{pre}, every tile converted",
               lambda p, a=attr: ap.with_environment("TILEINFER_PREFILL_OWN_KV", "0", ours_quant(p, "prefill", a)),
               True, "dev") for attr, pre in QUANT.values()]
    if sum(q_lens) < sum(lens):  # a chunk: its prefix's tiles through the converters (prefill.cu, prefix_room)
        impls += [(f"{pre}, no prefix rows",
                   lambda p, a=attr: ap.with_environment("TILEINFER_PREFILL_PREFIX_MB", "0",
                                                         ours_quant(p, "prefill", a)),
                   True, "dev") for attr, pre in QUANT.values()]

    def metrics(t):
        tflops = flops / t.seconds / 1e12
        return dict(tflops=tflops, pct_gemm=100 * tflops / ceil["gemm_tflops"] if ceil.get("gemm_tflops") else None)
    rows = ap.time_impls(label, impls, sets, errors, ours=PRE_INT8, base=[PRE_BF16], metrics=metrics,
                         extra=dict(lens=lens, q_lens=q_lens, page=PAGE, **QWEN3), **kw)
    for r in rows:  # both caches are ours
        if r["role"] != "dev":
            r["role"] = "ours"
    del sets
    free_memory()
    t = {r["impl"]: r["us"] for r in rows}
    for r in rows:  # t_bf16 / t of the row (the bf16 row: over the int8 time)
        t8 = t.get(PRE_INT8) if r["impl"] == PRE_BF16 else r["us"]
        r["speedup"] = t[PRE_BF16] / t8 if PRE_BF16 in t and t8 else None
    return rows


# Mixed steps: (label, prompt chunks as (queries, positions), decodes as
# (count, positions)).
MIXED_CASES = [("2k chunk + 64 decodes, 4k", [(2048, 4096)], (64, 4096)),
               ("512 chunk + 16 decodes, 2k", [(512, 2048)], (16, 2048)),
               ("16 x 1k prompts", [(1024, 1024)] * 16, (0, 0)),
               ("1 x 512 prompt", [(512, 512)], (0, 0))]


def run_mixed(label, chunks, decodes, args, errors):
    """One mixed step through the attention op on each cache (graph replays).
    Dev rows, on every cache: a step of two sequences or more (beside its
    decodes by default) with its parts in turn (TILEINFER_MIXED_DECODE_SMS=0);
    a lone prompt (in turn, its empty decode launches on the side stream)
    with the decodes first on the caller's stream
    (TILEINFER_MIXED_SIDE_STREAM=0)."""
    n_dec, ctx = decodes
    lens = [c for _, c in chunks] + [ctx] * n_dec
    q_lens = [q for q, _ in chunks] + [1] * n_dec
    sets = make_pair(lens, q_lens, cap=16)
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    switch, dev = ("TILEINFER_MIXED_SIDE_STREAM", "decodes first") if len(lens) == 1 else \
        ("TILEINFER_MIXED_DECODE_SMS", "in turn")
    rows = []
    for name, attr in [(BF16, None)] + [(name, attr) for name, (attr, _) in QUANT.items()]:
        make = ap.ours_attention if attr is None else (lambda p, a=attr: ours_quant(p, "attention", a))
        for value in (None, "0"):
            impl = name if value is None else f"{name}, {dev}"
            with common.environment_variable(switch, value):
                r = ap.timed(f"{label} {impl}", make, sets, True, errors, **kw)
            if r is not None:
                rows.append(dict(case=label, impl=impl, role="ours" if value is None else "dev",
                                 us=r[0].median_us, p10_us=r[0].p10_us, p90_us=r[0].p90_us, mode=r[0].mode,
                                 sets=r[0].sets, **ap.gpu_columns(r[0])))
    del sets
    free_memory()
    t = {r["impl"]: r["us"] for r in rows}
    for r in rows:  # t_bf16 / t; a dev row: its time over the default's on the same cache
        r["speedup"] = t[BF16] / r["us"] if BF16 in t and r["role"] == "ours" else None
        base = t.get(r["impl"].split(f", {dev}")[0])
        r["dev_over_default"] = r["us"] / base if r["role"] == "dev" and base else None
    return rows


# ----------------------------------------------------------------------------- accuracy

# Caches of the accuracy table: (name, dtype, scale kind, key smoothing).
ACCURACY_CACHES = [
    ("bf16", torch.bfloat16, None, False),
    ("int8", torch.int8, "vector", False),
    ("int8 + smoothing", torch.int8, "vector", True),
    ("fp8 per tensor", torch.float8_e4m3fn, "tensor", False),
    ("fp8 per vector", torch.float8_e4m3fn, "vector", False),
    ("fp8 per vector + smoothing", torch.float8_e4m3fn, "vector", True),
]
# Key sets of the accuracy table: (kind, batch, context) on a GPU and on the CPU.
ACCURACY_KEYS = [("random keys", (8, 8192), (2, 4096)), ("outlier channels", (8, 8192), (2, 4096)),
                 ("long context, 4 strong positions", (1, 32768), (1, 32768))]
STRONG = [100, 5000, 20000, -10]  # strongly attended positions of the long-context keys


def accuracy(keys_kind, batch, length, device, errors, seed=0):
    """Rows of relative errors of one decode step against float64 attention on
    the unquantized bf16 inputs (see the module docstring), for every cache of
    ACCURACY_CACHES."""
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
    elif keys_kind.startswith("long context"):
        # Keys along their query group's mean direction: scores about 8 above
        # the others', each such position a few percent of the probability.
        mean_q = q.view(batch, hkv, hq // hkv, d).mean(2)  # [batch, hkv, d]
        for pos in STRONG:
            keys[pos % length] = 3.0 * mean_q[0]
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

    for name, dtype, kind, smoothing in ACCURACY_CACHES:
        if dtype == torch.bfloat16:
            common.attempt(f"accuracy {keys_kind} {name}", lambda: row(f"{name} cache (attention op)", attend(*bf16)),
                           errors)
            continue
        pools = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2)]
        if kind == "vector":
            k_scale, v_scale = (torch.ones(shape[:3], device=device) for _ in range(2))
        else:  # a calibrated per-tensor scale, as vLLM's k_scale / v_scale: amax / 448 over the layer's data
            k_scale, v_scale = (x.float().abs().amax().reshape(1) / 448.0 for x in (k, v))
        quant = dict(k_scale=k_scale, v_scale=v_scale,
                     k_smooth=ti.key_smoothing_factors(k).to(device) if smoothing else None)
        ops.cache_write(*pools, k, v, tables, lens, cu_all, quant["k_scale"], quant["v_scale"], quant["k_smooth"])
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
    errors, rows, prefill, mixed, acc = [], [], [], [], []
    if not ours[0]:
        errors.append(dict(label="tileinfer", error=ours[1]))
    else:
        for label, batch, ctx, heads in (DECODE_CASES if cuda else SMOKE_DECODE):
            if args.only and args.only not in label:
                continue
            print(f"-- decode {label}: {batch} x {ctx} positions, {heads['hq']}/{heads['hkv']} heads, "
                  f"d {heads['d']}, page {PAGE}")
            rows += common.attempt(f"decode {label}",
                                   lambda a=(label, batch, ctx, heads): run_decode(*a, args, ceil, errors),
                                   errors) or []
        if not args.no_prefill:
            for label, q_lens, lens in (PREFILL_CASES if cuda else SMOKE_PREFILL):
                if args.only and args.only not in label:
                    continue
                print(f"-- prefill {label}: causal, 32/8 heads, d 128, page {PAGE}")
                prefill += common.attempt(f"prefill {label}",
                                          lambda a=(label, q_lens, lens): run_prefill(*a, args, ceil, errors),
                                          errors) or []
        if cuda:
            for label, chunks, decodes in MIXED_CASES:
                if args.only and args.only not in label:
                    continue
                print(f"-- mixed step {label}: attention op, 32/8 heads, d 128, page {PAGE}")
                mixed += common.attempt(f"mixed {label}",
                                        lambda a=(label, chunks, decodes): run_mixed(*a, args, errors), errors) or []
        if not args.no_accuracy and (not args.only or args.only in "accuracy"):
            for kind, gpu_shape, cpu_shape in ACCURACY_KEYS:
                batch, length = gpu_shape if cuda else cpu_shape
                print(f"-- accuracy, {kind}: decode step of {batch} sequences x {length} positions, against "
                      f"float64 on the unquantized bf16 inputs ({'CUDA' if cuda else 'CPU'} ops)")
                acc += common.attempt(f"accuracy {kind}",
                                      lambda a=(kind, batch, length): accuracy(*a, "cuda" if cuda else "cpu", errors),
                                      errors) or []

    common.print_table(rows, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"),
                              ("t_bf16 / t", "speedup", ".2f"), ("GB/s", "gbps", ".0f"), ("%copy", "pct_copy", ".0f"),
                              ("MB read", "mb_read", ".1f"), ("rel diff", "rel_diff", ".1e"), ("mode", "mode", ""),
                              ("sets", "sets", ""), ("role", "role", "")],
                       title=f"\n{NAME} decode (GB/s of the bytes each cache must read: k+v, + fp32 scales per vector; "
                             f"rel diff: vs the bf16 cache's output)")
    if prefill:
        common.print_table(prefill, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"),
                                     ("TFLOP/s", "tflops", ".0f"), ("%gemm", "pct_gemm", ".0f"),
                                     ("t_bf16 / t", "speedup", ".2f"), ("rel diff", "rel_diff", ".1e"),
                                     ("mode", "mode", "")],
                           title=f"\n{NAME} prefill (causal FLOPs)")
    if mixed:
        common.print_table(mixed, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"),
                                   ("t_bf16 / t", "speedup", ".2f"), ("t_dev / t", "dev_over_default", ".2f"),
                                   ("mode", "mode", ""), ("role", "role", "")],
                           title=f"\n{NAME} mixed steps (attention op; t_dev / t: a dev row (in turn, or decodes "
                                 f"first) over the default on its cache)")
    if acc:
        common.print_table(acc, [("keys", "keys", ""), ("impl", "impl", ""), ("rel error", "rel_error", ".2e"),
                                 ("batch", "batch", ""), ("ctx", "ctx", "")],
                           title=f"\n{NAME} accuracy (||out - exact|| / ||exact||, exact: float64 on the "
                                 f"unquantized bf16 inputs)")
    common.save(NAME, dict(env=env, ceilings=ceil, status=dict(ours=ours), rows=rows, prefill=prefill,
                           mixed=mixed, accuracy=acc, errors=errors), args)


if __name__ == "__main__":
    main()
