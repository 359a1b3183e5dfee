"""Drives a Qwen3Model over paged caches the way a serving engine does.

Each sequence slot owns a fixed, shuffled set of pages (enough for max_len
positions), so the block table never changes and only lengths move; a step
takes any number of new tokens per sequence (prefill, decode, speculative
verify, non-causal drafting). ``capture_decode`` records one decode step of the
whole batch in a CUDA graph; ``decode_graph`` replays it after copying the new
tokens and lengths into the graph's static buffers.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from ..metadata import AttentionMetadata
from .qwen3 import Qwen3Model

__all__ = ["PagedRunner"]


class PagedRunner:
    def __init__(self, model: Qwen3Model, max_seqs: int, max_len: int, page_size: int = 64, seed: int = 0,
                 kv_dtype: Optional[torch.dtype] = None, kv_scale: str = "vector"):
        p = next(model.parameters())
        self.model, self.device = model, p.device
        self.max_seqs, self.page_size = max_seqs, page_size
        pages_per_seq = math.ceil(max_len / page_size)
        num_pages = max_seqs * pages_per_seq + 1  # one spare: never any sequence's
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.block_tables = perm[: max_seqs * pages_per_seq].view(max_seqs, pages_per_seq).int().to(self.device)
        # kv_dtype: the pools' element type (default: the model's), int8 or
        # float8_e4m3fn for a quantized cache (kv_scale: "vector" or "tensor").
        self.kv_caches = model.new_kv_caches(num_pages, page_size, dtype=kv_dtype, scale=kv_scale)
        self.lens = [0] * max_seqs
        self._graph = None

    def step(self, tokens: Sequence[Sequence[int]], causal: bool = True, commit: bool = True) -> List[torch.Tensor]:
        """Runs new tokens of sequences 0..len(tokens)-1 (a ragged batch); returns each
        sequence's logits [n_i, vocab]. commit=False leaves the lengths unchanged
        (the next step overwrites those positions: a rejected draft)."""
        n = [len(t) for t in tokens]
        seqs = len(tokens)
        new_lens = [self.lens[i] + n[i] for i in range(seqs)]
        meta = AttentionMetadata.build(self.block_tables[:seqs], new_lens, n, self.device, causal=causal)
        ids = torch.tensor([t for ts in tokens for t in ts], dtype=torch.long, device=self.device)
        logits = self.model(ids, self.kv_caches, meta)
        if commit:
            self.lens[:seqs] = new_lens
        return list(logits.split(n))

    def capture_decode(self) -> None:
        """Captures one decode step (1 token per slot, all max_seqs slots) in a CUDA graph."""
        b = self.max_seqs
        self._ids = torch.zeros(b, dtype=torch.long, device=self.device)
        # Captured with every slot empty (static(): no queries, length 0), so the
        # warm-up run writes nothing into the caches; each replay update_()s the
        # buffers' contents with the real step.
        self._meta = AttentionMetadata.static(b, self.block_tables.shape[1], 1, self.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph (allocations, lazy init)
            self.model(self._ids, self.kv_caches, self._meta)
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._logits = self.model(self._ids, self.kv_caches, self._meta)

    def decode_graph(self, tokens: Sequence[int]) -> torch.Tensor:
        """One decode token for each of the first len(tokens) slots, by graph replay.
        Unused slots are padded (length 0: no work, no NaN). Returns [len(tokens), vocab]."""
        b = len(tokens)
        new_lens = [self.lens[i] + 1 for i in range(b)]
        ids = torch.zeros(self.max_seqs, dtype=torch.long)
        ids[:b] = torch.tensor(list(tokens))
        self._ids.copy_(ids)
        self._meta.update_(AttentionMetadata.build(self.block_tables[:b], new_lens, [1] * b, self.device))
        self._graph.replay()
        self.lens[:b] = new_lens
        return self._logits[:b].clone()
