"""Eager PyTorch references for every op: the oracle users compare against.

``paged_attention(..., exact=False)`` computes attention as PyTorch eager does
(HF's eager attention): scores and probabilities rounded to the element type.
``exact=True`` computes in float64 on the same inputs: the yardstick of the
package's own tests. ``paged_attention`` takes the arguments of
``tileinfer_attn.attention`` in the same order, so a call of one is a call of
the other.

Semantics shared with the kernels: query t of sequence s
sits at position seq_lens[s] - n_s + t; causal queries see positions <= their
own; a row that sees no position gives 0 (and lse = -inf); block-table entries
outside the pool are skipped (their positions contribute nothing). The
per-layer variants: a window (a query at p sees keys from p - window_left
on), a soft-cap (scaled scores s become cap * tanh(s / cap) before masking)
and sinks (a logit per query head that joins the softmax denominator; lse
includes it, and a row that sees no position then has lse = its sink). A
tree mask (tree verify): bit j of the word of a sequence's step token i says
whether it sees step token j (position seq_lens[s] - n_s + j); the positions
before the step stay visible, and under causal j <= i holds as well.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "token_positions",
    "gather_kv",
    "paged_attention",
    "rms_norm",
    "rope",
    "cache_write",
    "merge_partials",
]


def token_positions(seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Position of every token of the step ([num_tokens] int64); -1 for tokens of no sequence."""
    tok = torch.arange(num_tokens, device=cu_seqlens_q.device)
    cu = cu_seqlens_q.long()
    # The sequence of token t: how many of cu[1:] are <= t. Counted over the whole
    # of cu (minus cu[0]'s share): inductor cannot lower searchsorted on a slice.
    seq = torch.searchsorted(cu, tok, right=True) - (cu[0] <= tok).long()
    valid = seq < seq_lens.numel()
    seq_c = seq.clamp(max=max(seq_lens.numel() - 1, 0))
    n = cu[seq_c + 1] - cu[seq_c]
    pos = seq_lens.long()[seq_c] - n + (tok - cu[seq_c])
    return torch.where(valid, pos, torch.full_like(pos, -1))


# Quantized cache types and the largest magnitude each holds (a per-vector
# scale is amax / this, rounded up to SCALE_BITS; writes saturate to it).
QUANT_MAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
# Significant bits of a per-vector scale as the cache writes store it: a stored
# value (int8: 7 bits, e4m3: 4) times its scale then has at most 11, an fp16
# number up to a power of two, which the Hopper prefill relies on.
SCALE_BITS = {torch.int8: 4, torch.float8_e4m3fn: 7}


def round_scale_up(scale: torch.Tensor, bits: int) -> torch.Tensor:
    """fp32 scales rounded up to ``bits`` significant bits (the fraction of each
    positive float cut to bits - 1 bits, rounded up; inf and NaN unchanged):
    the kernels' rule (csrc/include/tileinfer/scale_rule.h)."""
    b = scale.float().contiguous().view(torch.int32)
    drop = (1 << (24 - bits)) - 1
    finite = (b & 0x7F800000) != 0x7F800000
    up = torch.where(((b & drop) != 0) & finite, (b | drop) + 1, b)
    return up.view(torch.float32)


