"""CPU rms_norm / rope / cache_write / attention_inputs against the eager
reference (within 1 ulp), and bit-identity of the fused
attention_inputs with the separate ops."""
import pytest
import torch

import tileinfer_attn as ti
from tileinfer_attn import reference as R
from tileinfer_attn.testing import make_problem, poison_
from op_helpers import QUANT_KINDS

ops = torch.ops.tileinfer_attn

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def max_ulps(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest elementwise difference in ulps of ref's dtype at each element's magnitude."""
    o, r = out.double(), ref.double()
    assert torch.isfinite(o).all()
    eps = torch.finfo(ref.dtype).eps
    tiny = torch.finfo(ref.dtype).tiny
    unit = torch.exp2(torch.floor(torch.log2(r.abs().clamp_min(tiny)))) * eps
    return float(((o - r).abs() / unit).max()) if o.numel() else 0.0


def ulp_tol(dtype, weighted=False) -> float:
    """1 ulp for bf16/fp16 (the bound of docs/CONTRACT.md). RMSNorm rounds twice (normalized
    value, then times the weight): where the sum of squares, summed in another
    order than PyTorch's vectorized reduction, flips the first rounding, the
    weight carries that 1 ulp into up to 2 ulps of the result. fp32 has no
    rounding to hide the summation order: a few fp32 ulps."""
    if dtype == torch.float32:
        return 8.0
    return 2.0 if weighted else 1.0


def randn(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_rms_norm(dtype, head_dim):
    x = randn(37, 6, head_dim, dtype=dtype) * 3
    w = (randn(head_dim, dtype=torch.float32, seed=1) * 0.5 + 1).to(dtype)
    out = poison_(torch.empty_like(x))
    ones = torch.ones(head_dim, dtype=dtype)
    ops.rms_norm(out, x, ones, 1e-6)
    assert max_ulps(out, R.rms_norm(x, ones, 1e-6)) <= ulp_tol(dtype)
    ops.rms_norm(out, x, w, 1e-6)
    assert max_ulps(out, R.rms_norm(x, w, 1e-6)) <= ulp_tol(dtype, weighted=True)
    # in place, and on a strided view (q heads of a packed qkv)
    packed = randn(37, 10, head_dim, dtype=dtype, seed=2)
    view = packed[:, 2:8]
    expect = R.rms_norm(view, w, 1e-6)
    ops.rms_norm(view, view, w, 1e-6)
    assert max_ulps(view, expect) <= ulp_tol(dtype, weighted=True)
    assert torch.equal(ti.rms_norm(x, w, 1e-6), out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 128), (128, 64), (256, 256)])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_rope(dtype, head_dim, rotary_dim, pos_dtype):
    x = randn(29, 4, head_dim, dtype=dtype)
    cache = ti.rope_cos_sin_cache(rotary_dim, 4096)
    pos = torch.randint(0, 4096, (29,), generator=torch.Generator().manual_seed(3)).to(pos_dtype)
    out = poison_(torch.empty_like(x))
    ops.rope(out, x, pos, cache, rotary_dim)
    ref = R.rope(x, pos, cache, rotary_dim)
    assert max_ulps(out, ref) <= 1
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
    y = x.clone()
    ops.rope(y, y, pos, cache, rotary_dim)  # in place
    assert torch.equal(y, out)


def kv_for(p, dtype, seed=9):
    t = p.q.shape[0]
    hkv, d = p.k_cache.shape[1], p.k_cache.shape[3]
    return randn(t, hkv, d, dtype=dtype, seed=seed), randn(t, hkv, d, dtype=dtype, seed=seed + 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 128])
def test_cache_write_float(dtype, page_size):
    p = make_problem([page_size - 1, page_size + 1, 3 * page_size, 1], [page_size - 1, 2, 16, 1], 4, 2, 64,
                     page_size, dtype=dtype, seed=page_size)
    k, v = kv_for(p, dtype)
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    ops.cache_write(kc, vc, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q)
    rk, rv = p.k_cache.clone(), p.v_cache.clone()
    R.cache_write(rk, rv, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q)
    # Whole pools compared: every other page and slot is untouched.
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    assert not torch.equal(kc, p.k_cache)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("quant", list(QUANT_KINDS))
def test_cache_write_quantized(quant, dtype, smooth):
    p = make_problem([15, 17, 40, 1], [15, 2, 16, 1], 4, 2, 128, 16, dtype=dtype, seed=4, **QUANT_KINDS[quant])
    k, v = kv_for(p, dtype)
    k[3, 1] = 0  # a zero vector: scale 1, all zeros
    kw = p.quant_kwargs()
    if not smooth:
        kw["k_smooth"] = None
    kc, vc, ks, vs = p.k_cache.clone(), p.v_cache.clone(), p.k_scale.clone(), p.v_scale.clone()
    ops.cache_write(kc, vc, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q, ks, vs, kw["k_smooth"])
    rk, rv, rks, rvs = p.k_cache.clone(), p.v_cache.clone(), p.k_scale.clone(), p.v_scale.clone()
    R.cache_write(rk, rv, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q, rks, rvs, kw["k_smooth"])
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    assert torch.equal(ks, rks) and torch.equal(vs, rvs)
    if ks.numel() > 1:  # per vector: scales of the significant bits the Hopper prefill relies on
        drop = (1 << (24 - R.SCALE_BITS[kc.dtype])) - 1
        assert not (ks.view(torch.int32) & drop).any() and not (vs.view(torch.int32) & drop).any()
    assert not torch.isnan(kc.float()).any() and not torch.isnan(vc.float()).any()
    # Dequantized values are close to the inputs, saturated at +-127 / +-448
    # scales: int8 |error| <= scale / 2; e4m3 half its 3-bit mantissa's step
    # (2^-4 relative), 2^-10 scale among the subnormals.
    pos = R.token_positions(p.seq_lens, p.cu_seqlens_q, k.shape[0])
    page = p.block_tables[0, int(pos[0]) // 16]
    slot = int(pos[0]) % 16
    scale = vs[page, :, slot, None] if vs.numel() > 1 else vs.reshape(())
    qmax = R.QUANT_MAX[kc.dtype]
    deq = vc[page, :, slot].float() * scale
    want = (v[0].float() / scale).clamp(-qmax, qmax) * scale
    tol = scale / 2 if kc.dtype == torch.int8 else want.abs() * 2**-4 + scale * 2**-10
    assert ((deq - want).abs() <= tol + 1e-6).all()


def test_cache_write_skips_bad_pages_and_other_sequences():
    p = make_problem([20, 20], [4, 4], 4, 2, 64, 16, dtype=torch.float32, seed=5)
    p.block_tables[0, 1] = -1  # sequence 0's new tokens (positions 16-19) have no page
    k, v = kv_for(p, torch.float32)
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    ops.cache_write(kc, vc, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q)
    rk, rv = p.k_cache.clone(), p.v_cache.clone()
    R.cache_write(rk, rv, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q)
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    changed = (kc != p.k_cache).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [int(p.block_tables[1, 1])]  # only sequence 1's page


def _inputs(dtype, quant, head_dim=128, page_size=16, rotary_dim=None, norm=True, pad=0, seed=0):
    lens = [page_size - 1, page_size + 3, 2 * page_size, 1]
    q_lens = [page_size - 1, 3, 16, 1]
    p = make_problem(lens, q_lens, 8, 2, head_dim, page_size, dtype=dtype, seed=seed, **QUANT_KINDS.get(quant, {}))
    qdt = p.q.dtype
    t = p.q.shape[0] + pad
    q = randn(t, 8, head_dim, dtype=qdt, seed=seed + 1) * 2
    k = randn(t, 2, head_dim, dtype=qdt, seed=seed + 2) * 2
    v = randn(t, 2, head_dim, dtype=qdt, seed=seed + 3)
    rotary_dim = rotary_dim or head_dim
    cache = ti.rope_cos_sin_cache(rotary_dim, 4 * page_size)
    qw = (randn(head_dim, dtype=torch.float32, seed=seed + 4) * 0.3 + 1).to(qdt) if norm else None
    kw = (randn(head_dim, dtype=torch.float32, seed=seed + 5) * 0.3 + 1).to(qdt) if norm else None
    return p, q, k, v, cache, rotary_dim, qw, kw


@pytest.mark.parametrize("dtype,quant", [(torch.bfloat16, None), (torch.float16, None), (torch.float32, None),
                                         (torch.bfloat16, "int8"), (torch.float16, "int8"),
                                         (torch.bfloat16, "fp8-vector"), (torch.float16, "fp8-tensor")])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("head_dim,rotary_dim", [(128, 128), (64, 32), (256, 256)])
def test_attention_inputs_bit_identical_to_separate_ops(dtype, quant, norm, head_dim, rotary_dim):
    p, q, k, v, cache, rd, qw, kw = _inputs(dtype, quant, head_dim, rotary_dim=rotary_dim, norm=norm, pad=2)
    extra = p.quant_kwargs()
    extra8 = [extra.get("k_scale"), extra.get("v_scale"), extra.get("k_smooth")]

    # fused
    q_out = poison_(torch.empty_like(q))
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    sc = [t.clone() if t is not None else None for t in extra8[:2]] + [extra8[2]]
    ops.attention_inputs(q_out, kc, vc, q, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q, cache, rd, qw, kw,
                         1e-6, *sc)

    # separate ops, on the tokens of the sequences (the last 2 are padding: rows not written)
    n = int(p.cu_seqlens_q[-1])
    pos = ti.token_positions(p.seq_lens, p.cu_seqlens_q, n)
    qs, ks = q[:n], k[:n]
    if norm:
        qs, ks = ti.rms_norm(qs, qw, 1e-6), ti.rms_norm(ks, kw, 1e-6)
    qs, ks = ti.rope(qs, pos, cache, rd), ti.rope(ks, pos, cache, rd)
    kc2, vc2 = p.k_cache.clone(), p.v_cache.clone()
    sc2 = [t.clone() if t is not None else None for t in extra8[:2]] + [extra8[2]]
    ops.cache_write(kc2, vc2, ks, v[:n], p.block_tables, p.seq_lens, p.cu_seqlens_q, *sc2)

    assert torch.equal(q_out[:n], qs)
    assert torch.isnan(q_out[n:]).all()
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    if quant:
        assert torch.equal(sc[0], sc2[0]) and torch.equal(sc[1], sc2[1])

    # and the eager reference chain: rope within 1 ulp of the reference's on the
    # normalized input (test_rms_norm bounds the norm itself)
    qn = ti.rms_norm(q[:n], qw, 1e-6) if norm else q[:n]
    assert max_ulps(q_out[:n], R.rope(qn, pos, cache, rd)) <= ulp_tol(dtype)
    if not quant:
        kn = ti.rms_norm(k[:n], kw, 1e-6) if norm else k[:n]
        rkc, rvc = p.k_cache.clone(), p.v_cache.clone()
        R.cache_write(rkc, rvc, R.rope(kn, pos, cache, rd), v[:n], p.block_tables, p.seq_lens, p.cu_seqlens_q)
        assert max_ulps(kc, rkc) <= ulp_tol(dtype) and torch.equal(vc, rvc)


def test_wrappers_allocate_and_default():
    p, q, k, v, cache, rd, qw, kw = _inputs(torch.bfloat16, None)
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    q_out = ti.attention_inputs(q, k, v, kc, vc, p.block_tables, p.seq_lens, p.cu_seqlens_q, cache,
                                q_norm_weight=qw, k_norm_weight=kw)
    out = ti.attention(q_out, kc, vc, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len)
    ref = R.paged_attention(q_out, kc, vc, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len, 128 ** -0.5,
                            exact=True)
    from tileinfer_attn.testing import ulp_error
    assert ulp_error(out, ref, torch.bfloat16) <= 4


@pytest.mark.parametrize("bits", [4, 7])
def test_round_scale_up(bits):
    """reference.round_scale_up (the writes' per-vector scale rule): a scale
    with `bits` significant bits or fewer stays; any other becomes the next
    such number up (so x / scale stays within the format's range); inf and
    NaN stay; subnormals keep the same fraction cut."""
    x = torch.tensor([1.0, 1.5, 0.75, 2.0 ** -127, float("inf")])  # (2^-127: a subnormal, fraction bit 22)
    assert torch.equal(R.round_scale_up(x, bits), x)
    assert torch.isnan(R.round_scale_up(torch.tensor([float("nan")]), bits)).all()
    step = 2.0 ** (1 - bits)  # the kept fraction's last bit at exponent 0
    y = torch.tensor([1.0 + 2.0 ** -23, 1.0 + step / 2, 2.0 - 2.0 ** -23])
    assert torch.equal(R.round_scale_up(y, bits), torch.tensor([1.0 + step, 1.0 + step, 2.0]))
    r = torch.rand(1000) * 10 + 1e-3
    up = R.round_scale_up(r, bits)
    assert (up >= r).all() and (up <= r * (1 + step)).all()
    assert not (up.view(torch.int32) & ((1 << (24 - bits)) - 1)).any()
