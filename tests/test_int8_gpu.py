"""GPU tests of attention over a quantized KV cache (docs/CONTRACT.md, "The
int8 cache", "The fp8 cache"), every test for each kind (op_helpers.QUANT_KINDS:
int8, fp8 with per-vector scales, fp8 with per-tensor scales): CUDA prefill,
decode (its partials merged in float64, and decode + combine) and the
`attention` dispatcher, against float64 attention on the dequantized cache
(reference.paged_attention(..., exact=True) with k_scale / v_scale / k_smooth);
same bits run to run; an int8 decode step (quantizing cache_write + attention)
captured in a CUDA graph and replayed while sequences grow; adversarial
metadata (kept last: a fault kills the CUDA context).

Numerics of the quantized kernels: queries multiplied by k_smooth in fp32 and
rounded per row (int8: 15-bit integers, or fp16 in Hopper prefill; fp8:
fp16, at the same per-row power of two); keys / values converted exactly to
fp16; each key's score multiplied by its k_scale; each probability multiplied
by its value's v_scale (over the running maximum of the value scales) and
rounded to fp16 for the PV product on the tensor cores; fp32 accumulation.

Every case draws fresh random inputs (a seed per test id; int8 values in
[-127, 127], fp8 values spread over e4m3's range, random scales and smoothing
factors, never zeros)
and poisons outputs with NaN first, so unwritten elements fail.

    python3 -m pytest -q -rs -n 8 tests/test_int8_gpu.py     # on a GPU machine
"""
import dataclasses
import functools
import math

import pytest
import torch

import op_helpers
from op_helpers import (HEAD_DIMS, QUANT_KINDS, check_neutral_splits, exact_attention, kernel_queries, kernels_run,
                        need, need_path, poison_unowned_, run_attention,
                        run_combine, run_decode, run_prefill)
from tileinfer_attn import reference
from tileinfer_attn.testing import make_problem, poison_, ulp_error

# Every test runs for each quantized cache kind (its `kind` argument).
pytestmark = [pytest.mark.gpu, pytest.mark.parametrize("kind", list(QUANT_KINDS))]

ops = torch.ops.tileinfer_attn
DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float16]  # q's dtype; an int8 cache takes bf16 / fp16 queries only
# Output tolerance, in ulps of q's dtype at each row's magnitude: 6, where the
# bf16 / fp16 caches get 4 (op_helpers.ULPS). The int8 kernels round two products
# that the float64 reference keeps exact: q * k_smooth (to 15 bits per query row,
# up to 2^-14 of the row's largest value per channel, which moves every score)
# and p * v_scale (to fp16, over the running maximum of the value scales) before
# the PV product. A PyTorch emulation of the same roundings in bf16 (3 bits
# coarser than the fp16 rounding of q * k_smooth that the bound was set for)
# reached 2.8 ulps with smoothing and 1.2 without over d 64-256, pages 16/64,
# lengths up to 700; online-softmax rescaling and the merge of splits add what
# they add on the bf16 cache (within 4). 6 leaves that margin, and a real bug
# (a scale applied twice or not at all, a wrong page, a missed mask) is off by
# far more.
ULPS = 6.0
# The Hopper prefill over per-vector scales that the writes would not store
# (test_int8_prefill_unrounded_scales): each key and value times its scale
# rounded to fp16 on top of the above.
ULPS_UNROUNDED = 10.0
# lse (fp32), relative to max(1, |lse|), as for the bf16 caches
# (op_helpers.LSE_REL); with k_smooth against the fp16-rounded
# q * k_smooth that the kernels use (see check_lse).
LSE_REL = 1e-4


# ------------------------------------------------------------------ problems and oracles
def quant_problem(kind, seq_lens, q_lens, hq, hkv, head_dim, page, dtype=torch.bfloat16, seed=0, smooth=True):
    """testing.make_problem with a quantized cache of `kind` (random values,
    scales in [0.005, 0.025], smoothing factors in [0.25, 2.25]); smooth=False
    drops k_smooth (the ops then take none)."""
    return make_problem(seq_lens, q_lens, hq, hkv, head_dim, page, dtype=dtype, device=DEV, seed=seed,
                        smooth=smooth, **QUANT_KINDS[kind])


# Outputs against float64 within ULPS ulps (int8 problems take bf16 / fp16 queries only).
check_out = functools.partial(op_helpers.check_out, ulps=ULPS)


