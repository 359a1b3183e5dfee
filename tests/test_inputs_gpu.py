"""GPU tests of rms_norm, rope, cache_write (plain, int8 and fp8) and the
fused attention_inputs.

- rms_norm / rope against the eager reference (tileinfer_attn.reference) within
  1 ulp (rms_norm: the normalized value; fp32 a few ulps, see NORM_ULPS); plain
  cache_write exactly; int8 cache_write with scales within 1e-6 relative and
  int8 values equal except at (near) .5 ties; int8 and fp8 (per vector, per
  tensor) cache_write bit-identical to the CPU op.
- attention_inputs bit-identical (same bits, NaN included) to rms_norm + rope +
  cache_write of this package on the GPU: with and without norms, full and
  partial rotary dims, packed-qkv views and separate tensors, plain and int8
  pools.
- Outputs and pools are poisoned first and sit between guard regions: every
  byte outside the written rows and slots must keep its poison, so writes to
  other sequences' pages or outside the pools show.
- Bad block-table entries, positions past the table or the cos/sin cache:
  nothing written outside the pools, the CUDA context survives.
- A captured CUDA graph replayed as sequences grow across a page boundary
  matches eager calls.
"""

import pytest
import torch

import tileinfer_attn  # noqa: F401  (registers the ops)
from tileinfer_attn import reference
from tileinfer_attn.testing import make_problem, poison_, ulp_error

from op_helpers import HEAD_DIMS, bits, need

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ops = torch.ops.tileinfer_attn
DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
PAGE_SIZES = [16, 32, 64, 128]
EPS = 1e-6

# Normalized values within 1 ulp of eager PyTorch. Only the fp32 sum of squares
# differs (our fixed butterfly order vs PyTorch's reduction), which moves fp32
# outputs by a few fp32 ulps (~5e-7 relative): fp32 gets 8.
NORM_ULPS = {torch.bfloat16: 1.0, torch.float16: 1.0, torch.float32: 8.0}


# ----------------------------------------------------------------------------- helpers

def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    diff = bits(a) != bits(b)
    if diff.any():
        idx = diff.nonzero()[:5].tolist()
        raise AssertionError(f"{what}: {int(diff.sum())} of {diff.numel()} elements differ, first at {idx}: "
                             f"{[a[tuple(i)].item() for i in idx]} vs {[b[tuple(i)].item() for i in idx]}")


def guarded(shape, dtype, guard: int = 2):
    """A poisoned buffer with `guard` poisoned rows (of dim 0) before and after the
    returned view, which is contiguous: writes outside the view show in the guards."""
    full = poison_(torch.empty((shape[0] + 2 * guard,) + tuple(shape[1:]), dtype=dtype, device=DEV))
    return full, full[guard:guard + shape[0]]


