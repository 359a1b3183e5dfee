"""Attention metadata of one step, as a vLLM-style model passes it to every layer.

All tensors live on the device. For CUDA graphs, build one ``AttentionMetadata``
with ``static()`` sized for the largest batch, capture with it, and before each
replay ``update_()`` only the *contents* of its buffers: the grid of every op
depends on shapes alone, so the same graph serves every context length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["AttentionMetadata"]


@dataclass
class AttentionMetadata:
    block_tables: torch.Tensor   # [num_seqs, max_pages] int32: page ids of each sequence
    seq_lens: torch.Tensor       # [num_seqs] int32: positions cached after this step's keys
    cu_seqlens_q: torch.Tensor   # [num_seqs + 1] int32: prefix sums of this step's query counts
    max_q_len: int               # host bound of any sequence's query count (a shape, not a length)
    causal: bool = True          # False: every query sees all seq_lens[s] positions (drafting)

    @property
    def num_seqs(self) -> int:
        return self.block_tables.shape[0]

    def positions(self, num_tokens: int) -> torch.Tensor:
        """Position of every token of the step ([num_tokens] int64, -1 for padding tokens)."""
        from .reference import token_positions

        return token_positions(self.seq_lens, self.cu_seqlens_q, num_tokens)

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]] | torch.Tensor,
        seq_lens: Sequence[int],
        q_lens: Sequence[int],
        device: torch.device | str,
        causal: bool = True,
        max_pages: int | None = None,
    ) -> "AttentionMetadata":
        """From host lists: each sequence's page ids, its length after this step,
        and its number of queries this step."""
        if not isinstance(block_tables, torch.Tensor):
            width = max_pages or max((len(t) for t in block_tables), default=1) or 1
            bt = torch.zeros(len(block_tables), width, dtype=torch.int32)
            for i, t in enumerate(block_tables):
                bt[i, : len(t)] = torch.tensor(list(t), dtype=torch.int32)
            block_tables = bt
        cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(list(q_lens), dtype=torch.int64).cumsum(0).int()
        return cls(
            block_tables=block_tables.to(device=device, dtype=torch.int32),
            seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32).to(device),
            cu_seqlens_q=cu.to(device),
            max_q_len=max(q_lens, default=0),
            causal=causal,
        )

    @classmethod
    def static(cls, max_seqs: int, max_pages: int, max_q_len: int, device, causal: bool = True):
        """Buffers for CUDA-graph capture: every slot padded (length 0, no queries)."""
        return cls(
            block_tables=torch.zeros(max_seqs, max_pages, dtype=torch.int32, device=device),
            seq_lens=torch.zeros(max_seqs, dtype=torch.int32, device=device),
            cu_seqlens_q=torch.zeros(max_seqs + 1, dtype=torch.int32, device=device),
            max_q_len=max_q_len,
            causal=causal,
        )

    def update_(self, other: "AttentionMetadata") -> "AttentionMetadata":
        """Copies another step's metadata into these (static) buffers, padding the
        remaining slots with empty sequences. Shapes of self never change."""
        n, w = other.block_tables.shape
        if n > self.num_seqs or w > self.block_tables.shape[1] or other.max_q_len > self.max_q_len:
            raise ValueError(
                f"step does not fit the static metadata: {n} seqs x {w} pages x {other.max_q_len} queries "
                f"vs {self.num_seqs} x {self.block_tables.shape[1]} x {self.max_q_len}"
            )
        if other.causal != self.causal:
            raise ValueError("step and static metadata differ in causal (a captured graph bakes it in)")
        self.block_tables.zero_()
        self.block_tables[:n, :w].copy_(other.block_tables, non_blocking=True)
        self.seq_lens.zero_()
        self.seq_lens[:n].copy_(other.seq_lens, non_blocking=True)
        self.cu_seqlens_q[: n + 1].copy_(other.cu_seqlens_q, non_blocking=True)
        self.cu_seqlens_q[n + 1:].copy_(other.cu_seqlens_q[n].expand(self.num_seqs - n), non_blocking=True)
        return self
