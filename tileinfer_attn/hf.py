"""Hugging Face transformers integration: our attention behind transformers' AttentionInterface.

    import tileinfer_attn.hf
    tileinfer_attn.hf.register()              # registers "tileinfer"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="tileinfer")

transformers keeps its own (contiguous) KV cache; each call lays the keys and
values it passes out as pages of ``page_size`` positions and runs the
``attention`` op over them (prefill kernel for prompts, decode kernels for
steps of <= 16 tokens). Supported: causal self-attention of batches without
padding (every sequence of the batch has the same length), as in generation
from equal-length prompts, with the per-layer variants transformers passes to
attention functions: ``sliding_window`` (Mistral, Gemma 2 / 3, gpt-oss),
``softcap`` (Gemma 2's attention logit soft-capping) and ``s_aux`` (gpt-oss's
learned sinks). Padded batches are rejected with an error.
"""
from __future__ import annotations

import torch

__all__ = ["register", "tileinfer_attention_forward", "window_left_of"]

NAME = "tileinfer"


def _to_pages(x: torch.Tensor, page_size: int) -> torch.Tensor:
    """[B, H, S, D] -> pool [B * ceil(S / page_size), H, page_size, D] (sequence b owns pages b*P .. b*P+P-1)."""
    b, h, s, d = x.shape
    p = -(-s // page_size)
    if p * page_size != s:
        x = torch.nn.functional.pad(x, (0, 0, 0, p * page_size - s))
    return x.view(b, h, p, page_size, d).permute(0, 2, 1, 3, 4).reshape(b * p, h, page_size, d)


def window_left_of(sliding_window) -> int:
    """Our window_left for transformers' ``sliding_window``: transformers lets
    the query at q see key kv when ``q - sliding_window < kv <= q``
    (masking_utils.sliding_window_overlay), i.e. ``sliding_window`` positions
    including its own, so window_left = sliding_window - 1 (the left window
    size vLLM and flash-attention take for the same models). None (a
    full-attention layer): -1."""
    if sliding_window is None:
        return -1
    sliding_window = int(sliding_window)
    if sliding_window <= 0:
        raise ValueError(f"tileinfer attention: sliding_window must be positive or None, got {sliding_window}")
    return sliding_window - 1


def tileinfer_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                                page_size: int = 64, sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """query [B, Hq, S, D], key/value [B, Hkv, S_kv, D] -> ([B, S, Hq, D], None).

    ``sliding_window``: transformers' window (``window_left_of``); ``softcap``:
    the logit soft-cap (None or 0: off); ``s_aux``: the sinks, [Hq], any float
    dtype (converted to float32)."""
    if dropout:
        raise ValueError("tileinfer attention is for inference: dropout must be 0")
    b, hq, s, d = query.shape
    s_kv = key.shape[2]
    dev = query.device
    window_left = window_left_of(sliding_window)
    if attention_mask is not None:
        # Only the plain causal mask (and its sliding-window form) can be
        # honoured: positions come from lengths.
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        expected = torch.ones(s, s_kv, dtype=torch.bool, device=dev).tril(s_kv - s)
        if window_left >= 0:
            expected &= ~torch.ones(s, s_kv, dtype=torch.bool, device=dev).tril(s_kv - s - window_left - 1)
        if not bool((allowed[..., -s_kv:] == expected).all()):
            raise ValueError("tileinfer attention supports causal batches without padding only")
    pages = -(-s_kv // page_size)
    k_cache = _to_pages(key, page_size)
    v_cache = _to_pages(value, page_size)
    block_tables = torch.arange(b * pages, dtype=torch.int32, device=dev).view(b, pages)
    seq_lens = torch.full((b,), s_kv, dtype=torch.int32, device=dev)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=dev)
    q = query.transpose(1, 2).reshape(b * s, hq, d)
    out = torch.empty_like(q)
    scale = d ** -0.5 if scaling is None else float(scaling)
    sinks = None if s_aux is None else s_aux.detach().to(device=dev, dtype=torch.float32).contiguous()
    torch.ops.tileinfer_attn.attention(out, q, k_cache, v_cache, block_tables, seq_lens, cu, s, scale, True,
                                       None, None, None, window_left, float(softcap or 0.0), sinks)
    return out.view(b, s, hq, d), None


def register(name: str = NAME) -> str:
    """Registers the attention (and, where transformers has one, a mask function)
    under `name`; returns the name to pass as attn_implementation."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, tileinfer_attention_forward)
    try:  # transformers >= 4.53 builds masks per implementation; ours only needs the sdpa-style one
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionMaskInterface.register(name, sdpa_mask)
    except ImportError:
        pass
    return name
