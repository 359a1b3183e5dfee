"""CPU prefill, decode + combine and attention against float64 exact attention
(<= 4 ulps for bf16/fp16, 1e-5 relative for fp32: the Numerics section of
docs/CONTRACT.md), over dtypes, head dims, page sizes, GQA ratios (incl. not a
power of two), lengths around page boundaries, several sequences of different
lengths, causal and not, 1-16 query steps, int8 and fp8 pools."""
import itertools

import pytest
import torch

from tileinfer_attn import reference as R
from tileinfer_attn.testing import make_problem, poison_, rel_error, ulp_error
from op_helpers import QUANT_KINDS, exact_attention

ops = torch.ops.tileinfer_attn

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
HEAD_DIMS = [64, 80, 96, 128, 256]
PAGE_SIZES = [16, 32, 64, 128]
# (num_q_heads, num_kv_heads): MHA, GQA 4, GQA 3 (not a power of two), MQA 8, GQA 5 with 2 KV heads.
GQA = [(4, 4), (8, 2), (6, 2), (8, 1), (10, 2)]


def error(out, exact, dtype):
    return rel_error(out, exact) if dtype == torch.float32 else ulp_error(out, exact, dtype)


def tol(dtype):
    return 1e-5 if dtype == torch.float32 else 4.0


def boundary_lens(ps, extra):
    """Lengths around page boundaries, plus one of a single position."""
    return [ps - 1, ps, ps + 1, 2 * ps + extra, 1]


# Every (dtype, head_dim, page_size), each with one GQA ratio (cycling, so all appear
# with every dtype), both causal and not: 36 cases.
PREFILL_CASES = [
    pytest.param(dt, d, ps, GQA[i % len(GQA)], id=f"{str(dt)[6:]}-d{d}-p{ps}-h{GQA[i % len(GQA)][0]}x{GQA[i % len(GQA)][1]}")
    for i, (dt, d, ps) in enumerate(itertools.product(DTYPES, HEAD_DIMS, PAGE_SIZES))
]


@pytest.mark.parametrize("dtype,head_dim,page_size,heads", PREFILL_CASES)
def test_prefill_matches_exact(dtype, head_dim, page_size, heads):
    hq, hkv = heads
    lens = boundary_lens(page_size, 3)
    # A mixed batch: a whole prompt, a decode step, chunked-prefill chunks, a 1-position sequence.
    q_lens = [page_size - 1, 1, 17, 9, 1]
    p = make_problem(lens, q_lens, hq, hkv, head_dim, page_size, dtype=dtype, seed=head_dim + page_size)
    for causal in (True, False):
        out = poison_(torch.empty_like(p.q))
        lse = poison_(torch.empty(p.q.shape[:2]))
        ops.prefill(out, lse, *p.args(), p.scale, causal)
        ref, ref_lse = exact_attention(p, causal)
        assert error(out, ref, dtype) <= tol(dtype), f"causal={causal}"
        torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", range(1, 17))
