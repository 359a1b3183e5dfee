"""A small Qwen3-style decoder (random weights, no downloads) over the paged cache.

Flat token batches as a serving engine runs them: ``model(input_ids, kv_caches,
metadata)`` takes this step's tokens of every scheduled sequence ([num_tokens])
and returns their logits. The layer structure follows Qwen3: RMSNorm ->
qkv projection -> q/k RMSNorm + RoPE + cache write -> paged attention -> o_proj,
then RMSNorm -> SwiGLU MLP. ``backend="reference"`` swaps the attention for the
eager reference, so the same weights give the comparison model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch
from torch import nn

from ..cache import QUANT_DTYPES
from ..layer import PagedAttention, rope_cos_sin_cache
from ..metadata import AttentionMetadata

__all__ = ["Qwen3Config", "Qwen3Model"]


@dataclass
class Qwen3Config:
    vocab_size: int = 1024
    hidden_size: int = 512
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1024
    rope_theta: float = 1e6
    rms_eps: float = 1e-6
    max_position: int = 4096


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm over the hidden size (eager, as HF computes it)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, cos_sin: torch.Tensor, backend: str):
        super().__init__()
        d, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.q_size, self.kv_size = hq * d, hkv * d
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (hq + 2 * hkv) * d, bias=False)
        self.attn = PagedAttention(hq, hkv, d, qk_norm=True, eps=cfg.rms_eps, cos_sin_cache=cos_sin,
                                   backend=backend)
        self.o_proj = nn.Linear(hq * d, cfg.hidden_size, bias=False)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, kv_cache, metadata):
        qkv = self.qkv_proj(self.input_norm(x))
        # Views into the packed projection: the attention ops take strided heads.
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        x = x + self.o_proj(self.attn(q, k, v, kv_cache, metadata))
        gate, up = self.gate_up(self.post_norm(x)).chunk(2, dim=-1)
        return x + self.down(nn.functional.silu(gate) * up)


class Qwen3Model(nn.Module):
    def __init__(self, cfg: Qwen3Config, backend: str = "tileinfer"):
        super().__init__()
        self.cfg = cfg
        cos_sin = rope_cos_sin_cache(cfg.head_dim, cfg.max_position, cfg.rope_theta)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, cos_sin, backend) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @torch.no_grad()
    def randomize_(self, seed: int = 0) -> "Qwen3Model":
        """Random weights with the scales of a trained model (keeps activations O(1))."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5))
        return self

    def forward(self, input_ids: torch.Tensor, kv_caches: Sequence[Sequence[torch.Tensor]],
                metadata: AttentionMetadata) -> torch.Tensor:
        """input_ids [num_tokens] -> logits [num_tokens, vocab_size] (float32)."""
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, kv, metadata)
        return self.lm_head(self.norm(x)).float()

    def set_backend(self, backend: str) -> "Qwen3Model":
        for layer in self.layers:
            layer.attn.backend = backend
        return self

    def new_kv_caches(self, num_pages: int, page_size: int, dtype=None, device=None,
                      scale: str = "vector") -> List[tuple]:
        """One (k_cache, v_cache) pair of pools per layer; a quantized dtype
        (int8, float8_e4m3fn) adds their fp32 scales, (k_cache, v_cache,
        k_scale, v_scale): per vector (written by each step), or with
        ``scale="tensor"`` (fp8) one per pool, ones until the caller sets them."""
        p = next(self.parameters())
        dtype, device = dtype or p.dtype, device or p.device
        shape = (num_pages, self.cfg.num_kv_heads, page_size, self.cfg.head_dim)
        quantized = dtype in QUANT_DTYPES
        scale_shape = shape[:3] if scale == "vector" else (1,)

        def layer():
            pools = (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            if not quantized:
                return pools
            return pools + tuple(torch.ones(scale_shape, dtype=torch.float32, device=device) for _ in range(2))
        return [layer() for _ in range(self.cfg.num_layers)]
