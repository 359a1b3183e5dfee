"""GPU tests of the per-layer attention variants (window_left, logits_soft_cap,
sinks) on every CUDA kernel: the Hopper prefill (items of a whole group for
groups that are powers of two, of one query head for others; over int8 / fp8
caches too), the mma.sync tile kernel (per-vector scales off a 16-byte
boundary on Hopper; its 128-row tile from 2048 queries on), the fp32 kernel,
and the decode tiles (small, large, the int8 / fp8 ones, one split writing out
directly); a decode step captured in a CUDA graph and replayed while the
sequences grow past the window; bad device metadata with a window (kept last:
a fault kills the CUDA context). tests/test_variants.py runs the same checks
on both devices over smaller problems.

Same oracle and bounds as the other GPU tests (op_helpers): float64 attention
with the same variants, within 4 ulps (int8: 6) of each row's magnitude, lse
within 1e-4 relative; outputs poisoned with NaN first; the cache holds NaN
wherever no result may read (past each sequence's end, and the pages wholly
before the window, which must never be read).
"""
import dataclasses

import pytest
import torch

from op_helpers import (CACHE_KINDS, HEAD_DIMS, QUANT_KINDS, GrowingDecodeBatch, check_lse, check_out, exact_attention,
                        kernel_queries, misalign_scales_, need, need_path, poison_unowned_, run_attention, run_combine,
                        run_decode, run_prefill)
from tileinfer_attn import reference
from tileinfer_attn.testing import make_problem, poison_

pytestmark = pytest.mark.gpu

ops = torch.ops.tileinfer_attn
DEV = "cuda"
# Each model's per-layer constants (the sinks drawn per test).
VARIANTS = {
    "window": dict(window_left=True),
    "gpt-oss": dict(window_left=True, sinks=True),
    "gemma2": dict(window_left=True, logits_soft_cap=4.0),
    "softcap": dict(logits_soft_cap=4.0),
    "sinks": dict(sinks=True),
}


def kwargs(variant, window, hq, seed):
    kw = {}
    chosen = VARIANTS[variant]
    if chosen.get("window_left"):
        kw["window_left"] = window
    if "logits_soft_cap" in chosen:
        kw["logits_soft_cap"] = chosen["logits_soft_cap"]
    if chosen.get("sinks"):
        g = torch.Generator().manual_seed(seed)
        s = torch.randn(hq, generator=g) * 2
        s[0] = 5.0  # takes most of the probability of its rows
        kw["sinks"] = s.to(DEV)
    return kw


def scaled(p, factor=2.0):
    """Scores larger than head_dim ** -0.5 gives, so that the soft-cap bends them."""
    return dataclasses.replace(p, scale=factor * p.scale)


def run_all(p, causal, kw, dtype, what, decode=True, ulps=4.0):
    """prefill (out, lse), attention, and (decode-shaped problems) decode with
    several split counts + combine, all against one float64 oracle. The lse of
    a quantized problem is checked against float64 attention of the queries as
    the path's kernel rounds them (op_helpers.kernel_queries: int8 prefill on
    Hopper rounds to fp16, int8 decode to 15-bit integers; with k_smooth a
    shift of up to ~1e-3, above the 1e-4 bound), as in test_int8_gpu."""
    exact, exact_lse = exact_attention(p, causal, **kw)
    decode_lse = exact_lse
    if p.k_cache.dtype in (torch.int8, torch.float8_e4m3fn):  # the queries as each path rounds them
        unsmoothed = dataclasses.replace(p, k_smooth=None)
        _, exact_lse = exact_attention(dataclasses.replace(unsmoothed, q=kernel_queries(p, prefill=True)), causal,
                                       **kw)
        _, decode_lse = exact_attention(dataclasses.replace(unsmoothed, q=kernel_queries(p)), causal, **kw)
    poison_unowned_(p, kw.get("window_left", -1))
    out, lse = run_prefill(p, causal, **kw)
    check_out(out, exact, dtype, f"prefill {what}", ulps=ulps)
    check_lse(lse, exact_lse, dtype, f"prefill {what} lse")
    check_out(run_attention(p, causal, **kw), exact, dtype, f"attention {what}", ulps=ulps)
    if decode:
        for splits in (1, 3, 32):
            po, pl = run_decode(p, causal, splits, **kw)
            out, lse = run_combine(po, pl, dtype)
            check_out(out, exact, dtype, f"decode {splits} splits + combine {what}", ulps=ulps)
            check_lse(lse, decode_lse, dtype, f"decode {splits} splits + combine {what} lse")