def check_lse(lse, exact_lse, p, causal, what, prefill=False):
    """lse against float64, relative to max(1, |lse|). The scores of the
    kernels are those of their rounded queries (q * k_smooth in fp32, then 15
    bits or fp16 per row: with k_smooth a shift of up to ~1e-3 for d 128,
    above the bf16 caches' 1e-4): the reference is float64 attention of those
    queries (kernel_queries; `prefill`: the lse came from the prefill op)."""
    lse = lse.double()
    assert not torch.isnan(lse).any(), f"{what}: NaN in lse"
    seen = torch.isfinite(exact_lse)
    assert torch.equal(torch.isfinite(lse), seen), f"{what}: lse finite where exact is -inf (or the reverse)"
    assert torch.all(lse[~seen] == float("-inf")), f"{what}: rows that see nothing must have lse = -inf"
    if not seen.any():
        return
    tol = LSE_REL * exact_lse.abs().clamp_min(1.0)
    _, exact_lse = exact_attention(dataclasses.replace(p, q=kernel_queries(p, prefill), k_smooth=None), causal)
    excess = ((lse - exact_lse).abs() - tol)[seen]
    assert excess.max().item() <= 0, (f"{what}: lse error above tolerance by {excess.max().item():.3g} "
                                      f"(largest error {(lse - exact_lse)[seen].abs().max().item():.3g})")


SMOOTH = [True, False]
SMOOTH_IDS = ["smooth", "plain"]


# ------------------------------------------------------------------ prefill
@pytest.mark.parametrize("smooth", SMOOTH, ids=SMOOTH_IDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 64, 128])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_prefill(kind, dtype, head_dim, page, causal, smooth, seed):
    """Lengths 1, page - 1, page, page + 1 and several pages in one batch; full
    prompts and chunked prefill (fewer queries than positions); GQA groups 1, 4
    and 8 in turn."""
    need("prefill")
    group = (1, 4, 8)[(head_dim // 64 + page // 16) % 3]
    seq_lens = [1, page - 1, page, page + 1, 3 * page + 7]
    q_lens = [1, page - 1, page // 2, 1, 2 * page + 3]
    p = quant_problem(kind, seq_lens, q_lens, 2 * group, 2, head_dim, page, dtype, seed, smooth)
    exact, exact_lse = exact_attention(p, causal)
    poison_unowned_(p)
    out, lse = run_prefill(p, causal)
    check_out(out, exact, dtype, f"{kind} prefill (group {group})")
    check_lse(lse, exact_lse, p, causal, f"{kind} prefill lse (group {group})", prefill=True)


@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 128), (torch.float16, 64), (torch.bfloat16, 80)],
                         ids=["bf16-128", "fp16-64", "bf16-80"])
def test_int8_prefill_long(kind, dtype, head_dim, seed):
    """A 3000-position prompt next to a chunk of 200 queries at the end of 2500
    positions: many key tiles, several query tiles per sequence, in the
    128-row tile that prefill takes from 2048 queries on (test_int8_prefill's
    short prompts take the 64-row tile)."""
    need("prefill")
    p = quant_problem(kind, [3000, 2500], [3000, 200], 8, 2, head_dim, 64, dtype, seed=seed)
    out, lse = run_prefill(p, True)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, f"{kind} prefill long")
    check_lse(lse, exact_lse, p, True, f"{kind} prefill long lse", prefill=True)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 128])
def test_int8_prefill_many_sequences(kind, page, causal, seed):
    """A varlen batch of 64 sequences (empty ones, single positions, chunks,
    prompts past a few key tiles) in one launch: on Hopper, fp8 with
    per-tensor scales runs the warp-specialized kernel, whose persistent
    blocks, producer and converter warps walk many items each; every row
    within the bounds, rows of no sequence untouched."""
    need("prefill")
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(0, 700, (61,), generator=g).tolist() + [0, 1, 2000]
    q_lens = [int(torch.randint(0, L + 1, (1,), generator=g)) if i % 3 else L for i, L in enumerate(seq_lens)]
    p = quant_problem(kind, seq_lens, q_lens, 8, 2, 128, page, seed=seed)
    exact, exact_lse = exact_attention(p, causal)
    poison_unowned_(p)
    n = p.q.shape[0]
    pad = torch.randn(3, *p.q.shape[1:], device=DEV).to(p.q.dtype)  # tokens of no sequence
    out, lse = run_prefill(dataclasses.replace(p, q=torch.cat([p.q, pad])), causal)
    check_out(out[:n], exact, torch.bfloat16, f"{kind} prefill, 64 sequences, page {page}")
    check_lse(lse[:n], exact_lse, p, causal, f"{kind} prefill lse, 64 sequences, page {page}", prefill=True)
    assert torch.isnan(out[n:]).all() and torch.isnan(lse[n:]).all(), "rows of no sequence were written"