def rope_cos_sin_cache(max_position, rotary_dim, base=10000.0, device=DEV):
    """[max_position, rotary_dim] fp32: cos(p f_i) then sin(p f_i), f_i = base^(-2i / rotary_dim)."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(device)


def rand(gen, shape, dtype, scale=1.0, shift=0.0):
    return (torch.randn(shape, generator=gen, device=DEV) * scale + shift).to(dtype)


def qkv_inputs(gen, num_tokens, hq, hkv, d, dtype, packed: bool):
    """q [T, hq, d], k, v [T, hkv, d]: views of one packed [T, (hq + 2 hkv) d]
    tensor (as a qkv projection's output is split), or separate tensors."""
    if packed:
        qkv = rand(gen, (num_tokens, (hq + 2 * hkv) * d), dtype)
        q = qkv[:, :hq * d].view(num_tokens, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].view(num_tokens, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(num_tokens, hkv, d)
        assert not q.is_contiguous() and not k.is_contiguous()
        return q, k, v
    return (rand(gen, (num_tokens, hq, d), dtype), rand(gen, (num_tokens, hkv, d), dtype),
            rand(gen, (num_tokens, hkv, d), dtype))


def poisoned_pools(prob):
    """The problem's pools (and int8 scales) inside guard pages, poisoned."""
    shape = tuple(prob.k_cache.shape)
    kf, kc = guarded(shape, prob.k_cache.dtype)
    vf, vc = guarded(shape, prob.v_cache.dtype)
    out = dict(k_full=kf, v_full=vf, k_cache=kc, v_cache=vc, k_scale=None, v_scale=None, ks_full=None,
               vs_full=None)
    if prob.k_cache.dtype == torch.int8:
        out["ks_full"], out["k_scale"] = guarded(shape[:3], torch.float32)
        out["vs_full"], out["v_scale"] = guarded(shape[:3], torch.float32)
    return out


def clone_pools(pools):
    """A deep copy whose views point into the copied guard buffers."""
    c = {}
    for name, full, view in (("k", "k_full", "k_cache"), ("v", "v_full", "v_cache"),
                             ("ks", "ks_full", "k_scale"), ("vs", "vs_full", "v_scale")):
        if pools[full] is None:
            c[full] = c[view] = None
            continue
        c[full] = pools[full].clone()
        g = (pools[full].shape[0] - pools[view].shape[0]) // 2
        c[view] = c[full][g:g + pools[view].shape[0]]
    return c


def assert_pools_equal(a, b, what):
    for full in ("k_full", "v_full", "ks_full", "vs_full"):
        if a[full] is not None:
            assert_same_bits(a[full], b[full], f"{what}: {full} (pool with its guard pages)")


def token_targets(prob, num_tokens, max_position=None):
    """(token, position, page, slot) of every token a cache write stores, by the
    reference rules (docs/CONTRACT.md), plus the positions of all tokens
    (-1 for tokens of no sequence). With max_position, tokens whose position is
    outside the cos/sin table are dropped (attention_inputs skips them)."""
    num_pages, _, page_size, _ = prob.k_cache.shape
    bt = prob.block_tables.tolist()
    lens = prob.seq_lens.tolist()
    cu = prob.cu_seqlens_q.tolist()
    cap = len(bt[0]) * page_size
    pos_all = [-1] * num_tokens
    out = []
    for s in range(len(lens)):
        for t in range(max(cu[s], 0), min(cu[s + 1], num_tokens)):
            p = lens[s] - (cu[s + 1] - cu[s]) + (t - cu[s])
            pos_all[t] = p
            if p < 0 or p >= cap or (max_position is not None and p >= max_position):
                continue
            page = bt[s][p // page_size]
            if 0 <= page < num_pages:
                out.append((t, p, page, p % page_size))
    return out, torch.tensor(pos_all, dtype=torch.int64, device=DEV)


def separate_ops(q, k, v, pools, prob, positions, cos_sin, rotary_dim, qw, kw):
    """rms_norm + rope + cache_write of this package: the fused op's oracle.
    Returns q_out (poisoned where rope skips a token) and fills pools."""
    qn = q
    if qw is not None:
        qn = torch.empty_like(q)
        ops.rms_norm(qn, q, qw, EPS)
    q_out = poison_(torch.empty_like(q))
    ops.rope(q_out, qn, positions, cos_sin, rotary_dim)
    kn = k
    if kw is not None:
        kn = torch.empty_like(k)
        ops.rms_norm(kn, k, kw, EPS)
    kr = poison_(torch.empty_like(k))
    ops.rope(kr, kn, positions, cos_sin, rotary_dim)
    ops.cache_write(pools["k_cache"], pools["v_cache"], kr, v, prob.block_tables, prob.seq_lens,
                    prob.cu_seqlens_q, pools["k_scale"], pools["v_scale"], prob.k_smooth)
    return q_out, kr


def eager_chain(x, w, positions, cos_sin, rotary_dim):
    """The eager reference of norm + rope on the rows of valid positions."""
    h = reference.rms_norm(x, w, EPS) if w is not None else x
    return reference.rope(h, positions, cos_sin, rotary_dim)


def norm_weight(gen, d, dtype):
    # Qwen3's q_norm / k_norm weights sit around 1; random, never all ones.
    return rand(gen, (d,), dtype, scale=0.3, shift=1.0)


# ----------------------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_rms_norm(dtype, d, layout):
    need("rms_norm")
    gen = torch.Generator(device=DEV).manual_seed(1000 + d + DTYPES.index(dtype))
    t, h = 67, 6
    if layout == "strided":  # a head-slice of a packed tensor, out strided too
        x = rand(gen, (t, h + 3, d), dtype, scale=2.0)[:, 1:1 + h]
        out_full = poison_(torch.empty(t, h + 2, d, dtype=dtype, device=DEV))
        out = out_full[:, 2:]
    else:
        x = rand(gen, (t, h, d), dtype, scale=2.0)
        out_full = poison_(torch.empty(t, h, d, dtype=dtype, device=DEV))
        out = out_full
    w = norm_weight(gen, d, dtype)
    ops.rms_norm(out, x, w, EPS)
    if layout == "strided":
        assert bits(out_full[:, :2]).eq(bits(poison_(out_full[:, :2].clone()))).all(), "wrote outside out"

    # The normalized value (weight 1) within 1 ulp of eager; the weight product
    # then exactly eager's `weight * h.to(dtype)`.
    ones = torch.ones(d, dtype=dtype, device=DEV)
    n = poison_(torch.empty_like(x))
    ops.rms_norm(n, x, ones, EPS)
    n_ref = reference.rms_norm(x, ones, EPS)
    assert ulp_error(n, n_ref, dtype) <= NORM_ULPS[dtype]
    assert_same_bits(out, w * n, "rms_norm: weight product")
    assert ulp_error(out, reference.rms_norm(x, w, EPS), dtype) <= 2 * NORM_ULPS[dtype]

    # In place gives the same bits.
    y = x.clone()
    ops.rms_norm(y, y, w, EPS)
    assert_same_bits(y, out, "rms_norm in place")


# ----------------------------------------------------------------------------- rope


def rotary_dims(d):
    # full; half (Qwen-style partial); a half-width that is no multiple of the
    # 16-byte vector (the channel-by-channel path).
    return [d, d // 2, d - 6]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("rot", [0, 1, 2], ids=["full", "half", "odd"])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_rope(dtype, d, rot, pos_dtype):
    need("rope")
    rotary_dim = rotary_dims(d)[rot]
    gen = torch.Generator(device=DEV).manual_seed(2000 + d + 7 * rot + DTYPES.index(dtype))
    t, h, max_pos = 45, 5, 4096
    cos_sin = rope_cos_sin_cache(max_pos, rotary_dim, device=DEV)
    x = rand(gen, (t, h, d), dtype, scale=3.0)
    pos = torch.randint(0, max_pos, (t,), generator=gen, device=DEV)
    # Positions outside the table: those rows are skipped (left as they were).
    bad = torch.tensor([0, 7, 44], device=DEV)
    pos[bad] = torch.tensor([-1, max_pos, 2**31 - 1 if pos_dtype == torch.int32 else 2**40], device=DEV)
    pos = pos.to(pos_dtype)
    out_full, out = guarded((t, h, d), dtype)
    ops.rope(out, x, pos, cos_sin, rotary_dim)
    ok = torch.ones(t, dtype=torch.bool, device=DEV)
    ok[bad] = False
    ref = reference.rope(x[ok], pos[ok], cos_sin, rotary_dim)
    assert ulp_error(out[ok], ref, dtype) <= 1.0
    # Channels past rotary_dim are copied.
    assert_same_bits(out[ok][..., rotary_dim:], x[ok][..., rotary_dim:], "rope: channels past rotary_dim")
    poison = poison_(torch.empty_like(out_full[:1]))
    assert (bits(out[~ok]) == bits(poison)).all(), "rope wrote a row whose position is outside the table"
    assert (bits(out_full[:2]) == bits(poison)).all() and (bits(out_full[-2:]) == bits(poison)).all()

    # In place gives the same bits on the rows it writes.
    y = x.clone()
    ops.rope(y, y, pos, cos_sin, rotary_dim)
    assert_same_bits(y[ok], out[ok], "rope in place")
    assert_same_bits(y[~ok], x[~ok], "rope in place, skipped rows")


# ----------------------------------------------------------------------------- cache_write

# Decode, prefill and chunked-prefill sequences in one step; lengths cross pages.
SEQ_LENS = [37, 1, 130, 200, 64]
Q_LENS = [5, 1, 30, 1, 64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_cache_write_plain(dtype, d, page_size):
    need("cache_write")
    hkv = 3
    prob = make_problem(SEQ_LENS, Q_LENS, 2 * hkv, hkv, d, page_size, dtype, DEV, seed=d + page_size)
    gen = torch.Generator(device=DEV).manual_seed(3000 + d + page_size + DTYPES.index(dtype))
    t = sum(Q_LENS) + 3  # 3 padding tokens of no sequence
    _, k, v = qkv_inputs(gen, t, 2 * hkv, hkv, d, dtype, packed=page_size in (32, 128))
    pools = poisoned_pools(prob)
    expect = clone_pools(pools)
    ops.cache_write(pools["k_cache"], pools["v_cache"], k, v, prob.block_tables, prob.seq_lens, prob.cu_seqlens_q)
    reference.cache_write(expect["k_cache"], expect["v_cache"], k, v, prob.block_tables, prob.seq_lens,
                          prob.cu_seqlens_q)
    assert_pools_equal(pools, expect, "cache_write")
    # The test can fail: the reference did write (poison replaced by values).
    assert not torch.isnan(expect["k_cache"]).all()


def int8_check(pools, prob, k, v, targets, what):
    """int8 pools vs reference.cache_write of k, v: the slots of `targets` (all
    that the op should write) hold scales within 1e-6 relative of the
    reference's and int8 values equal to its except at exact .5 ties of its
    division; every other byte keeps its poison (guard pages included)."""
    assert targets, "no token was written: the test would prove nothing"
    expect = clone_pools(poisoned_pools(prob))
    reference.cache_write(expect["k_cache"], expect["v_cache"], k, v, prob.block_tables, prob.seq_lens,
                          prob.cu_seqlens_q, expect["k_scale"], expect["v_scale"], prob.k_smooth)
    tok = torch.tensor([x[0] for x in targets], device=DEV)
    page = torch.tensor([x[2] for x in targets], device=DEV)
    slot = torch.tensor([x[3] for x in targets], device=DEV)
    written = torch.zeros(pools["k_scale"].shape, dtype=torch.bool, device=DEV)
    written[page, :, slot] = True
    for name, scale_name, full, scale_full, src_rows, smooth in (
            ("k_cache", "k_scale", "k_full", "ks_full", k, prob.k_smooth),
            ("v_cache", "v_scale", "v_full", "vs_full", v, None)):
        got, exp = pools[name], expect[name]
        got_s, exp_s = pools[scale_name], expect[scale_name]
        # Slots the op must not write keep their poison (the reference may have
        # written some that the op skips by design: positions past the cos/sin
        # table), and so do the guard pages around the pools.
        exp[~written] = -77
        exp_s[~written] = float("nan")
        assert (got[~written] == exp[~written]).all(), f"{what}: {name} written outside its slots"
        assert (bits(got_s)[~written] == bits(exp_s)[~written]).all(), f"{what}: {scale_name} outside its slots"
        for f in (full, scale_full):
            g = (pools[f].shape[0] - got_s.shape[0]) // 2
            assert_same_bits(pools[f][:g], expect[f][:g], f"{what}: guard before {f}")
            assert_same_bits(pools[f][-g:], expect[f][-g:], f"{what}: guard after {f}")
        gs, es = got_s[page, :, slot], exp_s[page, :, slot]
        assert torch.isfinite(gs).all() and torch.isfinite(es).all()
        assert ((gs - es).abs() <= 1e-6 * es.abs()).all(), f"{what}: {scale_name} off by more than 1e-6"
        src = src_rows[tok].float()
        if smooth is not None:
            src = src / smooth
        # On CUDA, eager PyTorch computes the reference's `amax / 127.0` as
        # amax * (1 / 127) (division by a scalar becomes a multiplication), so
        # its scale may differ from the kernel's IEEE amax / 127 by an ulp, and
        # values within that of a .5 tie may round the other way.
        val = src / es[..., None]
        near_tie = (val - val.floor() - 0.5).abs() <= val.abs() * 2.0**-20 + 1e-6
        gq, eq = got[page, :, slot].int(), exp[page, :, slot].int()
        bad = (gq != eq) & ~(near_tie & ((gq - eq).abs() <= 1))
        assert not bad.any(), f"{what}: {int(bad.sum())} int8 values differ from the reference off a .5 tie"
        assert int((gq != eq).sum()) <= max(16, gq.numel() // 200), f"{what}: too many ties rounded differently"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("smooth", [True, False])
def test_cache_write_int8(dtype, d, page_size, smooth):
    need("cache_write")
    hkv = 2
    prob = make_problem(SEQ_LENS, Q_LENS, 4, hkv, d, page_size, dtype, DEV, seed=d + page_size, int8=True)
    if not smooth:
        prob.k_smooth = None
    gen = torch.Generator(device=DEV).manual_seed(4000 + d + page_size + int(smooth))
    t = sum(Q_LENS) + 2
    _, k, v = qkv_inputs(gen, t, 4, hkv, d, dtype, packed=smooth)
    v[3] = 0  # an all-zero vector: scale 1, values 0
    pools = poisoned_pools(prob)
    ops.cache_write(pools["k_cache"], pools["v_cache"], k, v, prob.block_tables, prob.seq_lens,
                    prob.cu_seqlens_q, pools["k_scale"], pools["v_scale"], prob.k_smooth)
    targets, _ = token_targets(prob, t)
    int8_check(pools, prob, k, v, targets, "cache_write int8")
    t3 = [x for x in targets if x[0] == 3][0]
    assert (pools["v_scale"][t3[2], :, t3[3]] == 1).all() and (pools["v_cache"][t3[2], :, t3[3]] == 0).all()


# Quantized cache kinds of the GPU-vs-CPU write test: (pool dtype, scales per "vector" or per "tensor").
QUANT_WRITE_KINDS = {"int8": (torch.int8, "vector"), "fp8-vector": (torch.float8_e4m3fn, "vector"),
                     "fp8-tensor": (torch.float8_e4m3fn, "tensor")}
POISON_BYTE = {torch.int8: 0xB3, torch.float8_e4m3fn: 0x7F}  # -77; e4m3's NaN


def quant_write(device, kind, prob, k, v, k_smooth, tensor_scales):
    """cache_write of k, v on `device` into fresh pools of `kind` whose every
    byte is poison (and per-vector scales NaN); returns the pools' bytes and
    the scales, on the CPU."""
    dtype, scale_kind = QUANT_WRITE_KINDS[kind]
    shape = tuple(prob.k_cache.shape)
    pools = [torch.full(shape, POISON_BYTE[dtype], dtype=torch.uint8, device=device).view(dtype) for _ in range(2)]
    if scale_kind == "vector":
        scales = [torch.full(shape[:3], float("nan"), device=device) for _ in range(2)]
    else:
        scales = [s.to(device).clone() for s in tensor_scales]
    meta = [t.to(device) for t in (prob.block_tables, prob.seq_lens, prob.cu_seqlens_q)]
    ops.cache_write(pools[0], pools[1], k.to(device), v.to(device), *meta, scales[0], scales[1],
                    None if k_smooth is None else k_smooth.to(device))
    return [p.view(torch.uint8).cpu() for p in pools], [s.cpu() for s in scales]


@pytest.mark.parametrize("kind", list(QUANT_WRITE_KINDS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_quantized_cache_write_matches_cpu_op(kind, dtype, d):
    """Quantizing cache_write on the GPU stores the bytes and scales that the
    CPU op stores, bit for bit: both divide in IEEE fp32 (by k_smooth, then by
    the scale; per vector the scale is amax / 127 or amax / 448) and round to
    nearest even with saturation (int8 to +-127, e4m3 to +-448). Keys with an
    outlier channel, an all-zero value vector, and per tensor a scale half the
    calibrated one, so that the largest values saturate."""
    need("cache_write")
    page = PAGE_SIZES[HEAD_DIMS.index(d) % len(PAGE_SIZES)]
    prob = make_problem(SEQ_LENS, Q_LENS, 4, 2, d, page, dtype, DEV, seed=d + page)
    gen = torch.Generator(device=DEV).manual_seed(6000 + d)
    t = sum(Q_LENS) + 2  # two padding tokens, of no sequence: written by neither
    _, k, v = qkv_inputs(gen, t, 4, 2, d, dtype, packed=False)
    k[:, :, 3] *= 30
    v[5] = 0
    smooth = torch.rand(2, d, generator=gen, device=DEV) * 2 + 0.25 if kind != "fp8-tensor" else None
    tensor_scales = [(x.float().abs().max() / 448 * 0.5).reshape(1) for x in (k, v)]
    gpu_pools, gpu_scales = quant_write(DEV, kind, prob, k, v, smooth, tensor_scales)
    cpu_pools, cpu_scales = quant_write("cpu", kind, prob, k, v, smooth, tensor_scales)
    for name, g, c in zip(("k_cache", "v_cache"), gpu_pools, cpu_pools):
        assert torch.equal(g, c), f"{kind} {name}: {int((g != c).sum())} bytes differ from the CPU op's"
    for name, g, c in zip(("k_scale", "v_scale"), gpu_scales, cpu_scales):
        assert torch.equal(g.view(torch.int32), c.view(torch.int32)), f"{kind} {name}: bits differ from the CPU op's"
    # The test can fail: slots were written, and per tensor some keys saturated (e4m3 +-448: 0x7e, 0xfe).
    poison = POISON_BYTE[QUANT_WRITE_KINDS[kind][0]]
    targets, _ = token_targets(prob, t)
    page_ids = torch.tensor([x[2] for x in targets])
    slots = torch.tensor([x[3] for x in targets])
    assert (gpu_pools[0][page_ids, :, slots] != poison).any() and (gpu_pools[1][page_ids, :, slots] != poison).any()
    if kind == "fp8-tensor":
        assert ((gpu_pools[0] == 0x7E) | (gpu_pools[0] == 0xFE)).any(), "no key saturated"


# ----------------------------------------------------------------------------- attention_inputs

FUSED_CASES = [
    # (dtype, d, rotary index, norms, packed, page_size)
    (dtype, d, rot, norms, packed, PAGE_SIZES[(i + j) % 4])
    for i, dtype in enumerate(DTYPES)
    for j, d in enumerate(HEAD_DIMS)
    for rot in (0, 1, 2)
    for norms in ("both", "none", "k_only")
    for packed in (True, False)
]


def fused_case_id(c):
    dtype, d, rot, norms, packed, page = c
    return f"{str(dtype)[6:]}-d{d}-{['full', 'half', 'odd'][rot]}-{norms}-{'packed' if packed else 'separate'}-p{page}"


def run_fused_vs_separate(dtype, d, rotary_dim, norms, packed, page_size, int8=False, seed=0, hq=8, hkv=2,
                          seq_lens=SEQ_LENS, q_lens=Q_LENS):
    prob = make_problem(seq_lens, q_lens, hq, hkv, d, page_size, dtype, DEV, seed=seed, int8=int8)
    gen = torch.Generator(device=DEV).manual_seed(5000 + seed)
    t = sum(q_lens) + 3  # padding tokens of no sequence: not written
    q, k, v = qkv_inputs(gen, t, hq, hkv, d, dtype, packed)
    qw = norm_weight(gen, d, dtype) if norms == "both" else None
    kw = norm_weight(gen, d, dtype) if norms in ("both", "k_only") else None
    max_pos = max(seq_lens) + 5
    cos_sin = rope_cos_sin_cache(max_pos, rotary_dim, device=DEV)

    q_full, q_out = guarded((t, hq, d), dtype)
    pools = poisoned_pools(prob)
    expect = clone_pools(pools)
    ops.attention_inputs(q_out, pools["k_cache"], pools["v_cache"], q, k, v, prob.block_tables, prob.seq_lens,
                         prob.cu_seqlens_q, cos_sin, rotary_dim, qw, kw, EPS, pools["k_scale"], pools["v_scale"],
                         prob.k_smooth)
    targets, positions = token_targets(prob, t)
    q_sep, kr = separate_ops(q, k, v, expect, prob, positions, cos_sin, rotary_dim, qw, kw)

    # Bit-identical to the separate ops, everywhere (poison of skipped rows included).
    assert_same_bits(q_out, q_sep, "attention_inputs q_out vs rms_norm + rope")
    assert_pools_equal(pools, expect, "attention_inputs pools vs rms_norm + rope + cache_write")
    poison = bits(poison_(torch.empty_like(q_full[:2])))
    assert (bits(q_full[:2]) == poison).all() and (bits(q_full[-2:]) == poison).all(), "wrote outside q_out"
    assert (bits(q_out[sum(q_lens):]) == bits(poison_(q_out[sum(q_lens):].clone()))).all(), "padding rows written"
    # The test can fail: rows and slots were written.
    assert torch.isfinite(q_out[:sum(q_lens)].float()).all()
    assert targets

    # Against eager PyTorch: rotation exact up to 1 ulp; the norm adds its own
    # (rare) rounding flips of the normalized value.
    n = sum(q_lens)
    tol = 1.0 if qw is None else 2 * NORM_ULPS[dtype] + 1
    ref_q = eager_chain(q[:n], qw, positions[:n], cos_sin, rotary_dim)
    assert ulp_error(q_out[:n], ref_q, dtype) <= tol
    return prob, pools, k, kr, v, targets


@pytest.mark.parametrize("case", FUSED_CASES, ids=fused_case_id)
def test_attention_inputs_matches_separate_ops(case):
    need("attention_inputs", "rms_norm", "rope", "cache_write")
    dtype, d, rot, norms, packed, page_size = case
    run_fused_vs_separate(dtype, d, rotary_dims(d)[rot], norms, packed, page_size,
                          seed=d + 3 * rot + page_size + DTYPES.index(dtype))


# Prefill-sized steps: the queries kernel's thread groups take 4 consecutive
# rows each (inputs.cuh, rows_per_group_for), holding a token's position and
# cos / sin across its heads; smaller steps take one row per group. Several
# sequences of different lengths: 2000 tokens take the 4-row path at every
# head dim on an H200 with 32 / 8 heads; with 10 / 2 heads (bf16, d 128) the
# rows of a group also cross from one token to the next.
LARGE_SEQ_LENS = [1500, 977, 640, 2100]
LARGE_Q_LENS = [1500, 300, 129, 64]


@pytest.mark.parametrize("dtype,d,int8,hq,hkv", [
    (torch.bfloat16, 128, False, 32, 8), (torch.float16, 64, False, 32, 8), (torch.bfloat16, 256, False, 32, 8),
    (torch.float32, 128, False, 32, 8), (torch.bfloat16, 128, True, 32, 8), (torch.float16, 64, True, 32, 8),
    (torch.bfloat16, 128, False, 10, 2)], ids=lambda v: str(v).replace("torch.", ""))
def test_attention_inputs_large_step(dtype, d, int8, hq, hkv):
    need("attention_inputs", "rms_norm", "rope", "cache_write")
    run_fused_vs_separate(dtype, d, d, "both", True, 64, int8=int8, seed=d + int8 + hq, hq=hq, hkv=hkv,
                          seq_lens=LARGE_SEQ_LENS, q_lens=LARGE_Q_LENS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("rot", [0, 1], ids=["full", "half"])
@pytest.mark.parametrize("norms", ["both", "none"])
def test_attention_inputs_int8(dtype, d, rot, norms):
    need("attention_inputs", "rms_norm", "rope", "cache_write")
    page_size = PAGE_SIZES[(d // 64 + rot) % 4]
    prob, pools, k, kr, v, targets = run_fused_vs_separate(
        dtype, d, rotary_dims(d)[rot], norms, packed=rot == 0, page_size=page_size, int8=True,
        seed=7 * d + rot + (norms == "both"))
    # The quantization itself against the reference, on the rotated keys.
    int8_check(pools, prob, kr, v, targets, "attention_inputs int8")


# ----------------------------------------------------------------------------- bad metadata


def bad_problem(dtype, int8=False):
    """Sequences whose metadata points outside the pools, the table or the cos/sin cache:
      0: fine (decode)
      1: the page this step writes is -1           3: that page id is 10**6
      2: that page id is num_pages (one past)      4: seq_lens past the block table
      5: positions past the cos/sin table (but on valid pages)
      6: seq_lens < queries (negative positions)   + 2 padding tokens of no sequence."""
    seq_lens = [20, 40, 33, 17, 30, 60, 3]
    q_lens = [1, 4, 2, 1, 6, 8, 5]
    prob = make_problem(seq_lens, [min(a, b) for a, b in zip(q_lens, seq_lens)], 4, 2, 64, 16, dtype, DEV,
                        seed=11, int8=int8)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    prob.cu_seqlens_q = torch.tensor(cu, dtype=torch.int32, device=DEV)  # seq 6 has 5 queries, 3 positions
    num_pages = prob.k_cache.shape[0]
    bt = prob.block_tables
    bt[1, 39 // 16] = -1
    bt[2, 32 // 16] = num_pages
    bt[3, 16 // 16] = 10**6
    max_pages = bt.shape[1]
    prob.seq_lens[4] = max_pages * 16 + 3  # its last 3 positions are past the table
    # Its other positions land on its table's spare last column: point that at
    # a page nobody else uses, so no two tokens share a slot.
    used = {int(p) for row, L in zip(bt.tolist(), seq_lens) for p in row[:(L + 15) // 16]}
    bt[4, max_pages - 1] = min(set(range(num_pages)) - used)
    max_position = 50  # sequence 5's positions 52..59 are past the cos/sin table
    return prob, sum(q_lens) + 2, max_position


@pytest.mark.parametrize("int8", [False, True])
def test_bad_metadata_never_writes_outside(int8):
    need("attention_inputs", "cache_write", "rms_norm", "rope")
    dtype = torch.bfloat16
    prob, t, max_pos = bad_problem(dtype, int8)
    gen = torch.Generator(device=DEV).manual_seed(77)
    q, k, v = qkv_inputs(gen, t, 4, 2, 64, dtype, packed=True)
    qw, kw = norm_weight(gen, 64, dtype), norm_weight(gen, 64, dtype)
    cos_sin = rope_cos_sin_cache(max_pos, 64, device=DEV)
    targets, positions = token_targets(prob, t, max_position=max_pos)
    assert len(targets) >= 5, "the well-formed tokens must still be written"

    # cache_write alone: exactly the reference (which skips the same slots).
    pools = poisoned_pools(prob)
    ops.cache_write(pools["k_cache"], pools["v_cache"], k, v, prob.block_tables, prob.seq_lens, prob.cu_seqlens_q,
                    pools["k_scale"], pools["v_scale"], prob.k_smooth)
    torch.cuda.synchronize()
    if int8:
        all_targets, _ = token_targets(prob, t)
        int8_check(pools, prob, k, v, all_targets, "cache_write, bad metadata")
    else:
        expect = clone_pools(poisoned_pools(prob))
        reference.cache_write(expect["k_cache"], expect["v_cache"], k, v, prob.block_tables, prob.seq_lens,
                              prob.cu_seqlens_q)
        assert_pools_equal(pools, expect, "cache_write, bad metadata")

    # attention_inputs: writes exactly the valid tokens' slots (the separate ops'
    # values there), poison everywhere else, guards included.
    q_full, q_out = guarded(tuple(q.shape), dtype)
    pools = poisoned_pools(prob)
    ops.attention_inputs(q_out, pools["k_cache"], pools["v_cache"], q, k, v, prob.block_tables, prob.seq_lens,
                         prob.cu_seqlens_q, cos_sin, 64, qw, kw, EPS, pools["k_scale"], pools["v_scale"],
                         prob.k_smooth)
    torch.cuda.synchronize()
    safe_pos = torch.where((positions >= 0) & (positions < max_pos), positions, torch.full_like(positions, -1))
    q_sep = poison_(torch.empty_like(q))
    qn = torch.empty_like(q)
    ops.rms_norm(qn, q, qw, EPS)
    ops.rope(q_sep, qn, safe_pos, cos_sin, 64)
    assert_same_bits(q_out, q_sep, "attention_inputs q_out, bad metadata")
    poison = bits(poison_(torch.empty_like(q_full[:2])))
    assert (bits(q_full[:2]) == poison).all() and (bits(q_full[-2:]) == poison).all()
    kn, kr = torch.empty_like(k), poison_(torch.empty_like(k))
    ops.rms_norm(kn, k, kw, EPS)
    ops.rope(kr, kn, safe_pos, cos_sin, 64)
    expect = clone_pools(poisoned_pools(prob))
    tok = torch.tensor([x[0] for x in targets], device=DEV)
    page = torch.tensor([x[2] for x in targets], device=DEV)
    slot = torch.tensor([x[3] for x in targets], device=DEV)
    if int8:
        # (The reference also writes sequence 5, past the cos/sin table; the fused
        # op skips it: int8_check expects poison outside `targets`.)
        int8_check(pools, prob, kr, v, targets, "attention_inputs, bad metadata")
    else:
        expect["k_cache"][page, :, slot] = kr[tok]
        expect["v_cache"][page, :, slot] = v[tok]
        assert_pools_equal(pools, expect, "attention_inputs, bad metadata")

    # The context survives: more work runs and syncs.
    x = torch.randn(1000, device=DEV)
    assert torch.isfinite((x * 2).sum()).item()
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- CUDA graph


def test_attention_inputs_cuda_graph_as_sequences_grow():
    need("attention_inputs")
    dtype, d, page_size, hq, hkv = torch.bfloat16, 128, 16, 8, 2
    start = [14, 15, 30]  # decode steps cross the page boundaries 16 and 32
    steps = 5
    prob = make_problem([s + steps for s in start], [1, 1, 1], hq, hkv, d, page_size, dtype, DEV, seed=5)
    seq_lens = prob.seq_lens.clone()
    seq_lens.copy_(torch.tensor(start, dtype=torch.int32))
    cu = prob.cu_seqlens_q
    cos_sin = rope_cos_sin_cache(4096, d, device=DEV)
    gen = torch.Generator(device=DEV).manual_seed(99)
    qw, kw = norm_weight(gen, d, dtype), norm_weight(gen, d, dtype)
    q, k, v = qkv_inputs(gen, 3, hq, hkv, d, dtype, packed=True)
    q_out = poison_(torch.empty(3, hq, d, dtype=dtype, device=DEV))
    pools = poisoned_pools(prob)
    eager = clone_pools(pools)

    def step(qo, pl, sl):
        ops.attention_inputs(qo, pl["k_cache"], pl["v_cache"], q, k, v, prob.block_tables, sl, cu, cos_sin, d,
                             qw, kw, EPS)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(q_out, clone_pools(pools), seq_lens)  # warm-up on scratch pools
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(q_out, pools, seq_lens)

    for i in range(steps):
        seq_lens.add_(1)  # this step's key lands at position seq_lens - 1
        q.copy_(rand(gen, tuple(q.shape), dtype))
        k.copy_(rand(gen, tuple(k.shape), dtype))
        v.copy_(rand(gen, tuple(v.shape), dtype))
        g.replay()
        q_eager = poison_(torch.empty_like(q_out))
        step(q_eager, eager, seq_lens.clone())
        assert_same_bits(q_out, q_eager, f"graph step {i}: q_out")
        assert_pools_equal(pools, eager, f"graph step {i}: pools")
    # Every step's key landed: the last `steps` positions of each sequence are written.
    for s, L in enumerate(seq_lens.tolist()):
        for p in range(L - steps, L):
            page = int(prob.block_tables[s, p // page_size])
            assert not torch.isnan(pools["k_cache"][page, :, p % page_size].float()).any()


# ----------------------------------------------------------------------------- bad arguments


def test_bad_arguments_name_the_argument():
    need("rms_norm", "rope", "cache_write", "attention_inputs")
    dtype, d = torch.bfloat16, 128
    x = torch.randn(4, 2, d, device=DEV).to(dtype)
    out = torch.empty_like(x)
    w = torch.ones(d, device=DEV, dtype=dtype)
    pos = torch.arange(4, device=DEV)
    cs = rope_cos_sin_cache(16, d, device=DEV)
    with pytest.raises(RuntimeError, match=r"rms_norm: weight must have shape \[128\]"):
        ops.rms_norm(out, x, w[:64], EPS)
    with pytest.raises(RuntimeError, match="rms_norm: weight must have the dtype"):
        ops.rms_norm(out, x, w.float(), EPS)
    with pytest.raises(RuntimeError, match="rope: rotary_dim must be even"):
        ops.rope(out, x, pos, rope_cos_sin_cache(16, 2, device=DEV)[:, :1].contiguous(), 1)
    with pytest.raises(RuntimeError, match="rope: rotary_dim must be even"):
        ops.rope(out, x, pos, rope_cos_sin_cache(16, 2 * d, device=DEV), 2 * d)
    with pytest.raises(RuntimeError, match="rope: positions must be int32 or int64"):
        ops.rope(out, x, pos.float(), cs, d)
    with pytest.raises(RuntimeError, match="rope: cos_sin_cache must have shape"):
        ops.rope(out, x, pos, cs[:, :64].contiguous(), d)
    with pytest.raises(RuntimeError, match="rope: out must have 4 tokens"):
        ops.rope(out[:3], x, pos, cs, d)

    prob = make_problem([5, 9], [2, 3], 4, 2, d, 16, dtype, DEV)
    k = torch.randn(5, 3, d, device=DEV).to(dtype)
    with pytest.raises(RuntimeError, match="cache_write: k must have 2 heads"):
        ops.cache_write(prob.k_cache, prob.v_cache, k, k, prob.block_tables, prob.seq_lens, prob.cu_seqlens_q)
    k = torch.randn(5, 2, d, device=DEV).to(dtype)
    with pytest.raises(RuntimeError, match="cache_write: v must have 5 tokens"):
        ops.cache_write(prob.k_cache, prob.v_cache, k, k[:4], prob.block_tables, prob.seq_lens, prob.cu_seqlens_q)
    p8 = make_problem([5, 9], [2, 3], 4, 2, d, 16, dtype, DEV, int8=True)
    with pytest.raises(RuntimeError,
                       match=r"cache_write: with a quantized cache \(int8\) k must be bfloat16 or float16"):
        ops.cache_write(p8.k_cache, p8.v_cache, k.float(), k.float(), p8.block_tables, p8.seq_lens,
                        p8.cu_seqlens_q, p8.k_scale, p8.v_scale, p8.k_smooth)
    with pytest.raises(RuntimeError, match="cache_write: k_scale is required"):
        ops.cache_write(p8.k_cache, p8.v_cache, k, k, p8.block_tables, p8.seq_lens, p8.cu_seqlens_q)

    q = prob.q  # [5, 4, d]
    q_out = torch.empty_like(q)
    args = (prob.k_cache, prob.v_cache)
    meta = (prob.block_tables, prob.seq_lens, prob.cu_seqlens_q)
    with pytest.raises(RuntimeError, match="attention_inputs: q_out must have 4 heads"):
        ops.attention_inputs(q_out[:, :3], *args, q, k, k, *meta, cs, d, None, None, EPS)
    with pytest.raises(RuntimeError, match=r"attention_inputs: q_norm_weight must have shape \[128\]"):
        ops.attention_inputs(q_out, *args, q, k, k, *meta, cs, d, w[:3], None, EPS)
    with pytest.raises(RuntimeError, match="attention_inputs: cos_sin_cache must be float32"):
        ops.attention_inputs(q_out, *args, q, k, k, *meta, cs.double(), d, None, None, EPS)
    # A view that breaks the 16-byte alignment of the vector loads.
    flat = torch.randn(5 * 4 * d + 1, device=DEV).to(dtype)
    q_mis = flat[1:].view(5, 4, d)
    with pytest.raises(RuntimeError, match="attention_inputs: q must be 16-byte aligned"):
        ops.attention_inputs(q_out, *args, q_mis, k, k, *meta, cs, d, None, None, EPS)
    with pytest.raises(RuntimeError, match="attention_inputs: block_tables must be int32"):
        ops.attention_inputs(q_out, *args, q, k, k, prob.block_tables.long(), prob.seq_lens, prob.cu_seqlens_q,
                             cs, d, None, None, EPS)
