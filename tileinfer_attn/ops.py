"""Python wrappers of the ops: argument checks, docstrings, allocation of outputs.

Every op is also callable directly as ``torch.ops.tileinfer_attn.<name>`` (the
out-style form of csrc/torch_bindings.cpp: it writes into tensors it is given
and returns nothing). The wrappers here are the functional forms: they allocate
what is not given, fill in defaults and return the results. They add no
device synchronization, so they work inside ``torch.compile(fullgraph=True)``
and CUDA-graph capture.

Layout: token tensors ``[num_tokens, heads, head_dim]``; pools
``[num_pages, num_kv_heads, page_size, head_dim]``; ``block_tables [num_seqs,
max_pages]``, ``seq_lens [num_seqs]`` (positions cached after this step's keys)
and ``cu_seqlens_q [num_seqs + 1]``, all int32 on the device. Query t of
sequence s sits at position ``seq_lens[s] - n_s + t``.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch

from .reference import token_positions

__all__ = [
    "prefill",
    "decode",
    "combine",
    "attention",
    "rms_norm",
    "rope",
    "cache_write",
    "attention_inputs",
    "token_positions",
    "rope_cos_sin_cache",
    "decode_num_splits",
    "key_smoothing_factors",
    "validate_metadata",
]

_ops = torch.ops.tileinfer_attn


def _check(cond: bool, msg: str) -> None:
    # RuntimeError, like the C++ checks, so callers catch one type.
    if not cond:
        raise RuntimeError(msg)


def _check_tensor(op: str, name: str, t, dim: int) -> None:
    _check(isinstance(t, torch.Tensor), f"{op}: {name} must be a tensor, got {type(t).__name__}")
    _check(t.dim() == dim, f"{op}: {name} must be {dim}-D, got shape {tuple(t.shape)}")


def _check_not_meta_mixed(op: str, **tensors) -> None:
    """Rejects tensors on the ``meta`` device next to tensors with data: a meta
    tensor has a shape but no storage, so a kernel cannot read or write it.
    All-meta calls stay allowed (shape checks through the fake kernels). The
    error names the first meta argument and the first real one."""
    meta = real = None
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            if t.device.type == "meta":
                meta = meta or name
            elif real is None:
                real = (name, t.device)
    if meta is not None and real is not None:
        raise RuntimeError(f"{op}: {meta} is on the meta device but {real[0]} is on {real[1]}; a meta tensor has "
                           f"no data, so every tensor argument must be on the same real device")


def _scale(op: str, q: torch.Tensor, scale: Optional[float]) -> float:
    if scale is None:
        return q.shape[-1] ** -0.5
    scale = float(scale)
    _check(math.isfinite(scale) and scale > 0, f"{op}: scale must be a positive finite number, got {scale}")
    return scale


def _variants(op: str, window_left, logits_soft_cap, sinks):
    """The per-layer variants, checked: (window_left, logits_soft_cap, sinks).
    The C++ ops check them again (with sinks' shape and device)."""
    _check(isinstance(window_left, (int, torch.SymInt)) and not isinstance(window_left, bool),
           f"{op}: window_left must be an int (-1: no window), got {window_left!r}")
    _check(isinstance(window_left, torch.SymInt) or window_left >= -1,
           f"{op}: window_left must be >= 0 (keys a query sees to its left) or -1 (no window), got {window_left}")
    _check(isinstance(logits_soft_cap, (int, float)) and not isinstance(logits_soft_cap, bool),
           f"{op}: logits_soft_cap must be a number (0: no soft-cap), got {logits_soft_cap!r}")
    cap = float(logits_soft_cap)
    _check(math.isfinite(cap) and cap >= 0,
           f"{op}: logits_soft_cap must be a finite number >= 0 (0: no soft-cap), got {cap}")
    _check(sinks is None or isinstance(sinks, torch.Tensor),
           f"{op}: sinks must be a float32 tensor [num_q_heads] or None, got {type(sinks).__name__}")
    return window_left, cap, sinks


def _check_max_q_len(op: str, max_q_len):
    # A host int (or a SymInt while tracing): it sizes the grid, it is not a length.
    ok = isinstance(max_q_len, torch.SymInt) or (
        isinstance(max_q_len, int) and not isinstance(max_q_len, bool) and max_q_len >= 0)
    _check(ok, f"{op}: max_q_len must be a non-negative int (a host bound of any sequence's query count), "
               f"got {max_q_len!r}")
    return max_q_len


def prefill(
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
    lse: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_smooth: Optional[torch.Tensor] = None,
    window_left: int = -1,
    logits_soft_cap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    tree_mask: Optional[torch.Tensor] = None,
):
    """FlashAttention-2-style attention of a varlen batch over the paged cache.

    Args:
        q: ``[num_tokens, num_q_heads, head_dim]`` this step's queries of all sequences, packed.
        k_cache, v_cache: ``[num_pages, num_kv_heads, page_size, head_dim]`` pools (q's dtype, or int8 / float8_e4m3fn).
        block_tables: ``[num_seqs, max_pages]`` int32 page ids of each sequence.
        seq_lens: ``[num_seqs]`` int32 positions cached after this step's keys.
        cu_seqlens_q: ``[num_seqs + 1]`` int32 prefix sums of this step's query counts.
        max_q_len: host upper bound of any sequence's query count (sizes the grid).
        scale: softmax scale, default ``head_dim ** -0.5``.
        causal: queries see positions ``<=`` their own; False: all ``seq_lens[s]`` positions.
        out: ``[num_tokens, num_q_heads, head_dim]`` written in place if given.
        lse / return_lse: also return the natural-log log-sum-exp ``[num_tokens, num_q_heads]`` fp32.
        k_scale, v_scale: fp32 scales of a quantized cache: ``[num_pages, num_kv_heads, page_size]``
            (per vector), or ``[1]`` per tensor (fp8 only).
        k_smooth: ``[num_kv_heads, head_dim]`` fp32 key smoothing factors (quantized cache only).
        window_left: sliding window: a query at position ``p`` sees keys ``[p - window_left, p]``
            (causal; non-causal: from ``p - window_left`` on); -1: no window. Pages wholly
            before a query's window are not read.
        logits_soft_cap: scores ``s`` (after ``scale``) become ``cap * tanh(s / cap)`` before
            masking (Gemma 2); 0: off.
        sinks: ``[num_q_heads]`` fp32 learned sink logits (gpt-oss), or None: each one joins its
            rows' softmax denominator as ``exp(sink)`` and nothing else; lse includes it.
        tree_mask: not taken by prefill (an error if given): tree verify steps run on
            :func:`decode` / :func:`attention`.

    Returns ``out``, or ``(out, lse)`` with ``return_lse`` or a given ``lse``.
    Rows that see no position give 0 (lse -inf, or the sink with ``sinks``);
    rows of tokens past ``cu_seqlens_q[-1]`` are not written.
    """
    _check_tensor("prefill", "q", q, 3)
    _check_not_meta_mixed("prefill", q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                          seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q, out=out, lse=lse, k_scale=k_scale,
                          v_scale=v_scale, k_smooth=k_smooth, sinks=sinks, tree_mask=tree_mask)
    max_q_len = _check_max_q_len("prefill", max_q_len)
    window_left, logits_soft_cap, sinks = _variants("prefill", window_left, logits_soft_cap, sinks)
    scale = _scale("prefill", q, scale)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None and return_lse:
        lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    _ops.prefill(out, lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
                 bool(causal), k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, tree_mask)
    return (out, lse) if lse is not None else out


def decode_num_splits(device, num_seqs: int, num_kv_heads: int) -> int:
    """Split count that ``attention`` uses for decode on ``device`` (the rule of
    csrc/include/tileinfer/decode_splits.h, called through the op of the same
    name): about two blocks per SM over the ``num_seqs * num_kv_heads``
    (sequence, KV head) pairs, rounded down, at least 1 and at most 32 (up
    to 128 for fewer than 8 pairs: at most ``256 / pairs``), for every step
    size and cache type; the CPU counts 8 "SMs". Depends on shapes only,
    never on context length."""
    device = torch.device(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
    return _ops.decode_num_splits(sms, num_seqs, num_kv_heads)


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_q_len: int,
    scale: Optional[float] = None,
    causal: bool = True,
    num_splits: Optional[int] = None,
    partial_out: Optional[torch.Tensor] = None,
    partial_lse: Optional[torch.Tensor] = None,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_smooth: Optional[torch.Tensor] = None,
    window_left: int = -1,
    logits_soft_cap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    tree_mask: Optional[torch.Tensor] = None,
):
    """Split-KV decode for steps of 1-16 queries per sequence: partial results only.

    Arguments as :func:`prefill`. Split ``i`` of a sequence with ``P`` pages
    attends pages ``[i * ceil(P / S), (i + 1) * ceil(P / S))``; a split with no
    position writes the neutral partial (out 0, lse -inf). With a window the
    ``P`` pages are counted from the page of the first key that the step's
    first query sees. ``sinks`` join split 0's partial only, so that
    :func:`combine` counts them once. Merge with :func:`combine`.

    Args:
        num_splits: ``S``; default :func:`decode_num_splits` (what ``attention`` uses).
        tree_mask: ``[num_tokens]`` int32 or None: tree verify (EAGLE-style). Bit ``j`` of
            the word of a sequence's step token ``i`` says whether it sees step token ``j``
            (the key at ``seq_lens[s] - n_s + j``); every position before the step is
            visible. Under ``causal`` a bit at ``j > i`` is ignored, as are bits at
            ``j >= n_s``. :func:`tileinfer_attn.metadata.tree_mask_words` builds (and
            checks) the words from a parent list; RoPE then takes the tree depths as
            positions (:func:`attention_inputs`' ``positions``).
        partial_out: ``[S, num_tokens, num_q_heads, head_dim]`` fp32, outputs normalized per split.
        partial_lse: ``[S, num_tokens, num_q_heads]`` fp32 natural-log lse per split.

    Returns ``(partial_out, partial_lse)``.
    """
    _check_tensor("decode", "q", q, 3)
    _check_not_meta_mixed("decode", q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                          seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q, partial_out=partial_out,
                          partial_lse=partial_lse, k_scale=k_scale, v_scale=v_scale, k_smooth=k_smooth,
                          sinks=sinks, tree_mask=tree_mask)
    max_q_len = _check_max_q_len("decode", max_q_len)
    window_left, logits_soft_cap, sinks = _variants("decode", window_left, logits_soft_cap, sinks)
    scale = _scale("decode", q, scale)
    if partial_out is not None:
        num_splits = partial_out.shape[0]
    if num_splits is None:
        _check_tensor("decode", "block_tables", block_tables, 2)
        _check_tensor("decode", "k_cache", k_cache, 4)
        num_splits = decode_num_splits(q.device, block_tables.shape[0], k_cache.shape[1])
    _check(int(num_splits) >= 1, f"decode: num_splits must be >= 1, got {num_splits}")
    t, h, d = q.shape
    if partial_out is None:
        partial_out = torch.empty(num_splits, t, h, d, dtype=torch.float32, device=q.device)
    if partial_lse is None:
        partial_lse = torch.empty(num_splits, t, h, dtype=torch.float32, device=q.device)
    _ops.decode(partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len,
                scale, bool(causal), k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, tree_mask)
    return partial_out, partial_lse


def combine(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    lse: Optional[torch.Tensor] = None,
    return_lse: bool = False,
):
    """Merges partial results: ``out = sum_i w_i out_i / sum_i w_i`` with
    ``w_i = exp(lse_i - max_j lse_j)``, in a fixed order (deterministic; docs/CONTRACT.md).

    Args:
        partial_out: ``[S, num_tokens, num_q_heads, head_dim]`` fp32 (decode splits, or
            prefill outputs over disjoint page ranges, stacked).
        partial_lse: ``[S, num_tokens, num_q_heads]`` fp32.
        out: ``[num_tokens, num_q_heads, head_dim]`` written in place if given.
        out_dtype: dtype of an allocated ``out`` (default float32).
        lse / return_lse: also return the merged lse ``[num_tokens, num_q_heads]`` fp32.

    Returns ``out``, or ``(out, lse)``. Rows whose partials are all neutral give 0 (lse -inf).
    """
    _check_tensor("combine", "partial_out", partial_out, 4)
    _check_not_meta_mixed("combine", partial_out=partial_out, partial_lse=partial_lse, out=out, lse=lse)
    if out is None:
        out = torch.empty(partial_out.shape[1:], dtype=out_dtype or torch.float32, device=partial_out.device)
    if lse is None and return_lse:
        lse = torch.empty(partial_out.shape[1:3], dtype=torch.float32, device=partial_out.device)
    _ops.combine(out, lse, partial_out, partial_lse)
    return (out, lse) if lse is not None else out


def attention(
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
) -> torch.Tensor:
    """Attention for a step over the paged cache: decode + combine for steps of
    1-16 queries per sequence (any number of query heads per KV head); with
    longer sequences in the step, decode for the sequences of <= 16 queries and
    prefill for the others. The choice depends on shapes only (``max_q_len``,
    head counts), so a captured CUDA graph takes the same path every step.

    Arguments as :func:`prefill` (the per-layer variants ``window_left``,
    ``logits_soft_cap`` and ``sinks`` included, on both paths; ``tree_mask`` as
    :func:`decode`, only with ``max_q_len <= 16``). Returns
    ``out [num_tokens, num_q_heads, head_dim]``.
    Rows of tokens past ``cu_seqlens_q[-1]`` (padding) are 0 on the decode path
    and left untouched on the prefill path.

    ``batch_invariant``: a sequence's output bits do not depend on the other
    sequences of the step, their number or its place among them (reproducible
    sampling, RL rollouts). Decode then cuts each sequence's keys by its own
    length (splits of at least 256 positions, at most 32 of them) instead of
    spreading the step over the GPU, and picks its tile from the group size
    alone; it costs speed where a step's split count differs from the default's
    (docs/PERFORMANCE.md). Without it, the bits can change with the batch,
    always within the documented accuracy.
    """
    _check_tensor("attention", "q", q, 3)
    _check_not_meta_mixed("attention", q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                          seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q, out=out, k_scale=k_scale, v_scale=v_scale,
                          k_smooth=k_smooth, sinks=sinks, tree_mask=tree_mask)
    max_q_len = _check_max_q_len("attention", max_q_len)
    window_left, logits_soft_cap, sinks = _variants("attention", window_left, logits_soft_cap, sinks)
    scale = _scale("attention", q, scale)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _ops.attention(out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale, bool(causal),
                   k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, tree_mask,
                   bool(batch_invariant))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-head RMSNorm over the last dim (Qwen3's q_norm / k_norm): fp32 math, the
    normalized value rounded to x's dtype, then times ``weight`` in x's dtype.

    Args:
        x: ``[num_tokens, num_heads, head_dim]``; weight: ``[head_dim]`` of x's dtype.
        out: like x, written in place if given (may be x itself).
    """
    _check_tensor("rms_norm", "x", x, 3)
    _check_not_meta_mixed("rms_norm", x=x, weight=weight, out=out)
    _check(float(eps) >= 0, f"rms_norm: eps must be >= 0, got {eps}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _ops.rms_norm(out, x, weight, float(eps))
    return out


def rope_cos_sin_cache(rotary_dim: int, max_position: int, theta: float = 1e6, device=None) -> torch.Tensor:
    """The ``[max_position, rotary_dim]`` fp32 cos/sin cache of :func:`rope`: row p holds
    ``cos(p * f)`` then ``sin(p * f)`` for the ``rotary_dim / 2`` frequencies
    ``f_i = theta ** (-2 i / rotary_dim)`` (computed in float64, rounded once;
    theta 1e6 as Qwen3)."""
    _check(rotary_dim > 0 and rotary_dim % 2 == 0, f"rope_cos_sin_cache: rotary_dim must be even, got {rotary_dim}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(device)


def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
         rotary_dim: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Neox (rotate-half) rotary embedding of the first ``rotary_dim`` channels (the
    rest copied), fp32 math rounded once.

    Args:
        x: ``[num_tokens, num_heads, head_dim]``.
        positions: ``[num_tokens]`` int32/int64, each in ``[0, max_position)``
            (:func:`token_positions` computes them from a step's metadata).
        cos_sin_cache: ``[max_position, rotary_dim]`` fp32, cos then sin (:func:`rope_cos_sin_cache`).
        rotary_dim: default ``cos_sin_cache.shape[1]``.
        out: like x, written in place if given (may be x itself).
    """
    _check_tensor("rope", "x", x, 3)
    _check_not_meta_mixed("rope", x=x, positions=positions, cos_sin_cache=cos_sin_cache, out=out)
    _check_tensor("rope", "cos_sin_cache", cos_sin_cache, 2)
    if rotary_dim is None:
        rotary_dim = cos_sin_cache.shape[1]
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _ops.rope(out, x, positions, cos_sin_cache, int(rotary_dim))
    return out


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
    """Writes this step's keys and values into their pages, in place: token t of
    sequence s goes to position ``seq_lens[s] - n_s + t``. Positions whose page
    id lies outside the pool are skipped; pages of other sequences are never
    touched (unless the block table shares them).

    Args:
        k, v: ``[num_tokens, num_kv_heads, head_dim]`` (the pool's dtype; bf16/fp16 for a quantized pool).
        k_scale, v_scale, k_smooth: quantized pools only: the write quantizes each vector
            symmetrically (keys divided by ``k_smooth`` first), saturating: per vector
            (``[num_pages, num_kv_heads, page_size]``) scale = amax / 127 (int8) or
            amax / 448 (float8_e4m3fn), rounded up to 4 or 7 significant bits
            (``reference.round_scale_up``), stored; per tensor (fp8, ``[1]``) the given scales.
    """
    _check_tensor("cache_write", "k", k, 3)
    _check_not_meta_mixed("cache_write", k_cache=k_cache, v_cache=v_cache, k=k, v=v, block_tables=block_tables,
                          seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q, k_scale=k_scale, v_scale=v_scale,
                          k_smooth=k_smooth)
    _ops.cache_write(k_cache, v_cache, k, v, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth)


def attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rotary_dim: Optional[int] = None,
    q_norm_weight: Optional[torch.Tensor] = None,
    k_norm_weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    q_out: Optional[torch.Tensor] = None,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_smooth: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Fused inputs of attention: optional per-head RMSNorm of q and k, RoPE at
    each token's position (from the step's metadata), queries into ``q_out``,
    keys (normed, rotated) and values into the cache. Bit-identical to
    :func:`rms_norm` + :func:`rope` + :func:`cache_write`.

    Args:
        q: ``[num_tokens, num_q_heads, head_dim]``; k, v: ``[num_tokens, num_kv_heads, head_dim]``.
        cos_sin_cache, rotary_dim: as :func:`rope`.
        q_norm_weight, k_norm_weight: ``[head_dim]`` of q's dtype, or None (no norm).
        q_out: like q, written in place if given. Rows of tokens past ``cu_seqlens_q[-1]``
            are not written.
        positions: ``[num_tokens]`` int32/int64 rotary positions, or None (each token's
            position in its sequence). A tree verify step rotates its drafts by their
            depth in the tree while their cache slots stay consecutive
            (:func:`tileinfer_attn.metadata.tree_positions`).

    Returns ``q_out``.
    """
    _check_tensor("attention_inputs", "q", q, 3)
    _check_not_meta_mixed("attention_inputs", q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache,
                          block_tables=block_tables, seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q,
                          cos_sin_cache=cos_sin_cache, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
                          q_out=q_out, k_scale=k_scale, v_scale=v_scale, k_smooth=k_smooth, positions=positions)
    _check_tensor("attention_inputs", "cos_sin_cache", cos_sin_cache, 2)
    if rotary_dim is None:
        rotary_dim = cos_sin_cache.shape[1]
    if q_out is None:
        q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _ops.attention_inputs(q_out, k_cache, v_cache, q, k, v, block_tables, seq_lens, cu_seqlens_q, cos_sin_cache,
                          int(rotary_dim), q_norm_weight, k_norm_weight, float(eps), k_scale, v_scale, k_smooth,
                          positions)
    return q_out


def key_smoothing_factors(keys: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """Per-channel key smoothing factors for a quantized (int8, fp8) cache, from sample keys
    ``[num_samples, num_kv_heads, head_dim]`` (e.g. a calibration prompt's keys
    after RoPE): ``s = amax ** alpha`` over the samples, scaled to a geometric
    mean of 1 per head; ``[num_kv_heads, head_dim]`` fp32.

    Keys are divided by ``s`` before quantization and queries multiplied by it
    inside the kernels, which cancels in the scores: an outlier channel then no
    longer sets every key vector's scale. alpha = 1
    equalizes the channels' ranges; the queries stay in bf16/fp16, so nothing on
    their side is quantized."""
    _check(keys.dim() == 3, f"key_smoothing_factors: keys must be 3-D [num_samples, num_kv_heads, head_dim], "
                            f"got shape {tuple(keys.shape)}")
    _check(keys.shape[0] > 0, "key_smoothing_factors: keys must hold at least one sample")
    amax = keys.detach().float().abs().amax(0).clamp_min(1e-6)
    s = amax.pow(alpha)
    return (s / s.log().mean(-1, keepdim=True).exp()).contiguous()


def validate_metadata(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    num_pages: int,
    page_size: int,
    num_tokens: Optional[int] = None,
) -> List[str]:
    """Reports what the kernels would silently clamp or skip.

    The ops cannot check device-resident metadata without a sync, so on the GPU
    they stay inside the pools for any contents and skip what is out of range;
    this debugging helper (it copies the metadata to the host) says what was
    wrong. Returns human-readable problems, each naming the sequence and the
    entry; an empty list when the metadata is valid:

    - ``seq_lens[s]`` negative or beyond ``max_pages * page_size``;
    - page ids outside ``[0, num_pages)`` among the pages sequence s uses;
    - ``cu_seqlens_q`` not starting at 0, decreasing, or past ``num_tokens``;
    - a sequence with more queries this step than positions (``n_s > seq_lens[s]``).
    """
    problems: List[str] = []
    if block_tables.dim() != 2:
        return [f"block_tables must be 2-D [num_seqs, max_pages], got shape {tuple(block_tables.shape)}"]
    num_seqs, max_pages = block_tables.shape
    if seq_lens.dim() != 1 or seq_lens.shape[0] != num_seqs:
        problems.append(f"seq_lens must have shape [{num_seqs}] (one length per block_tables row), "
                        f"got {tuple(seq_lens.shape)}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] != num_seqs + 1:
        problems.append(f"cu_seqlens_q must have shape [{num_seqs + 1}] (num_seqs + 1), "
                        f"got {tuple(cu_seqlens_q.shape)}")
    if problems:
        return problems
    tables = block_tables.detach().to("cpu", torch.int64).tolist()
    lens = seq_lens.detach().to("cpu", torch.int64).tolist()
    cu = cu_seqlens_q.detach().to("cpu", torch.int64).tolist()
    cap = max_pages * page_size

    for s, length in enumerate(lens):
        if length < 0:
            problems.append(f"sequence {s}: seq_lens[{s}] = {length} is negative (read as 0)")
        elif length > cap:
            problems.append(f"sequence {s}: seq_lens[{s}] = {length} exceeds what its block_tables row holds "
                            f"({max_pages} pages x {page_size} = {cap}; read as {cap})")
        used = (min(max(length, 0), cap) + page_size - 1) // page_size
        for j in range(used):
            page = tables[s][j]
            if not 0 <= page < num_pages:
                first, last = j * page_size, min((j + 1) * page_size, length) - 1
                problems.append(f"sequence {s}: block_tables[{s}, {j}] = {page} is outside the pool "
                                f"[0, {num_pages}) (positions {first}-{last} are skipped)")

    if cu[0] != 0:
        problems.append(f"cu_seqlens_q[0] = {cu[0]}, expected 0")
    for s in range(num_seqs):
        n = cu[s + 1] - cu[s]
        if n < 0:
            problems.append(f"sequence {s}: cu_seqlens_q decreases (cu_seqlens_q[{s + 1}] = {cu[s + 1]} "
                            f"< cu_seqlens_q[{s}] = {cu[s]})")
        elif n > max(lens[s], 0):
            problems.append(f"sequence {s}: {n} queries this step (cu_seqlens_q[{s + 1}] - cu_seqlens_q[{s}]) "
                            f"but seq_lens[{s}] = {lens[s]} positions (seq_lens counts this step's keys too)")
    if num_tokens is not None:
        for i, c in enumerate(cu):
            if c > num_tokens:
                problems.append(f"cu_seqlens_q[{i}] = {c} is past num_tokens = {num_tokens}")
                break
    return problems
