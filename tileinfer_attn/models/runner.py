"""Drives a Qwen3Model over paged caches the way a serving engine does.

Each sequence slot owns a fixed, shuffled set of pages (enough for max_len
positions), so the block table never changes and only lengths move; a step
takes any number of new tokens per sequence (prefill, decode, speculative
verify, non-causal drafting). ``capture`` records one step of up to a token
budget in a CUDA graph, any mix of prompt chunks, decodes and verify steps,
and its ``replay`` copies each step's tokens and metadata into the graph's
static buffers; ``capture_decode`` / ``decode_graph`` are the whole batch's
decode step (max_q_len 1, the decode kernels alone).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from ..metadata import AttentionMetadata
from .qwen3 import Qwen3Model

__all__ = ["CapturedStep", "PagedRunner"]


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

    def capture(self, token_budget: int, max_q_len: Optional[int] = None, causal: bool = True) -> "CapturedStep":
        """One step of up to ``token_budget`` tokens over the ``max_seqs`` slots,
        each sequence with at most ``max_q_len`` queries (default: the budget),
        captured in a CUDA graph: any mix of prompt chunks, decodes and verify
        steps replays through it (the ops read lengths and positions on the
        device and size their grids from shapes and max_q_len alone). Without
        a GPU nothing is captured and replay runs the same static buffers eagerly."""
        return CapturedStep(self, token_budget, token_budget if max_q_len is None else max_q_len, causal)

    def capture_decode(self) -> None:
        """Captures one decode step (1 token per slot, all max_seqs slots) in a CUDA graph."""
        self._graph = self.capture(self.max_seqs, 1)

    def decode_graph(self, tokens: Sequence[int]) -> torch.Tensor:
        """One decode token for each of the first len(tokens) slots, by graph replay.
        Unused slots are padded (length 0: no work, no NaN). Returns [len(tokens), vocab]."""
        return torch.cat(self._graph.replay([[t] for t in tokens]))


class CapturedStep:
    """A step of a PagedRunner on static buffers (PagedRunner.capture): token
    ids padded to the budget and ``AttentionMetadata.static`` slots, which
    every replay overwrites."""

    def __init__(self, runner: PagedRunner, token_budget: int, max_q_len: int, causal: bool):
        self.runner, self.budget = runner, token_budget
        self.ids = torch.zeros(token_budget, dtype=torch.long, device=runner.device)
        # Captured with every slot empty (static(): no queries, length 0), so the
        # warm-up run writes nothing into the caches.
        self.meta = AttentionMetadata.static(runner.max_seqs, runner.block_tables.shape[1], max_q_len, runner.device,
                                             causal=causal)
        self.graph = None
        if runner.device.type == "cuda":
            model, kv = runner.model, runner.kv_caches
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the graph (allocations, lazy init)
                model(self.ids, kv, self.meta)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = model(self.ids, kv, self.meta)

    def replay(self, tokens: Sequence[Sequence[int]], commit: bool = True) -> List[torch.Tensor]:
        """PagedRunner.step through the captured graph: new tokens of sequences
        0..len(tokens)-1, at most the budget in all and max_q_len each. Tokens
        past the step's (up to the budget) and slots past len(tokens) are padding."""
        r = self.runner
        n = [len(t) for t in tokens]
        total = sum(n)
        if total > self.budget or len(tokens) > r.max_seqs:
            raise ValueError(f"step of {total} tokens over {len(tokens)} sequences does not fit the captured "
                             f"{self.budget} tokens over {r.max_seqs} slots")
        seqs = len(tokens)
        new_lens = [r.lens[i] + n[i] for i in range(seqs)]
        ids = torch.zeros(self.budget, dtype=torch.long)
        ids[:total] = torch.tensor([t for ts in tokens for t in ts], dtype=torch.long)
        self.ids.copy_(ids)
        # (update_ refuses a step past max_q_len or of the other causality.)
        self.meta.update_(AttentionMetadata.build(r.block_tables[:seqs], new_lens, n, r.device,
                                                  causal=self.meta.causal))
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = r.model(self.ids, r.kv_caches, self.meta)
        if commit:
            r.lens[:seqs] = new_lens
        return list(logits[:total].clone().split(n))
