"""Fake (meta) implementations of every op, for torch.compile and opcheck.

The ops are out-style: they write into tensors they are given and return
nothing, so a fake only checks what it cheaply can (ranks, dtypes, matching
sizes) and returns None. The C++ checks (csrc/checks.cpp) stay the full
contract; these catch shape mistakes at trace time with the same kind of
message. csrc/torch_bindings.cpp names this module (set_python_module), so
torch imports it whenever a fake is needed.
"""
from __future__ import annotations

import functools
import inspect

import torch

_FLOAT = (torch.bfloat16, torch.float16, torch.float32)


def _check(cond, msg: str) -> None:
    torch._check(cond, lambda: msg)


def _register_fake(op: str):
    """torch.library.register_fake for tileinfer_attn::<op>, behind the check
    that no tensor on the meta device sits among tensors with data: torch
    sends such a call here (the Meta kernel), past the C++ checks, and a fake
    would otherwise accept it. Under torch.compile every tensor is a fake
    tensor on its real device, so the check never fires there."""
    def register(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def fake(*args, **kwargs):
            from .ops import _check_not_meta_mixed
            _check_not_meta_mixed(op, **sig.bind(*args, **kwargs).arguments)
            return fn(*args, **kwargs)
        torch.library.register_fake(f"tileinfer_attn::{op}")(fake)
        return fn
    return register


def _check_token(op: str, name: str, t: torch.Tensor, like: torch.Tensor = None, dtype=None) -> None:
    _check(t.dim() == 3, f"{op}: {name} must be 3-D [num_tokens, num_heads, head_dim], got shape {tuple(t.shape)}")
    if like is not None:
        for i in range(3):
            _check(t.shape[i] == like.shape[i], f"{op}: {name} must have shape {tuple(like.shape)}, "
                                                f"got {tuple(t.shape)}")
    if dtype is not None:
        _check(t.dtype == dtype, f"{op}: {name} must be {dtype}, got {t.dtype}")


# The quantized cache types (int8, float8_e4m3fn): tile_table.h's list.
_QUANT_DTYPES = tuple(getattr(torch, name) for name in torch.ops.tileinfer_attn.supported_dtypes("quant"))


def _check_cache(op: str, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale) -> None:
    _check(k_cache.dim() == 4, f"{op}: k_cache must be 4-D [num_pages, num_kv_heads, page_size, head_dim], "
                               f"got shape {tuple(k_cache.shape)}")
    _check(v_cache.dim() == 4, f"{op}: v_cache must have the shape of k_cache")
    _check(v_cache.dtype == k_cache.dtype, f"{op}: v_cache must have the dtype of k_cache")
    _check(block_tables.dim() == 2 and block_tables.dtype == torch.int32,
           f"{op}: block_tables must be 2-D int32 [num_seqs, max_pages]")
    _check(seq_lens.dim() == 1 and seq_lens.dtype == torch.int32, f"{op}: seq_lens must be 1-D int32")
    _check(cu_seqlens_q.dim() == 1 and cu_seqlens_q.dtype == torch.int32, f"{op}: cu_seqlens_q must be 1-D int32")
    _check(seq_lens.shape[0] == block_tables.shape[0], f"{op}: seq_lens must have one entry per block_tables row")
    _check(cu_seqlens_q.shape[0] == block_tables.shape[0] + 1,
           f"{op}: cu_seqlens_q must have num_seqs + 1 entries")
    _check(k_cache.dtype != torch.float8_e5m2,
           f"{op}: k_cache: float8_e5m2 pools are not supported (the fp8 cache is float8_e4m3fn)")
    if k_cache.dtype in _QUANT_DTYPES:
        _check(k_scale is not None and v_scale is not None,
               f"{op}: k_scale and v_scale are required with a quantized cache ({k_cache.dtype})")
        _check(k_scale.dtype == torch.float32 and v_scale.dtype == torch.float32,
               f"{op}: k_scale and v_scale must be float32, got {k_scale.dtype} and {v_scale.dtype}")


def _check_attention(op, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale,
                     window_left=-1, logits_soft_cap=0.0, sinks=None, tree_mask=None, max_q_len=0) -> None:
    _check_cache(op, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale)
    _check_token(op, "q", q)
    _check(q.dtype in _FLOAT, f"{op}: q must be bfloat16, float16 or float32, got {q.dtype}")
    _check(q.shape[2] == k_cache.shape[3], f"{op}: q must have the head_dim of the cache ({k_cache.shape[3]})")
    _check(window_left >= -1, f"{op}: window_left must be >= 0 or -1 (no window), got {window_left}")
    _check(logits_soft_cap >= 0, f"{op}: logits_soft_cap must be >= 0 (0: no soft-cap), got {logits_soft_cap}")
    if sinks is not None:
        _check(sinks.dim() == 1 and sinks.dtype == torch.float32,
               f"{op}: sinks must be 1-D float32 [num_q_heads], got {sinks.dtype} of shape {tuple(sinks.shape)}")
        _check(sinks.shape[0] == q.shape[1], f"{op}: sinks must have shape [{q.shape[1]}] (num_q_heads), "
                                              f"got {tuple(sinks.shape)}")
    if tree_mask is not None:
        _check(op != "prefill", "prefill: tree_mask is not supported here: tree verify steps (at most 16 queries "
                                "per sequence) run on decode or attention")
        _check(max_q_len <= 16, f"{op}: tree_mask is for steps of at most 16 queries per sequence (tree verify), "
                                f"got max_q_len = {max_q_len}")
        _check(tree_mask.dim() == 1 and tree_mask.dtype == torch.int32,
               f"{op}: tree_mask must be 1-D int32 [num_tokens], got {tree_mask.dtype} of shape "
               f"{tuple(tree_mask.shape)}")
        _check(tree_mask.shape[0] == q.shape[0], f"{op}: tree_mask must have shape [{q.shape[0]}] (num_tokens), "
                                                 f"got {tuple(tree_mask.shape)}")


@_register_fake("prefill")
def _prefill(out, lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale, causal,
             k_scale=None, v_scale=None, k_smooth=None, window_left=-1, logits_soft_cap=0.0, sinks=None,
             tree_mask=None):
    _check_attention("prefill", q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale,
                     window_left, logits_soft_cap, sinks, tree_mask, max_q_len)
    _check_token("prefill", "out", out, like=q, dtype=q.dtype)
    if lse is not None:
        _check(lse.dim() == 2 and lse.dtype == torch.float32, "prefill: lse must be 2-D float32")
    return None


@_register_fake("decode")
def _decode(partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
            causal, k_scale=None, v_scale=None, k_smooth=None, window_left=-1, logits_soft_cap=0.0, sinks=None,
            tree_mask=None):
    _check_attention("decode", q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale,
                     window_left, logits_soft_cap, sinks, tree_mask, max_q_len)
    _check(partial_out.dim() == 4 and partial_out.dtype == torch.float32,
           "decode: partial_out must be 4-D float32 [num_splits, num_tokens, num_q_heads, head_dim]")
    _check(partial_lse.dim() == 3 and partial_lse.dtype == torch.float32,
           "decode: partial_lse must be 3-D float32 [num_splits, num_tokens, num_q_heads]")
    return None


@_register_fake("combine")
def _combine(out, lse, partial_out, partial_lse):
    _check(partial_out.dim() == 4 and partial_out.dtype == torch.float32,
           "combine: partial_out must be 4-D float32 [num_splits, num_tokens, num_q_heads, head_dim]")
    _check(partial_lse.dim() == 3 and partial_lse.dtype == torch.float32,
           "combine: partial_lse must be 3-D float32 [num_splits, num_tokens, num_q_heads]")
    _check_token("combine", "out", out)
    _check(out.dtype in _FLOAT, f"combine: out must be bfloat16, float16 or float32, got {out.dtype}")
    if lse is not None:
        _check(lse.dim() == 2 and lse.dtype == torch.float32, "combine: lse must be 2-D float32")
    return None


@_register_fake("attention")
def _attention(out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale, causal,
               k_scale=None, v_scale=None, k_smooth=None, window_left=-1, logits_soft_cap=0.0, sinks=None,
               tree_mask=None, batch_invariant=False):
    _check_attention("attention", q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale,
                     window_left, logits_soft_cap, sinks, tree_mask, max_q_len)
    _check_token("attention", "out", out, like=q, dtype=q.dtype)
    return None


@_register_fake("rms_norm")
def _rms_norm(out, x, weight, eps):
    _check_token("rms_norm", "x", x)
    _check_token("rms_norm", "out", out, like=x, dtype=x.dtype)
    _check(weight.dim() == 1, "rms_norm: weight must be 1-D [head_dim]")
    return None


@_register_fake("rope")
def _rope(out, x, positions, cos_sin_cache, rotary_dim):
    _check_token("rope", "x", x)
    _check_token("rope", "out", out, like=x, dtype=x.dtype)
    _check(positions.dim() == 1, "rope: positions must be 1-D [num_tokens]")
    _check(cos_sin_cache.dim() == 2 and cos_sin_cache.dtype == torch.float32,
           "rope: cos_sin_cache must be 2-D float32 [max_position, rotary_dim]")
    return None


@_register_fake("cache_write")
def _cache_write(k_cache, v_cache, k, v, block_tables, seq_lens, cu_seqlens_q, k_scale=None, v_scale=None,
                 k_smooth=None):
    _check_cache("cache_write", k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale)
    _check_token("cache_write", "k", k)
    _check_token("cache_write", "v", v, like=k, dtype=k.dtype)
    return None


@_register_fake("attention_inputs")
def _attention_inputs(q_out, k_cache, v_cache, q, k, v, block_tables, seq_lens, cu_seqlens_q, cos_sin_cache,
                      rotary_dim, q_norm_weight, k_norm_weight, eps, k_scale=None, v_scale=None, k_smooth=None,
                      positions=None):
    _check_cache("attention_inputs", k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale)
    _check_token("attention_inputs", "q", q)
    _check_token("attention_inputs", "q_out", q_out, like=q, dtype=q.dtype)
    _check_token("attention_inputs", "k", k)
    _check_token("attention_inputs", "v", v, like=k, dtype=k.dtype)
    _check(cos_sin_cache.dim() == 2, "attention_inputs: cos_sin_cache must be 2-D [max_position, rotary_dim]")
    if positions is not None:
        _check(positions.dim() == 1 and positions.dtype in (torch.int32, torch.int64),
               f"attention_inputs: positions must be 1-D int32 or int64 [num_tokens], got {positions.dtype} of "
               f"shape {tuple(positions.shape)}")
        _check(positions.shape[0] == q.shape[0], f"attention_inputs: positions must have shape [{q.shape[0]}] "
                                                 f"(num_tokens), got {tuple(positions.shape)}")
    return None