# ------------------------------------------------------------------ decode: partials merged in float64
# Per (dtype, head_dim, page): three of the nine (group, n) pairs of groups
# 1/4/8 x n 1/4/16, rotated so that each dtype meets every pair; split counts
# 1 / 5 / 32 (32: most splits neutral), causal and smoothing in turn.
GROUP_N = [(g, n) for g in (1, 4, 8) for n in (1, 4, 16)]
DECODE_CASES = []
for _dtype in DTYPES:
    for _j, (_d, _page) in enumerate((d, pg) for d in HEAD_DIMS for pg in (16, 64, 128)):
        for _g, _n in GROUP_N[(3 * _j) % 9: (3 * _j) % 9 + 3]:
            _c = len(DECODE_CASES)
            _splits, _causal, _smooth = (1, 5, 32)[_c % 3], _c % 4 != 3, (_c // 3) % 2 == 0
            DECODE_CASES.append(pytest.param(
                _dtype, _d, _page, _g, _n, _splits, _causal, _smooth,
                id=f"{str(_dtype).split('.')[-1]}-d{_d}-page{_page}-group{_g}-n{_n}-splits{_splits}"
                   f"-{'causal' if _causal else 'full'}-{'smooth' if _smooth else 'plain'}"))


@pytest.mark.parametrize("dtype,head_dim,page,group,n,splits,causal,smooth", DECODE_CASES)
def test_int8_decode_partials(kind, dtype, head_dim, page, group, n, splits, causal, smooth, seed):
    """decode alone: its partials merged by reference.merge_partials in float64
    (independent of the combine kernel); splits without pages are neutral."""
    need("decode")
    seq_lens = [n, max(n, page - 1), page, page + 1, 700]
    p = quant_problem(kind, seq_lens, [n] * len(seq_lens), 2 * group, 2, head_dim, page, dtype, seed, smooth)
    exact, exact_lse = exact_attention(p, causal)
    poison_unowned_(p)
    po, pl = run_decode(p, causal, splits)
    assert not torch.isnan(po).any() and not torch.isnan(pl).any(), "unwritten or NaN partials"
    merged, merged_lse = reference.merge_partials(po, pl)
    check_out(merged, exact, dtype, f"{kind} decode merged")
    check_lse(merged_lse, exact_lse, p, causal, f"{kind} decode merged lse")
    check_neutral_splits(po, pl, p, splits)


@pytest.mark.parametrize("tile", ["wide", "narrow"])
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_decode_tile_shapes(kind, dtype, head_dim, n, tile, seed):
    """The int8 decode at d <= 128 has two tiles: 128 keys and two blocks per
    SM when the launch's blocks fit two per SM, 64 keys and three per SM
    beyond (csrc/ops/decode.cu). A batch on each side of that line."""
    need("decode", "combine")
    kv_heads, splits = 8, 8
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fit = 2 * sms // (splits * kv_heads)  # sequences whose blocks still fit two per SM
    seqs = max(1, fit) if tile == "wide" else fit + 2
    assert (splits * kv_heads * seqs <= 2 * sms) == (tile == "wide")
    g = torch.Generator().manual_seed(seed)
    lens = ([n, 63, 64, 65, 127, 128, 129] + torch.randint(n, 1500, (seqs,), generator=g).tolist())[:seqs]
    p = quant_problem(kind, lens, [n] * seqs, 2 * kv_heads, kv_heads, head_dim, 64, dtype, seed, smooth=seed % 2 == 0)
    names, (po, pl) = kernels_run(lambda: run_decode(p, True, splits))
    # The tile as TileConfig's warps_m, warps_n, row tiles, keys, stages (tile_table.h).
    shape = "1, 4, 1, 128, 3," if tile == "wide" else "1, 4, 1, 64, 3,"
    assert any("attention_tile_kernel" in name and shape in name for name in names), \
        f"the {tile} tile did not run: {sorted(set(names))}"
    out, lse = run_combine(po, pl, dtype)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, f"{kind} decode, {tile} tile")
    check_lse(lse, exact_lse, p, True, f"{kind} decode, {tile} tile, lse")