def _dequant(cache: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    if cache.dtype not in QUANT_MAX:
        return cache
    if scale.numel() == 1:  # per tensor (fp8)
        return cache.float() * scale.reshape(()).float()
    return cache.float() * scale.unsqueeze(-1)


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: Optional[torch.Tensor] = None):
    """Symmetric quantization of the vectors of x (last dim) into ``dtype``
    (int8 or float8_e4m3fn), as the cache writes do: per vector (``scale``
    None) scale = amax / 127 or amax / 448 rounded up to SCALE_BITS significant
    bits (round_scale_up; 1 for a zero vector), else the
    given per-tensor scale. Elements x / scale, in fp32, saturate: int8 rounded
    half-even and clamped to +-127, fp8 clamped to +-448 and rounded to the
    nearest e4m3. Returns (quantized, scale per vector or the given scale)."""
    x = x.float()
    qmax = QUANT_MAX[dtype]
    if scale is None:
        amax = x.abs().amax(-1)
        # A tensor divisor: eager CUDA turns a division by a Python number
        # into a multiplication by its reciprocal, not the kernels' IEEE division.
        scale = round_scale_up(amax / torch.full_like(amax, qmax), SCALE_BITS[dtype])
        scale = torch.where(amax > 0, scale, torch.ones_like(amax))
        y = x / scale[..., None]
    else:
        y = x / scale.reshape(()).float()
    if dtype == torch.int8:
        return torch.round(y).clamp(-qmax, qmax).to(dtype), scale
    return y.clamp(-qmax, qmax).to(dtype), scale


def gather_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    seq: int,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_smooth: Optional[torch.Tensor] = None,
):
    """Keys and values of one sequence, [L, num_kv_heads, head_dim], plus a [L] bool
    mask that is False on positions whose page id is outside the pool.

    A quantized (int8, fp8) cache is dequantized to float32 (keys multiplied back by k_smooth)."""
    num_pages, _, page_size, _ = k_cache.shape
    cap = block_tables.shape[1] * page_size
    length = max(0, min(int(seq_lens[seq]), cap))
    n_pages = (length + page_size - 1) // page_size
    ids = block_tables[seq, :n_pages].long()
    ok = (ids >= 0) & (ids < num_pages)
    safe = torch.where(ok, ids, torch.zeros_like(ids))
    k = _dequant(k_cache, k_scale)[safe]  # [n_pages, kvh, page, d]
    v = _dequant(v_cache, v_scale)[safe]
    if k_cache.dtype in QUANT_MAX and k_smooth is not None:
        k = k * k_smooth[None, :, None, :]
    k = k.transpose(1, 2).reshape(n_pages * page_size, k.shape[1], k.shape[3])[:length]
    v = v.transpose(1, 2).reshape(n_pages * page_size, v.shape[1], v.shape[3])[:length]
    valid = ok.repeat_interleave(page_size)[:length]
    return k, v, valid


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_q_len: int,
    scale: Optional[float] = None,
    causal: bool = True,
    out: Optional[torch.Tensor] = None,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_smooth: Optional[torch.Tensor] = None,
    window_left: int = -1,
    logits_soft_cap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    tree_mask: Optional[torch.Tensor] = None,
    batch_invariant: bool = False,
    *,
    exact: bool = False,
    return_lse: bool = False,
):
    """Attention of a varlen batch over the paged cache, by gathering pages.

    The arguments of ``tileinfer_attn.attention``, in its order: ``max_q_len``
    is checked (a non-negative host int) but not needed, since the reference
    reads each sequence's query count from ``cu_seqlens_q``; ``scale`` defaults
    to ``head_dim ** -0.5``; ``out``, if given, receives the result (it must
    have the result's shape; it is returned); ``batch_invariant`` changes
    nothing (each sequence is computed on its own, so the reference is batch
    invariant either way). Then, keyword only:

    exact=False: eager rounding (scores and probabilities in q's dtype, softmax
    in float32 as HF's eager attention: the soft-cap in q's dtype as Gemma 2's,
    the sinks as an extra column of the float32 softmax as gpt-oss's); out has
    q's dtype. exact=True: float64 throughout, out float64. Returns out [num_tokens, num_q_heads, head_dim]
    (and lse [num_tokens, num_q_heads], natural log, with return_lse). Rows of
    tokens of no sequence are 0."""
    ok = isinstance(max_q_len, torch.SymInt) or (
        isinstance(max_q_len, int) and not isinstance(max_q_len, bool) and max_q_len >= 0)
    if not ok:
        raise RuntimeError(f"reference.paged_attention: max_q_len must be a non-negative int (the arguments are "
                           f"those of tileinfer_attn.attention, in its order), got {max_q_len!r}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise RuntimeError(f"reference.paged_attention: scale must be a number, got {scale!r}")
    if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
        raise RuntimeError(f"reference.paged_attention: window_left must be an int >= -1, got {window_left!r}")
    if isinstance(logits_soft_cap, bool) or not isinstance(logits_soft_cap, (int, float)) or not (
            logits_soft_cap >= 0):
        raise RuntimeError(f"reference.paged_attention: logits_soft_cap must be a number >= 0, "
                           f"got {logits_soft_cap!r}")
    result = _paged_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, float(scale), bool(causal),
                              k_scale, v_scale, k_smooth, exact, window_left, float(logits_soft_cap), sinks,
                              tree_mask)
    if out is not None:
        if tuple(out.shape) != tuple(result[0].shape):
            raise RuntimeError(f"reference.paged_attention: out must have shape {tuple(result[0].shape)}, "
                               f"got {tuple(out.shape)}")
        out.copy_(result[0])
        result = (out, result[1])
    return result if return_lse else result[0]


