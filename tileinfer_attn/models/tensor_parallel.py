"""Tensor parallelism for the Qwen3-style model, split over ranks as vLLM splits it.

``shard_qwen3(model, rank, world_size)`` returns rank ``rank``'s part of a
model as a smaller :class:`Qwen3Model` of the same class:

- attention: the qkv projection is column-parallel (each rank computes its
  ``num_heads / world_size`` query heads and ``num_kv_heads / world_size``
  KV heads), so each rank's paged cache holds only its own KV heads
  (a ``PagedKVCache`` built with ``cfg.num_kv_heads`` of the shard);
  q / k norms are per head dim and replicated; the o projection is
  row-parallel: each rank multiplies its heads' slice of the input features
  and an all-reduce sums the partial products (:class:`RowParallelLinear`);
- MLP: likewise, gate and up column-parallel (each rank its slice of the
  intermediate features, gate and up sliced alike so that the SwiGLU product
  stays local), down row-parallel with an all-reduce;
- embedding, the norms over the hidden size and the LM head are replicated
  (vLLM splits the vocabulary too; replicating it keeps the logits whole on
  every rank and does not change what the attention sees).

Query head ``h`` attends KV head ``h // group``; giving each rank a contiguous
block of query heads and the matching block of KV heads keeps every query
head with its KV head on the same rank. The number of KV heads must divide by
the world size (vLLM replicates KV heads when there are fewer than ranks;
this helper does not).

After each all-reduce every rank holds the same hidden states, so the
attention metadata (block tables, lengths) is the same on every rank when
each rank's cache sees the same schedule: the page allocator is deterministic.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .qwen3 import Qwen3Model

__all__ = ["RowParallelLinear", "shard_qwen3"]


class RowParallelLinear(nn.Linear):
    """A linear layer whose input features are split over the ranks of ``group``:
    ``weight`` holds this rank's columns, ``forward`` multiplies this rank's
    slice of the input and sums the ranks' partial products with an all-reduce
    (in the activation dtype, as vLLM's RowParallelLinear does). Same parameter
    names as ``nn.Linear``. No bias (a bias would be added once, after the sum)."""

    def __init__(self, in_features: int, out_features: int, group: Optional[dist.ProcessGroup] = None,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        dist.all_reduce(y, group=self.group)
        return y


def _block(t: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous block of ``world_size`` equal blocks of ``t`` along ``dim``."""
    return t.chunk(world_size, dim=dim)[rank]


@torch.no_grad()
def shard_qwen3(model: Qwen3Model, rank: int, world_size: int,
                group: Optional[dist.ProcessGroup] = None) -> Qwen3Model:
    """Rank ``rank``'s part of ``model`` for ``world_size``-way tensor parallelism
    (layout in the module docstring); on ``model``'s device and dtype, with its
    attention backend. The ranks' all-reduces run over ``group`` (default: the
    default process group, which must span ``world_size`` ranks)."""
    cfg = model.cfg
    for name, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads),
                    ("intermediate_size", cfg.intermediate_size)):
        if n % world_size:
            raise ValueError(f"shard_qwen3: {name} ({n}) must be a multiple of world_size ({world_size})")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_qwen3: rank {rank} outside [0, {world_size})")
    p = next(model.parameters())
    part = dataclasses.replace(cfg, num_heads=cfg.num_heads // world_size,
                               num_kv_heads=cfg.num_kv_heads // world_size,
                               intermediate_size=cfg.intermediate_size // world_size)
    shard = Qwen3Model(part, backend=model.layers[0].attn.backend).to(device=p.device, dtype=p.dtype)
    shard.embed.weight.copy_(model.embed.weight)
    shard.norm.weight.copy_(model.norm.weight)
    shard.lm_head.weight.copy_(model.lm_head.weight)
    d = cfg.head_dim
    for full, mine in zip(model.layers, shard.layers):
        mine.input_norm.weight.copy_(full.input_norm.weight)
        mine.post_norm.weight.copy_(full.post_norm.weight)
        mine.attn.q_norm.copy_(full.attn.q_norm)
        mine.attn.k_norm.copy_(full.attn.k_norm)
        # Column-parallel: the rows of the packed projection, q, k and v each split by heads.
        q, k, v = full.qkv_proj.weight.split([cfg.num_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d])
        mine.qkv_proj.weight.copy_(torch.cat([_block(w, 0, rank, world_size) for w in (q, k, v)]))
        gate, up = full.gate_up.weight.chunk(2, dim=0)
        mine.gate_up.weight.copy_(torch.cat([_block(w, 0, rank, world_size) for w in (gate, up)]))
        # Row-parallel: the columns that multiply this rank's heads / intermediate features.
        for name in ("o_proj", "down"):
            w = _block(getattr(full, name).weight, 1, rank, world_size)
            row = RowParallelLinear(w.shape[1], w.shape[0], group, device=p.device, dtype=p.dtype)
            row.weight.copy_(w)
            setattr(mine, name, row)
    return shard