# ------------------------------------------------------------------ decode + combine
@pytest.mark.parametrize("page", [16, 64, 128])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_decode_combine(kind, dtype, head_dim, page, seed):
    """Plain decode (one query per sequence) through decode + combine, lengths
    at and around page boundaries in one batch; smoothing on for half the cases."""
    need("decode", "combine")
    smooth = (head_dim // 64 + page // 16) % 2 == 0
    p = quant_problem(kind, [1, page - 1, page, page + 1, 5 * page + 3], [1] * 5, 8, 2, head_dim, page, dtype, seed,
                     smooth)
    po, pl = run_decode(p, True, 4)
    out, lse = run_combine(po, pl, dtype)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, f"{kind} decode + combine (k_smooth: {smooth})")
    check_lse(lse, exact_lse, p, True, f"{kind} decode + combine lse (k_smooth: {smooth})")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("n", [1, 4, 16])
def test_int8_decode_steps(kind, n, group, causal, seed):
    """Steps of n queries per sequence (decode, speculative verify) for GQA
    groups 1, 4, 8 through decode + combine; sequences of different lengths."""
    need("decode", "combine")
    p = quant_problem(kind, [n, 70, 300, 64 + n], [n] * 4, 2 * group, 2, 128, 64, seed=seed)
    po, pl = run_decode(p, causal, 8 if n > 8 else 16)
    out, lse = run_combine(po, pl, torch.bfloat16)
    exact, exact_lse = exact_attention(p, causal)
    check_out(out, exact, torch.bfloat16, f"{kind} decode n={n} group={group}")
    check_lse(lse, exact_lse, p, causal, f"{kind} decode n={n} group={group} lse")