def test_decode_combine_matches_exact(n):
    """Steps of n = 1..16 queries (decode, speculative verify), causal within the step."""
    dtype = DTYPES[n % 3]
    head_dim = HEAD_DIMS[(n // 3) % len(HEAD_DIMS)]
    page_size = PAGE_SIZES[n % 4]
    hq, hkv = GQA[n % len(GQA)]
    lens = [max(n, L) for L in boundary_lens(page_size, n)]
    p = make_problem(lens, [n] * len(lens), hq, hkv, head_dim, page_size, dtype=dtype, seed=n)
    for splits, causal in ((1, True), (3, True), (8, False)):
        po = poison_(torch.empty(splits, *p.q.shape))
        pl = poison_(torch.empty(splits, *p.q.shape[:2]))
        ops.decode(po, pl, *p.args(), p.scale, causal)
        out = poison_(torch.empty_like(p.q))
        lse = poison_(torch.empty(p.q.shape[:2]))
        ops.combine(out, lse, po, pl)
        ref, ref_lse = exact_attention(p, causal)
        assert error(out, ref, dtype) <= tol(dtype), f"splits={splits} causal={causal}"
        torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_decode_split_rule_and_neutral_partials(causal):
    """Split i holds attention over pages [i*ceil(P/S), (i+1)*ceil(P/S)) exactly;
    splits with no page are neutral (out 0, lse -inf)."""
    page_size, splits = 16, 4
    lens = [16 * 7 + 5, 3, 40]  # 8 pages (2 per split), 1 page, 3 pages (splits 2 and 3 empty)
    p = make_problem(lens, [2, 1, 4], 8, 2, 64, page_size, dtype=torch.float32, seed=3)
    po = poison_(torch.empty(splits, *p.q.shape))
    pl = poison_(torch.empty(splits, *p.q.shape[:2]))
    ops.decode(po, pl, *p.args(), p.scale, causal)
    cu = p.cu_seqlens_q.tolist()
    for s, L in enumerate(lens):
        pages = -(-L // page_size)
        per = -(-pages // splits)
        for i in range(splits):
            lo, hi = min(pages, i * per), min(pages, (i + 1) * per)
            tables = p.block_tables.clone()
            tables[s, :lo] = -1  # the reference skips pages outside the pool: keep only [lo, hi)
            tables[s, hi:] = -1
            ref, ref_lse = R.paged_attention(p.q, p.k_cache, p.v_cache, tables, p.seq_lens, p.cu_seqlens_q,
                                             p.max_q_len, p.scale, causal, exact=True, return_lse=True)
            rows = slice(cu[s], cu[s + 1])
            if lo == hi:
                assert (po[i, rows] == 0).all() and (pl[i, rows] == float("-inf")).all()
            torch.testing.assert_close(po[i, rows].double(), ref[rows], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(pl[i, rows].double(), ref_lse[rows], rtol=1e-5, atol=1e-5)


def test_combine_matches_float64_merge():
    g = torch.Generator().manual_seed(0)
    po = torch.randn(5, 7, 4, 128, generator=g)
    pl = torch.randn(5, 7, 4, generator=g) * 3
    pl[1] = float("-inf")          # a neutral split
    po[1] = 0
    pl[:, 2, 1] = float("-inf")    # a row where every split is neutral
    po[:, 2, 1] = 0
    for dtype in DTYPES:
        out = poison_(torch.empty(7, 4, 128, dtype=dtype))
        lse = poison_(torch.empty(7, 4))
        ops.combine(out, lse, po, pl)
        ref, ref_lse = R.merge_partials(po, pl)
        assert error(out, ref, dtype) <= (1e-6 if dtype == torch.float32 else 1.0)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)
        assert (out[2, 1] == 0).all() and lse[2, 1] == float("-inf")


def test_combine_merges_prefill_over_disjoint_page_ranges():
    """Cascade: fp32 prefill over two disjoint page ranges (with lse), combined,
    equals attention over all pages."""
    p = make_problem([100, 70], [5, 3], 8, 2, 128, 16, dtype=torch.float32, seed=7)
    parts_o, parts_l = [], []
    for keep in (slice(0, 3), slice(3, None)):
        tables = torch.full_like(p.block_tables, -1)
        tables[:, keep] = p.block_tables[:, keep]
        o = poison_(torch.empty_like(p.q))
        lse = poison_(torch.empty(p.q.shape[:2]))
        ops.prefill(o, lse, p.q, p.k_cache, p.v_cache, tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len, p.scale,
                    False)
        parts_o.append(o)
        parts_l.append(lse)
    for dtype in DTYPES:
        out = poison_(torch.empty(p.q.shape, dtype=dtype))
        ops.combine(out, None, torch.stack(parts_o), torch.stack(parts_l))
        assert error(out, exact_attention(p, False)[0], dtype) <= tol(dtype)


@pytest.mark.parametrize("n,heads", [(1, (8, 2)), (4, (16, 2)), (16, (4, 4)), (1, (6, 2)), (5, (12, 4)), (17, (8, 2)),
                                     (64, (8, 2))])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_dispatch_matches_exact(n, heads, dtype):
    """The attention op: decode + combine (1-16 queries, any group) or prefill."""
    hq, hkv = heads
    lens = [n + 90, n, n + 31, n + 200]
    p = make_problem(lens, [n] * 4, hq, hkv, 128, 32, dtype=dtype, seed=n)
    for causal in (True, False):
        out = poison_(torch.empty_like(p.q))
        ops.attention(out, *p.args(), p.scale, causal)
        assert error(out, exact_attention(p, causal)[0], dtype) <= tol(dtype)


@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("page_size,head_dim", [(16, 64), (64, 128), (128, 256)])
@pytest.mark.parametrize("quant", list(QUANT_KINDS))
def test_quantized_cache_matches_dequantized_exact(quant, qdtype, smooth, page_size, head_dim):
    lens = boundary_lens(page_size, 5)
    p = make_problem(lens, [page_size - 1, 1, 3, 16, 1], 8, 2, head_dim, page_size, dtype=qdtype,
                     seed=page_size, **QUANT_KINDS[quant])
    if not smooth:
        p.k_smooth = None
    kw = p.quant_kwargs()
    for causal in (True, False):
        ref = exact_attention(p, causal)[0]
        out = poison_(torch.empty_like(p.q))
        ops.prefill(out, None, *p.args(), p.scale, causal, **kw)
        assert ulp_error(out, ref, qdtype) <= 4
        # decode + combine on the decode-shaped part of the batch
        d = make_problem(lens, [1, 1, 3, 16, 1], 8, 2, head_dim, page_size, dtype=qdtype, seed=page_size,
                         **QUANT_KINDS[quant])
        if not smooth:
            d.k_smooth = None
        out = poison_(torch.empty_like(d.q))
        ops.attention(out, *d.args(), d.scale, causal, **d.quant_kwargs())
        assert ulp_error(out, exact_attention(d, causal)[0], qdtype) <= 4


def test_out_of_range_page_ids_are_skipped():
    """Bad page ids on the host are skipped like on the GPU (never read), as the reference does."""
    p = make_problem([50, 70], [3, 2], 8, 2, 64, 16, dtype=torch.float32, seed=1)
    p.block_tables[0, 1] = -3
    p.block_tables[1, 2] = p.k_cache.shape[0] + 5
    ref = exact_attention(p, True)[0]
    for op in ("prefill", "attention"):
        out = poison_(torch.empty_like(p.q))
        if op == "prefill":
            ops.prefill(out, None, *p.args(), p.scale, True)
        else:
            ops.attention(out, *p.args(), p.scale, True)
        assert rel_error(out, ref) <= 1e-5


def test_rows_that_see_nothing_are_zero():
    """Empty sequences, sequences whose pages are all outside the pool: out 0, lse -inf, no NaN."""
    p = make_problem([0, 20, 33], [0, 2, 1], 4, 2, 64, 16, dtype=torch.bfloat16, seed=2)
    p.block_tables[1, :] = -1
    for causal in (True, False):
        out = poison_(torch.empty_like(p.q))
        lse = poison_(torch.empty(p.q.shape[:2]))
        ops.prefill(out, lse, *p.args(), p.scale, causal)
        assert (out[:2] == 0).all() and (lse[:2] == float("-inf")).all()
        assert torch.isfinite(out).all()
        out2 = poison_(torch.empty_like(p.q))
        ops.attention(out2, *p.args(), p.scale, causal)
        assert torch.equal(out2, out)


def test_padding_tokens():
    """Tokens past cu_seqlens_q[-1] (a padded batch): prefill leaves their rows
    alone, decode writes neutral partials for them, so combine gives 0."""
    p = make_problem([30, 12], [1, 1], 8, 2, 64, 16, dtype=torch.float32, seed=4)
    q = torch.cat([p.q, torch.randn(3, 8, 64)])
    out = poison_(torch.empty_like(q))
    ops.prefill(out, None, q, *p.args()[1:], p.scale, True)
    assert torch.isnan(out[2:]).all() and rel_error(out[:2], exact_attention(p, True)[0]) <= 1e-5
    out = poison_(torch.empty_like(q))
    ops.attention(out, q, *p.args()[1:], p.scale, True)
    assert (out[2:] == 0).all() and rel_error(out[:2], exact_attention(p, True)[0]) <= 1e-5


def test_deterministic():
    p = make_problem([300, 77], [4, 4], 8, 2, 128, 16, dtype=torch.bfloat16, seed=5)
    outs = []
    for _ in range(2):
        out = torch.empty_like(p.q)
        ops.attention(out, *p.args(), p.scale, True)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_strided_q_and_out():
    """q and out as views of packed [num_tokens, heads * 3, head_dim] tensors (token and head strides free)."""
    p = make_problem([40, 9], [5, 2], 4, 2, 64, 16, dtype=torch.float16, seed=6)
    packed = torch.randn(7, 12, 64).half()
    packed[:, 4:8] = p.q
    q = packed[:, 4:8]
    out_packed = poison_(torch.empty(7, 3, 4, 64, dtype=torch.float16))
    out = out_packed[:, 1]
    ops.prefill(out, None, q, *p.args()[1:], p.scale, True)
    assert ulp_error(out, exact_attention(p, True)[0], torch.float16) <= 4
    assert torch.isnan(out_packed[:, 0]).all() and torch.isnan(out_packed[:, 2]).all()