def _paged_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, causal, k_scale, v_scale,
                     k_smooth, exact, window_left=-1, soft_cap=0.0, sinks=None, tree_mask=None):
    """(out, lse) of paged_attention."""
    num_tokens, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    work = torch.float64 if exact else q.dtype
    out = torch.zeros(num_tokens, hq, d, dtype=torch.float64 if exact else q.dtype, device=q.device)
    lse = torch.full((num_tokens, hq), float("-inf"), dtype=torch.float64 if exact else torch.float32,
                     device=q.device)
    cu = cu_seqlens_q.tolist()
    for s in range(block_tables.shape[0]):
        b, e = cu[s], cu[s + 1]
        if e <= b:
            continue
        k, v, valid = gather_kv(k_cache, v_cache, block_tables, seq_lens, s, k_scale, v_scale, k_smooth)
        length = k.shape[0]
        n = e - b
        qs = q[b:e].to(work).transpose(0, 1)  # [hq, n, d]
        ks = k.to(work).repeat_interleave(group, dim=1).transpose(0, 1)  # [hq, L, d]
        vs = v.to(work).repeat_interleave(group, dim=1).transpose(0, 1)
        scores = torch.matmul(qs, ks.transpose(1, 2)) * scale  # [hq, n, L]
        if soft_cap > 0:
            scores = torch.tanh(scores / soft_cap) * soft_cap
        qpos = length - n + torch.arange(n, device=q.device)
        kpos = torch.arange(length, device=q.device)
        mask = valid[None, :].expand(n, length)
        if causal:
            mask = mask & (kpos[None, :] <= qpos[:, None])
        if window_left >= 0:
            mask = mask & (kpos[None, :] >= qpos[:, None] - window_left)
        if tree_mask is not None:  # step token j at position length - n + j: bit j of the query's word
            j = kpos - (length - n)
            words = tree_mask[b:e].to(q.device, torch.int64)[:, None]
            bit = (words >> j.clamp(0, 31)[None, :]) & 1
            mask = mask & ((j[None, :] < 0) | (bit == 1))
        # [hq, 1, 1] sink logits, or None
        sink = None if sinks is None else sinks.to(q.device, torch.float64 if exact else torch.float32)[:, None, None]
        if exact:
            scores = scores.masked_fill(~mask, float("-inf"))
            m = scores.amax(-1, keepdim=True)
            if sink is not None:
                m = torch.maximum(m, sink)
            seen = torch.isfinite(m)
            m = torch.where(seen, m, torch.zeros_like(m))
            p = torch.exp(scores - m)
            den = p.sum(-1, keepdim=True)
            if sink is not None:
                den = den + torch.exp(sink - m)
            o = torch.matmul(p, vs) / torch.where(seen, den, torch.ones_like(den))
            row_lse = torch.where(seen, m + torch.log(den), torch.full_like(m, float("-inf")))
        else:
            scores32 = scores.float().masked_fill(~mask, float("-inf"))
            seen = mask.any(-1, keepdim=True)
            if sink is not None:  # one more column of the softmax, dropped after it
                scores32 = torch.cat([scores32, sink.expand(-1, n, 1)], dim=-1)
            p = torch.softmax(scores32, dim=-1)
            row_lse = torch.logsumexp(scores32, dim=-1, keepdim=True)
            if sink is not None:
                p = p[..., :-1]
            p = torch.where(seen, p, torch.zeros_like(p)).to(work)
            o = torch.matmul(p, vs)
        out[b:e] = o.transpose(0, 1).to(out.dtype)
        lse[b:e] = row_lse.squeeze(-1).transpose(0, 1).to(lse.dtype)
    return out, lse