# ------------------------------------------------------------------ attention dispatcher
@pytest.mark.parametrize("max_q_len", [1, 4, 16, 17])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_attention(kind, dtype, group, max_q_len, seed):
    """The dispatcher on an int8 cache: decode + combine for <= 16 queries and a
    power-of-two group, prefill otherwise (group 3 always, 17 queries); causal
    and not; smoothing on for half the cases."""
    need_path("attention")
    n = max_q_len
    smooth = (group + max_q_len) % 2 == 1
    p = quant_problem(kind, [n, n + 50, 64 + n, 900], [n, max(1, n // 2), n, 1], 2 * group, 2, 128, 64, dtype, seed,
                     smooth)
    for causal in (True, False):
        out = run_attention(p, causal)
        check_out(out, exact_attention(p, causal)[0], dtype,
                  f"{kind} attention causal={causal} k_smooth={smooth}")


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("path", ["prefill", "decode", "attention"])
def test_int8_deterministic(kind, path, seed):
    """Same inputs, same bits (fixed merge order, no atomics); for `attention`
    also the same bits with the int8 arguments given positionally."""
    need_path(path)
    q_lens = [600, 1, 77, 1000] if path == "prefill" else [1, 1, 4, 1]
    p = quant_problem(kind, [2000, 3000, 77, 1000], q_lens, 16, 4, 128, 64, seed=seed)

    def once(positional=False):
        if path == "prefill":
            return run_prefill(p, True)
        if path == "decode":
            return run_combine(*run_decode(p, True, 32), torch.bfloat16)
        return run_attention(p, True, positional), torch.zeros(1)

    (a, a_lse), (b, b_lse) = once(), once()
    assert torch.isfinite(a).all()
    assert torch.equal(a, b) and torch.equal(a_lse, b_lse), f"{kind} {path}: two runs gave different bits"
    if path == "attention":
        c, _ = once(positional=True)
        assert torch.equal(a, c), "int8 attention: keyword and positional int8 arguments gave different bits"


@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_int8_value_scale_outlier(kind, path, seed):
    """One key's value scale 1e5 times the others' (an attention sink with large
    values), masked for most rows by the causal diagonal: the kernels divide
    value scales by the largest one a warp has seen, and the other keys'
    probabilities times their scales must not sink into fp16's subnormals
    (they would lose most of their bits: tens of ulps). Prefill: 128 queries,
    the outlier at position 63; decode (the attention op's path, 16 queries of
    one sequence, group 1): the outlier at the last position."""
    need_path("attention" if path == "decode" else "prefill")
    if QUANT_KINDS[kind].get("scale_kind") == "tensor":
        pytest.skip("one value scale per tensor: no key has a scale of its own")
    length, outlier = (128, 63) if path == "prefill" else (16, 15)
    p = quant_problem(kind, [length], [length], 2, 2, 128, 16, seed=seed, smooth=False)
    page = p.block_tables[0, outlier // 16].item()
    p.v_scale[page, :, outlier % 16] = 1024.0  # the others: 0.005-0.025 (a power of two: a scale as written)
    if path == "prefill":
        out, _ = run_prefill(p, True)
    else:
        out = run_attention(p, True)
    exact, _ = exact_attention(p, True)
    check_out(out, exact, torch.bfloat16, f"{kind} {path}, one value scale 1e5x the others")


def per_sequence_scales_(p, seq, k_mul, v_mul):
    """Multiplies the k and v scales of sequence `seq`'s pages (those its
    length covers) by k_mul / v_mul, tensors broadcast over [pages, heads, slots]."""
    page = p.k_cache.shape[2]
    ids = p.block_tables[seq, :math.ceil(int(p.seq_lens[seq]) / page)].long()
    p.k_scale[ids] *= k_mul
    p.v_scale[ids] *= v_mul


def test_int8_prefill_scale_powers(kind, seed):
    """Per-vector scales: the Hopper prefill multiplies each key and value
    by its scale over one power of two per sequence and KV head
    (sm90/prefill_scale_range.cuh), exactly for scales as the cache writes
    store them. Scales spread over 2^-6..2^0 (keys) and 2^-6..2^6 (values)
    within each sequence, one sequence's value scales 2^40 above the others'
    and its key scales 2^3 above, another's 2^-40 and 2^-3 below: outputs
    and lse as close to float64 as elsewhere."""
    need("prefill")
    if QUANT_KINDS[kind].get("scale_kind") == "tensor":
        pytest.skip("one scale per tensor")
    p = quant_problem(kind, [300, 200, 129], [300, 64, 129], 8, 2, 128, 16, seed=seed)
    g = torch.Generator().manual_seed(seed)
    shape = p.k_scale.shape
    p.k_scale *= (2.0 ** torch.randint(-6, 1, shape, generator=g).float()).to(DEV)
    p.v_scale *= (2.0 ** torch.randint(-6, 7, shape, generator=g).float()).to(DEV)
    per_sequence_scales_(p, 1, 2.0 ** 3, 2.0 ** 40)
    per_sequence_scales_(p, 2, 2.0 ** -3, 2.0 ** -40)
    exact, exact_lse = exact_attention(p, True)
    poison_unowned_(p)
    out, lse = run_prefill(p, True)
    check_out(out, exact, torch.bfloat16, f"{kind} prefill, scales over a wide range")
    check_lse(lse, exact_lse, p, True, f"{kind} prefill lse, scales over a wide range", prefill=True)


def test_int8_prefill_unrounded_scales(kind, seed):
    """Per-vector scales that the cache writes would not store (all their
    bits used): the Hopper prefill rounds each key and value times its scale
    to fp16 (docs/CONTRACT.md), 2^-12 of it at most, which adds to the exact
    case's error (6.6 ulps seen on int8 against its 6): within ULPS_UNROUNDED."""
    need("prefill")
    if QUANT_KINDS[kind].get("scale_kind") == "tensor":
        pytest.skip("one scale per tensor")
    p = quant_problem(kind, [700, 90], [700, 33], 8, 2, 128, 64, seed=seed)
    g = torch.Generator().manual_seed(seed)
    for s in (p.k_scale, p.v_scale):
        s.copy_((torch.rand(s.shape, generator=g) * 0.02 + 0.005).to(DEV))
    exact, _ = exact_attention(p, True)
    poison_unowned_(p)
    out, _ = run_prefill(p, True)
    check_out(out, exact, torch.bfloat16, f"{kind} prefill, unrounded scales", ulps=ULPS_UNROUNDED)


@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_int8_non_finite_query_row(kind, path, seed):
    """A query row holding inf (or NaN) gives NaN output and lse for that row
    (decode: in every split's partial), as the float reference's scores would;
    the other rows of its tile are exact. (combine turns an all-NaN row of
    partials into the empty row, 0 with lse -inf, for every cache type.)"""
    need_path("attention" if path == "decode" else "prefill")
    q_lens = [16, 3] if path == "prefill" else [1, 1]
    p = quant_problem(kind, [200, 131], q_lens, 8, 2, 128, 64, seed=seed)
    p.q[0, 1, 5] = float("inf")
    p.q[-1, 6, 0] = float("nan")
    bad = torch.zeros(p.q.shape[:2], dtype=torch.bool, device=DEV)
    bad[0, 1] = bad[-1, 6] = True
    if path == "prefill":
        out, lse = run_prefill(p, True)
        nan_out, nan_lse = out[bad], lse[bad]
    else:
        po, pl = run_decode(p, True, 4)
        nan_out, nan_lse = po[:, bad], pl[:, bad]
        out, lse = run_combine(po, pl, p.q.dtype)
    assert torch.isnan(nan_out).all() and torch.isnan(nan_lse).all(), "non-finite query rows must give NaN"
    assert torch.isfinite(out[~bad]).all() and torch.isfinite(lse[~bad]).all(), "NaN leaked into other rows"
    clean = dataclasses.replace(p, q=torch.where(bad[..., None], torch.zeros_like(p.q), p.q))
    exact, _ = exact_attention(clean, True)
    assert ulp_error(out[~bad], exact[~bad], p.q.dtype) <= ULPS, "rows beside a non-finite row lost accuracy"


# ------------------------------------------------------------------ CUDA graphs
@pytest.mark.parametrize("group", [4, 3], ids=["decode_path", "prefill_path"])
def test_int8_cuda_graph_decode_steps(kind, group, seed):
    """One int8 decode step (quantizing cache_write with k_smooth, then
    attention) captured once with static block_tables / seq_lens /
    cu_seqlens_q buffers, replayed for 40 steps while sequences grow across
    page boundaries (the host only copies new page ids, lengths and this step's
    q / k / v into the static buffers). Every replay must equal an eager step
    on separate pools bit for bit (output, int8 pages and scales), and float64
    attention on the dequantized cache every few steps."""
    need_path("attention")
    need("cache_write")
    g = torch.Generator().manual_seed(seed)
    dtype, page, kv_heads, d, steps = torch.bfloat16, 16, 2, 128, 40
    hq = group * kv_heads
    start = [page - 3, 2 * page - 1, 5]
    num_seqs = len(start)
    max_pages = math.ceil((max(start) + steps) / page) + 1
    num_pages = num_seqs * max_pages + 3
    shape = (num_pages, kv_heads, page, d)
    # Cached positions before the first step: random quantized vectors and scales.
    pools = make_problem([num_pages * page], [1], 1, kv_heads, d, page, seed=seed, spare_pages=0,
                         **QUANT_KINDS[kind])
    cache = [pools.k_cache, pools.v_cache, pools.k_scale, pools.v_scale]
    cache = [t.to(DEV) for t in cache]  # k_cache, v_cache, k_scale, v_scale
    eager_cache = [t.clone() for t in cache]
    k_smooth = (torch.rand(kv_heads, d, generator=g) * 2 + 0.25).to(DEV)
    free = torch.randperm(num_pages, generator=g).tolist()
    table = torch.full((num_seqs, max_pages), -1, dtype=torch.int32)  # host copy; -1: no page yet
    lens = list(start)
    for s, length in enumerate(lens):
        for j in range(math.ceil(length / page)):
            table[s, j] = free.pop()
    scale = d ** -0.5

    # Static buffers: the graph reads these addresses on every replay.
    q = torch.empty(num_seqs, hq, d, dtype=dtype, device=DEV)
    k = torch.empty(num_seqs, kv_heads, d, dtype=dtype, device=DEV)
    v = torch.empty_like(k)
    block_tables = table.to(DEV)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    cu_seqlens_q = torch.arange(num_seqs + 1, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)

    def step(pools, o, qq, kk, vv, bt, sl):
        k_cache, v_cache, k_scale, v_scale = pools
        ops.cache_write(k_cache, v_cache, kk, vv, bt, sl, cu_seqlens_q, k_scale, v_scale, k_smooth)
        ops.attention(o, qq, k_cache, v_cache, bt, sl, cu_seqlens_q, 1, scale, True,
                      k_scale=k_scale, v_scale=v_scale, k_smooth=k_smooth)

    def next_step_inputs():
        """Grows every sequence by one position (a new page when it crosses a
        boundary), new random q / k / v, copied into the static buffers."""
        for s in range(num_seqs):
            if lens[s] % page == 0:
                table[s, lens[s] // page] = free.pop()
            lens[s] += 1
        for dst in (q, k, v):
            dst.copy_(torch.randn(dst.shape, generator=g).to(dtype))
        block_tables.copy_(table)
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))

    next_step_inputs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(cache, out, q, k, v, block_tables, seq_lens)  # warm-up (writes this step's k / v: the same values)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(cache, out, q, k, v, block_tables, seq_lens)

    crossed = 0
    for i in range(steps):
        if i > 0:
            next_step_inputs()
        crossed += sum(1 for x in lens if x % page == 1)
        poison_(out)
        graph.replay()
        eager_out = poison_(torch.empty_like(out))
        step(eager_cache, eager_out, q.clone(), k.clone(), v.clone(), block_tables.clone(), seq_lens.clone())
        assert torch.isfinite(out).all(), f"step {i}: NaN / inf (or unwritten rows) in the replayed output"
        assert torch.equal(out, eager_out), f"step {i}: graph replay differs from eager"
        if i % 10 == 0 or i == steps - 1:
            names = ("k_cache", "v_cache", "k_scale", "v_scale")
            differ = [n for n, a, b in zip(names, cache, eager_cache) if not torch.equal(a, b)]
            assert not differ, f"step {i}: the replayed step wrote different {differ} than eager"
            exact = reference.paged_attention(q, cache[0], cache[1], block_tables, seq_lens, cu_seqlens_q, 1, scale,
                                              True, k_scale=cache[2], v_scale=cache[3], k_smooth=k_smooth,
                                              exact=True)
            check_out(out, exact, dtype, f"{kind} graph step {i} (lengths {lens})")
    assert crossed >= 3, "the sequences were meant to cross page boundaries"


# ------------------------------------------------------------------ bad device data (keep last)
def check_context_alive(kind, seed):
    """After bad metadata the CUDA context still works: a later int8 op runs and is right."""
    torch.cuda.synchronize()
    p = quant_problem(kind, [100, 33], [1, 1], 8, 2, 128, 16, seed=seed + 1)
    out = run_attention(p, True)
    check_out(out, exact_attention(p, True)[0], torch.bfloat16, f"{kind} attention after bad metadata")


@pytest.mark.parametrize("path", ["prefill", "decode", "attention"])
def test_int8_adversarial_metadata(kind, path, seed):
    """Out-of-range and negative page ids, a seq_len beyond what the table holds
    and a negative one, on an int8 cache: no fault, finite output, the
    untouched sequences exactly right, every row as the reference reads the
    metadata (bad pages skipped, lengths clamped), and a later op still works."""
    need_path(path)
    need_path("attention")  # check_context_alive
    q_lens = [5, 3, 20, 1, 7, 9] if path == "prefill" else [1, 2, 1, 1, 4, 1]
    p = quant_problem(kind, [70, 40, 33, 20, 50, 90], q_lens, 8, 2, 64, 16, seed=seed)
    num_pages, page = p.k_cache.shape[0], p.k_cache.shape[2]
    bt, sl = p.block_tables, p.seq_lens
    bt[0, 1] = num_pages + 5
    bt[0, 2] = 2**31 - 1
    bt[1, 0] = -3
    sl[2] = bt.shape[1] * page + 1000  # beyond the table: clamped
    sl[3] = -7  # negative: no position
    good = slice(int(p.cu_seqlens_q[4]), int(p.cu_seqlens_q[6]))  # sequences 4 and 5 are untouched
    if path == "prefill":
        out, lse = run_prefill(p, True)
    elif path == "decode":
        out, lse = run_combine(*run_decode(p, True, 4), torch.bfloat16)
    else:
        out, lse = run_attention(p, True), None
    torch.cuda.synchronize()  # a fault would raise here
    assert torch.isfinite(out).all(), "NaN / inf with bad metadata"
    exact, exact_lse = exact_attention(p, True)
    check_out(out[good], exact[good], torch.bfloat16, f"{kind} {path}: sequences with good metadata")
    check_out(out, exact, torch.bfloat16, f"{kind} {path} with bad metadata (as the reference reads it)")
    if lse is not None:
        check_lse(lse, exact_lse, p, True, f"{kind} {path} with bad metadata lse", prefill=path == "prefill")
    check_context_alive(kind, seed)