# (variant, window): windows inside one key tile and across several (prefill:
# 128-key tiles, 64 at d 256), for the window alone and with each model's other
# variant; the variants without a window once.
PREFILL_CASES = [("window", 0), ("gpt-oss", 37), ("window", 130), ("gemma2", 130), ("gpt-oss", 300),
                 ("softcap", -1), ("sinks", -1)]
DECODE_CASES = [("window", 0), ("gpt-oss", 1), ("gemma2", 63), ("window", 64), ("gpt-oss", 200),
                ("gemma2", 5000), ("softcap", -1), ("sinks", -1)]


# ------------------------------------------------------------------ prefill kernels
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("variant,window", PREFILL_CASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_prefill_kernels(group, head_dim, variant, window, causal, seed):
    """bf16 / fp16 prompts of several hundred queries: windows that skip key
    tiles at both ends of a row tile's walk (and of each warpgroup's); on
    Hopper, group 3 takes an item per query head, 1 and 8 an item per group."""
    need("prefill")
    window = max(window, 0)
    lens = [700, 333, 129, 1, 64 + window]
    q_lens = [700, 200, 1, 1, 64 + window]
    page = [16, 64, 128][(group + head_dim // 64) % 3]
    p = scaled(make_problem(lens, q_lens, 2 * group, 2, head_dim, page, device=DEV, seed=seed))
    dtype = torch.float16 if (window + group + head_dim // 64) % 2 else torch.bfloat16
    p = dataclasses.replace(p, q=p.q.to(dtype), k_cache=p.k_cache.to(dtype), v_cache=p.v_cache.to(dtype))
    run_all(p, causal, kwargs(variant, window, 2 * group, seed), dtype, f"{variant} window {window}",
            decode=False)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("variant,window", PREFILL_CASES)
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("quant", list(QUANT_KINDS))
def test_prefill_quantized(quant, head_dim, variant, window, causal, seed):
    """An int8 or fp8 cache: on Hopper the warp-specialized kernel with its
    converter warps (per-tensor scales on the scores and the output,
    per-vector ones on each score and probability column; the queries
    rounded to fp16 per row), groups 1 and 8 (an item per group) and 3 (an
    item per query head)."""
    need("prefill")
    window = max(window, 0)
    group = (1, 3, 8)[(window + head_dim // 32 + len(variant)) % 3]  # (page: without len(variant))
    lens = [700, 333, 129, 1, 64 + window]
    q_lens = [700, 200, 1, 1, 64 + window]
    page = [16, 64, 128][(window + head_dim // 32) % 3]
    p = scaled(make_problem(lens, q_lens, 2 * group, 2, head_dim, page, device=DEV, seed=seed, smooth=bool(window % 2),
                            **QUANT_KINDS[quant]))
    run_all(p, causal, kwargs(variant, window, 2 * group, seed), torch.bfloat16,
            f"{quant} {variant} window {window}", decode=False, ulps=6.0)


# (cap, dtype) around the Hopper prefill's choices (softmax.cuh): bf16 takes a
# fixed exponent offset up to a cap of 52.6 (probabilities at most 1 up to
# 41.5, at most 2^31.5 at 52.5, never below 2^-120), the running maximum
# beyond; the one-instruction tanh up to a cap of 64 (bf16) or 8 (fp16), the
# exact one beyond.
SOFT_CAPS = [(4.0, torch.bfloat16), (41.0, torch.bfloat16), (50.0, torch.bfloat16), (52.5, torch.bfloat16),
             (60.0, torch.bfloat16), (100.0, torch.bfloat16), (4.0, torch.float16), (8.0, torch.float16),
             (12.0, torch.float16), (50.0, torch.float16)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("cap,dtype", SOFT_CAPS, ids=[f"{c}-{str(t)[6:]}" for c, t in SOFT_CAPS])
def test_prefill_soft_cap_range(cap, dtype, head_dim, causal, seed):
    """Scores three times the cap's size: the capped ones span the whole of
    [-cap, cap], and the first causal rows (a few keys each) often see only
    scores near -cap. Groups 1 and 8; with d 128 a sink per head of the
    cap's size, often far above every key of a row: every kernel joins it
    after the keys, so that fp16 probabilities stay relative to the keys'
    maximum (with the sink leading, keys far below it fell into fp16's
    subnormals: 4-5 ulps at a cap of 50 on the decode path)."""
    need("prefill")
    group = 1 if cap in (41.0, 52.5, 8.0) else 8
    p = make_problem([700, 333, 129, 1, 64], [700, 200, 1, 1, 64], 2 * group, 2, head_dim,
                     [16, 64, 128][head_dim // 64 % 3], device=DEV, seed=seed)
    p = scaled(p, 3 * cap)
    p = dataclasses.replace(p, q=p.q.to(dtype), k_cache=p.k_cache.to(dtype), v_cache=p.v_cache.to(dtype))
    kw = dict(logits_soft_cap=cap)
    if head_dim == 128:
        kw["sinks"] = (torch.randn(2 * group, generator=torch.Generator().manual_seed(seed)) * cap).to(DEV)
    run_all(p, causal, kw, dtype, f"soft-cap {cap}", decode=False)


@pytest.mark.parametrize("variant", ["gpt-oss", "gemma2"])
@pytest.mark.parametrize("cache", list(CACHE_KINDS))
def test_prefill_large_tile(variant, cache, seed):
    """2100 queries, group 3, a window of 500: the mma.sync kernel's 128-row
    tile (on Hopper, per-vector scales that start off a 16-byte boundary;
    elsewhere every cache), and on Hopper the warp-specialized kernel for a
    bf16 cache and per-tensor fp8 scales."""
    need("prefill")
    p = scaled(make_problem([2100, 600], [2100, 300], 6, 2, 128, 64, device=DEV, seed=seed, **CACHE_KINDS[cache]))
    if p.k_scale is not None and p.k_scale.numel() > 1:
        misalign_scales_(p)
    run_all(p, True, kwargs(variant, 500, 6, seed), torch.bfloat16, f"large tile {variant}", decode=False,
            ulps=6.0 if cache != "bf16" else 4.0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_fp32_kernel(head_dim, variant, causal, seed):
    """fp32 queries and cache: the CUDA-core kernel, prefill and decode."""
    need("prefill", "decode", "combine")
    lens = [300, 65, 1, 40]
    for q_lens in ([300, 17, 1, 40], [1, 16, 1, 7]):
        p = scaled(make_problem(lens, q_lens, 8, 2, head_dim, 16, dtype=torch.float32, device=DEV, seed=seed))
        run_all(p, causal, kwargs(variant, 45, 8, seed), torch.float32, f"fp32 {variant} {q_lens}",
                decode=max(q_lens) <= 16)


# ------------------------------------------------------------------ decode kernels
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("variant,window", DECODE_CASES)
@pytest.mark.parametrize("n,group", [(1, 4), (4, 8), (16, 4), (16, 16)])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_decode_kernels(head_dim, n, group, variant, window, causal, seed):
    """Steps of n queries (up to 32 rows: the small decode tile, a block per
    16 rows; more: the large one, whose keys d 256 halves to 32 a tile), split counts 1, 3 and 32
    over lengths around the window and the pages (64), with bf16 and fp16."""
    need("decode", "combine", "prefill")
    window = max(window, 0)
    lens = [n, window + n, window + n + 1, 65 + window, 3000]
    dtype = torch.float16 if window % 2 else torch.bfloat16
    p = scaled(make_problem(lens, [n] * 5, 2 * group, 2, head_dim, 64, dtype=dtype, device=DEV, seed=seed))
    run_all(p, causal, kwargs(variant, window, 2 * group, seed), dtype, f"n={n} {variant} window {window}")


@pytest.mark.parametrize("cache,negative", [*((c, "scale") for c in ["bf16", "fp32", *QUANT_KINDS]),
                                            ("fp8-tensor", "k_scale"), ("fp8-tensor", "both")])
@pytest.mark.parametrize("n", [1, 16])
def test_negative_scale(cache, negative, n, seed):
    """scale <= 0, which the kernels multiply into the scores before the
    softmax instead of folding it into exp2 (softmax.cuh, ScoreMap): prefill,
    attention and decode + combine over a bf16, an fp32, an int8 and both fp8
    caches, on the small and the large decode tiles; and a negative
    per-tensor k_scale, alone and with scale < 0. The Hopper prefill over
    a quantized cache folds each row's factor (scale times a per-tensor
    k_scale) into its softmax, so that factor must stay positive: the
    converted query rows take its sign (prefill_convert.cuh)."""
    need("decode", "combine", "prefill")
    dtype = torch.float32 if cache == "fp32" else torch.bfloat16
    p = make_problem([n, 150, 700], [n] * 3, 8, 2, 128, 16, dtype=dtype, device=DEV, seed=seed,
                     **QUANT_KINDS.get(cache, {}))
    if negative in ("scale", "both"):
        p = dataclasses.replace(p, scale=-0.05)
    if negative in ("k_scale", "both"):
        p = dataclasses.replace(p, k_scale=-p.k_scale)
    run_all(p, True, {}, dtype, f"{cache} n={n} negative {negative}", ulps=6.0 if cache in QUANT_KINDS else 4.0)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize("quant", list(QUANT_KINDS))
def test_int8_decode(quant, n, head_dim, variant, seed):
    """The int8 / fp8 decode tiles (the wide one where two blocks fit per SM, the
    small and the large ones) with each variant: five sequences of two KV
    heads, so that steps of up to 16 rows take the wide tile at d <= 128 with
    1 and 3 splits and the small one with 32 (320 blocks, past two per SM)."""
    need("decode", "combine", "prefill")
    lens = [n, 150, 151, 1000, 777]
    p = scaled(make_problem(lens, [n] * 5, 8 if n < 16 else 32, 2, head_dim, 16, device=DEV, seed=seed,
                            **QUANT_KINDS[quant]))
    run_all(p, True, kwargs(variant, 100, p.q.shape[1], seed), torch.bfloat16, f"{quant} n={n} {variant}",
            ulps=6.0)


@pytest.mark.parametrize("cache", ["fp16", *CACHE_KINDS])
@pytest.mark.parametrize("n,group", [(1, 4), (4, 8), (8, 8), (2, 3), (1, 16)])
def test_decode_far_sinks(n, group, cache, seed):
    """Sinks tens above every score of their rows, and far below: each
    decode tile (small, with one row tile and with two at 32 rows; large at
    64; quantized) and every prefill kernel (an
    item per query head on Hopper for group 3) joins the sink after the keys, so
    that the probabilities rounded to 16 bits stay relative to the keys'
    maximum rather than fall toward fp16's subnormals (a model of rows
    started from their sink puts these fp16 rows ~20 ulps off). Five
    sequences of two KV heads: steps of up to 16 rows over a quantized cache
    take the wide tile with 1 and 3 splits and the small one with 32 (320
    blocks, past two per SM)."""
    need("decode", "combine", "prefill")
    dtype = torch.float16 if cache == "fp16" else torch.bfloat16
    kind = {} if cache == "fp16" else CACHE_KINDS[cache]
    p = scaled(make_problem([n, 63, 64, 700, 129], [n] * 5, 2 * group, 2, 128, 64, dtype=dtype, device=DEV,
                            seed=seed, **kind))
    # From far below every score to 25 above it (rows of magnitude down to
    # e^-25 |v|; below fp16's normals the check's unit is its subnormals' spacing).
    g = torch.Generator().manual_seed(seed)
    sinks = torch.linspace(-20.0, 25.0, 2 * group)[torch.randperm(2 * group, generator=g)]
    run_all(p, True, dict(sinks=sinks.to(DEV)), dtype, f"{cache} n={n} far sinks",
            ulps=4.0 if cache in ("fp16", "bf16") else 6.0)


@pytest.mark.parametrize("cache", list(CACHE_KINDS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_single_split_writes_out(variant, cache, seed):
    """A batch with one split per (sequence, KV head): the decode kernel
    writes out itself, the sink in; the same bits as decode with one split +
    combine, and within the bounds."""
    need_path("attention")
    kv_heads, group, n = 4, 4, 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seqs = next(b for b in range(1, 4096) if ops.decode_num_splits(sms, b, kv_heads) == 1)
    g = torch.Generator().manual_seed(seed)
    lens = [n, 50, 51, 64, 65] + torch.randint(n, 700, (seqs - 5,), generator=g).tolist()
    p = make_problem(lens, [n] * seqs, kv_heads * group, kv_heads, 128, 16, device=DEV, seed=seed,
                     **CACHE_KINDS[cache])
    kw = kwargs(variant, 48, kv_heads * group, seed)
    exact, _ = exact_attention(p, True, **kw)
    poison_unowned_(p, kw.get("window_left", -1))
    out = run_attention(p, True, **kw)
    po, pl = run_decode(p, True, 1, **kw)
    expected, _ = run_combine(po, pl, torch.bfloat16)
    assert torch.equal(out, expected), "attention (single split) differs from decode + combine"
    check_out(out, exact, torch.bfloat16, f"single split {variant} {cache}", ulps=6.0 if cache != "bf16" else 4.0)


# ------------------------------------------------------------------ CUDA graphs
@pytest.mark.parametrize("variant", ["gpt-oss", "gemma2"])
@pytest.mark.parametrize("group,kv_heads,num_seqs", [(4, 2, 3), (3, 2, 3), (4, 8, 40)],
                         ids=["decode_path", "prefill_path", "decode_path_single_split"])
def test_cuda_graph_window_as_sequences_grow(variant, group, kv_heads, num_seqs, seed):
    """One decode step (cache_write + attention with a window of 40) captured
    once and replayed for 90 steps while the sequences grow from below the
    window to far past it: every replay equals an eager step bit for bit and,
    every few steps, float64 attention. The pages that fall wholly behind the
    window of every sequence are filled with NaN as the sequences move on,
    in the graph's pools too: a replay that read one would give NaN."""
    need_path("attention")
    need("cache_write")
    g = torch.Generator().manual_seed(seed)
    dtype, page, d, steps, window = torch.bfloat16, 16, 128, 90, 40
    kw = kwargs(variant, window, group * kv_heads, seed)
    start = [3, page - 1, 2 * page + 5] + [1 + (7 * i) % 30 for i in range(num_seqs - 3)]
    b = GrowingDecodeBatch(g, num_seqs, kv_heads, group, start, steps, page, d, dtype, DEV)
    behind = set()  # (sequence, page index) already filled with NaN

    def step(k_pool, v_pool, o, qq, kk, vv, bt, sl):
        ops.cache_write(k_pool, v_pool, kk, vv, bt, sl, b.cu_seqlens_q)
        ops.attention(o, qq, k_pool, v_pool, bt, sl, b.cu_seqlens_q, 1, b.scale, True, **kw)

    def next_step_inputs():
        b.grow()
        # Pages wholly behind every query's window from now on: NaN (never read).
        for s in range(num_seqs):
            for j in range(max(0, b.lens[s] - 1 - window) // page):
                if (s, j) not in behind:
                    behind.add((s, j))
                    for pool in b.pools + b.eager_pools:
                        pool[int(b.table[s, j])] = float("nan")

    next_step_inputs()
    graph = b.capture(step)
    for i in range(steps):
        if i > 0:
            next_step_inputs()
        poison_(b.out)
        graph.replay()
        assert torch.isfinite(b.out).all(), f"step {i}: NaN (a page behind the window was read?)"
        assert torch.equal(b.out, b.eager(step)), f"step {i}: graph replay differs from eager"
        if i % 15 == 0 or i == steps - 1:
            # The oracle on a copy without the NaN pages (it reads every page it gathers).
            clean = [torch.nan_to_num(t) for t in b.pools]
            exact = reference.paged_attention(b.q, *clean, b.block_tables, b.seq_lens, b.cu_seqlens_q, 1, b.scale,
                                              True, **kw, exact=True)
            check_out(b.out, exact, dtype, f"graph step {i} (lengths {b.lens[:3]}...)")


# ------------------------------------------------------------------ bad device data (keep last)
@pytest.mark.parametrize("path", ["prefill", "decode", "attention"])
def test_adversarial_metadata_with_window(path, seed):
    """Bad page ids inside and before the window, seq_lens beyond the table
    and negative, with a window, a soft-cap and sinks: no fault, finite rows,
    as the reference reads the metadata."""
    need_path(path)
    need("decode", "combine")
    q_lens = [5, 3, 20, 1] if path == "prefill" else [1, 2, 1, 3]
    p = make_problem([70, 40, 33, 50], q_lens, 8, 2, 64, 16, device=DEV, seed=seed)
    p.block_tables[0, 4] = p.k_cache.shape[0] + 5  # inside sequence 0's window
    p.block_tables[1, 0] = -3                      # before sequence 1's window
    p.seq_lens[2] = p.block_tables.shape[1] * 16 + 1000
    p.seq_lens[3] = 10**6
    kw = dict(window_left=20, logits_soft_cap=30.0, sinks=torch.randn(8, device=DEV))
    exact, _ = exact_attention(p, True, **kw)
    if path == "prefill":
        out, _ = run_prefill(p, True, **kw)
    elif path == "decode":
        out, _ = run_combine(*run_decode(p, True, 4, **kw), torch.bfloat16)
    else:
        out = run_attention(p, True, **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    check_out(out, exact, torch.bfloat16, f"{path} with bad metadata and a window")
