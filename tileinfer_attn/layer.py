"""The attention module a vLLM-style decoder layer calls: ``attn(q, k, v, kv_cache, metadata)``.

It writes this step's keys and values into the paged cache and attends the
queries to every cached position of their sequence (or, with a sliding window,
to the last ``window_left + 1`` positions up to each query's own). With q/k
norms or RoPE (Qwen3), the fused ``attention_inputs`` op does norm + rotary +
cache write in two launches; otherwise ``cache_write``. ``backend="reference"``
runs the same step through tileinfer_attn.reference (eager PyTorch) for
comparisons.

The per-layer attention variants are constants of the module, the same on
every step (so a captured CUDA graph keeps them): ``window_left`` (Mistral,
Gemma 2 / 3 and gpt-oss local layers), ``logits_soft_cap`` (Gemma 2) and
``sinks`` (gpt-oss: a learned logit per query head, a parameter here). A tree
verify step comes with the metadata instead (``AttentionMetadata.tree_mask``
and ``rope_positions``, from ``AttentionMetadata.build(tree_parents=...)``):
the tree mask goes to attention, the positions (tree depths) to RoPE.
``batch_invariant=True`` makes each sequence's output bits independent of the
other sequences of the step (``attention``'s argument of that name).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from . import reference
from .metadata import AttentionMetadata
from .ops import rope_cos_sin_cache  # noqa: F401  (re-exported: the layer's cos/sin table)

__all__ = ["PagedAttention", "rope_cos_sin_cache"]


class PagedAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: Optional[float] = None,
        qk_norm: bool = False,
        eps: float = 1e-6,
        cos_sin_cache: Optional[torch.Tensor] = None,
        rotary_dim: Optional[int] = None,
        backend: str = "tileinfer",
        window_left: int = -1,
        logits_soft_cap: float = 0.0,
        sinks: bool = False,
        batch_invariant: bool = False,
    ):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if backend not in ("tileinfer", "reference"):
            raise ValueError(f"backend must be 'tileinfer' or 'reference', got {backend!r}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.eps = eps
        self.backend = backend
        # Qwen3's q_norm / k_norm weights (per head dim), when the model has them.
        self.q_norm = nn.Parameter(torch.ones(head_dim)) if qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(head_dim)) if qk_norm else None
        if cos_sin_cache is not None:
            self.register_buffer("cos_sin_cache", cos_sin_cache, persistent=False)
        else:
            self.cos_sin_cache = None
        self.rotary_dim = rotary_dim if rotary_dim is not None else head_dim
        if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
            raise ValueError(f"window_left must be an int >= 0 (keys a query sees to its left) or -1 (no window), "
                             f"got {window_left!r}")
        if not logits_soft_cap >= 0:
            raise ValueError(f"logits_soft_cap must be >= 0 (0: no soft-cap), got {logits_soft_cap!r}")
        self.window_left = window_left
        self.logits_soft_cap = float(logits_soft_cap)
        # gpt-oss's learned sinks: one logit per query head (loaded with the
        # model's weights), handed to the ops as float32 whatever the model's dtype.
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None
        self.batch_invariant = bool(batch_invariant)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) must move the cos/sin cache but keep it float32 (the ops
        # read it in fp32; rounding it to bf16 would cost RoPE its accuracy).
        cs = self._buffers.pop("cos_sin_cache", None)
        super()._apply(fn, recurse)
        if cs is not None:
            self._buffers["cos_sin_cache"] = cs.to(fn(cs[:1]).device)
        return self

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim] or [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim] (views of a packed qkv are fine)
        v: torch.Tensor,
        kv_cache: Sequence[torch.Tensor],  # (k_cache, v_cache), quantized: (+ k_scale, v_scale[, k_smooth])
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        k_scale, v_scale, k_smooth = (tuple(kv_cache[2:]) + (None, None, None))[:3]
        m = metadata
        if self.backend == "reference":
            return self._reference(q, k, v, k_cache, v_cache, k_scale, v_scale, k_smooth, m).reshape(
                t, self.num_heads * self.head_dim)
        ops = torch.ops.tileinfer_attn
        if self.cos_sin_cache is not None or self.q_norm is not None:
            if self.cos_sin_cache is None:
                raise ValueError("PagedAttention with qk_norm needs cos_sin_cache (norm and RoPE are fused)")
            q_in = q
            q = torch.empty_like(q_in, memory_format=torch.contiguous_format)
            ops.attention_inputs(q, k_cache, v_cache, q_in, k, v, m.block_tables, m.seq_lens, m.cu_seqlens_q,
                                 self.cos_sin_cache, self.rotary_dim, self.q_norm, self.k_norm, self.eps,
                                 k_scale, v_scale, k_smooth, m.rope_positions)
        else:
            ops.cache_write(k_cache, v_cache, k, v, m.block_tables, m.seq_lens, m.cu_seqlens_q,
                            k_scale, v_scale, k_smooth)
        out = torch.empty(t, self.num_heads, self.head_dim, dtype=q.dtype, device=q.device)
        ops.attention(out, q, k_cache, v_cache, m.block_tables, m.seq_lens, m.cu_seqlens_q, m.max_q_len,
                      self.scale, m.causal, k_scale, v_scale, k_smooth, self.window_left, self.logits_soft_cap,
                      self._sinks(), m.tree_mask, self.batch_invariant)
        return out.view(t, self.num_heads * self.head_dim)  # explicit: -1 is ambiguous for t = 0

    def _sinks(self) -> Optional[torch.Tensor]:
        return None if self.sinks is None else self.sinks.float()

    def _reference(self, q, k, v, k_cache, v_cache, k_scale, v_scale, k_smooth, m):
        """The same step in eager PyTorch (tileinfer_attn.reference)."""
        if self.q_norm is not None:
            q = reference.rms_norm(q, self.q_norm.to(q.dtype), self.eps)
            k = reference.rms_norm(k, self.k_norm.to(k.dtype), self.eps)
        if self.cos_sin_cache is not None:
            pos = m.positions(q.shape[0]) if m.rope_positions is None else m.rope_positions
            pos = pos.clamp_min(0)
            q = reference.rope(q, pos, self.cos_sin_cache, self.rotary_dim)
            k = reference.rope(k, pos, self.cos_sin_cache, self.rotary_dim)
        reference.cache_write(k_cache, v_cache, k, v, m.block_tables, m.seq_lens, m.cu_seqlens_q,
                              k_scale, v_scale, k_smooth)
        return reference.paged_attention(q, k_cache, v_cache, m.block_tables, m.seq_lens, m.cu_seqlens_q,
                                         m.max_q_len, self.scale, m.causal, k_scale=k_scale, v_scale=v_scale,
                                         k_smooth=k_smooth, window_left=self.window_left,
                                         logits_soft_cap=self.logits_soft_cap, sinks=self._sinks(),
                                         tree_mask=m.tree_mask)