def merge_partials(partial_out: torch.Tensor, partial_lse: torch.Tensor):
    """Merges partial results ([S, T, H, D] normalized outputs, [S, T, H] natural-log
    lse) into (out [T, H, D], lse [T, H]), in float64: the oracle of combine."""
    po = partial_out.double()
    pl = partial_lse.double()
    m = pl.amax(0)
    seen = torch.isfinite(m)
    m0 = torch.where(seen, m, torch.zeros_like(m))
    w = torch.exp(pl - m0)  # exp(-inf) = 0 for neutral partials
    den = w.sum(0)
    out = (w.unsqueeze(-1) * po).sum(0) / torch.where(seen, den, torch.ones_like(den)).unsqueeze(-1)
    lse = torch.where(seen, m0 + torch.log(den), torch.full_like(m0, float("-inf")))
    return out, lse


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm over the last dim: float32 math, rounded to x's dtype, times weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Neox (rotate-half) rotary embedding on the first rotary_dim channels, float32
    math rounded once to x's dtype. cos_sin_cache [max_position, rotary_dim]: cos then sin."""
    half = rotary_dim // 2
    cs = cos_sin_cache[positions.long()].float()  # [T, rotary_dim]
    cos = cs[:, None, :half]
    sin = cs[:, None, half:]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:rotary_dim]
    out = xf.clone()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rotary_dim] = x2 * cos + x1 * sin
    return out.to(x.dtype)


def cache_write(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_smooth: Optional[torch.Tensor] = None,
) -> None:
    """Writes token t of sequence s at position seq_lens[s] - n_s + t, in place.
    Positions on pages outside the pool are skipped. int8 / fp8: ``quantize``
    (keys divided by k_smooth first), per vector unless k_scale has one element."""
    num_pages, _, page_size, _ = k_cache.shape
    pos = token_positions(seq_lens, cu_seqlens_q, k.shape[0])
    seq = torch.searchsorted(cu_seqlens_q.long()[1:], torch.arange(k.shape[0], device=k.device), right=True)
    for t in range(k.shape[0]):
        s, p = int(seq[t]), int(pos[t])
        if s >= block_tables.shape[0] or p < 0 or p >= block_tables.shape[1] * page_size:
            continue
        page = int(block_tables[s, p // page_size])
        if page < 0 or page >= num_pages:
            continue
        slot = p % page_size
        if k_cache.dtype in QUANT_MAX:
            kt = k[t].float()
            if k_smooth is not None:
                kt = kt / k_smooth
            for src, dst, sc in ((kt, k_cache, k_scale), (v[t].float(), v_cache, v_scale)):
                per_tensor = sc.numel() == 1
                qx, scale = quantize(src, k_cache.dtype, sc if per_tensor else None)
                dst[page, :, slot] = qx
                if not per_tensor:
                    sc[page, :, slot] = scale
        else:
            k_cache[page, :, slot] = k[t].to(k_cache.dtype)
            v_cache[page, :, slot] = v[t].to(v_cache.dtype)
