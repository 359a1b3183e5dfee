"""Attention metadata of one step, as a vLLM-style model passes it to every layer.

All tensors live on the device. For CUDA graphs, build one ``AttentionMetadata``
with ``static()`` sized for the largest batch, capture with it, and before each
replay ``update_()`` only the *contents* of its buffers: the grid of every op
depends on shapes alone, so the same graph serves every context length.

Tree verify (EAGLE-style): a step of up to 16 drafted tokens per sequence,
arranged as a tree, is verified in one call. Each token sees the cached prefix,
its ancestors and itself: ``tree_mask_words`` turns parent lists into the
attention ops' ``tree_mask`` words (and checks them), ``tree_positions`` gives
the RoPE positions (prefix length + depth) for ``attention_inputs``, while the
cache slots stay consecutive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = ["AttentionMetadata", "tree_mask_words", "tree_positions", "check_tree_mask"]

# A tree step holds at most this many tokens per sequence (the decode path's
# limit, csrc/checks.h kMaxDecodeQueries).
MAX_TREE_TOKENS = 16


def _tree_ancestors(parents: Sequence[int], seq: int):
    """Per token of one sequence's step: (ancestors with itself as a bit set, depth)."""
    n = len(parents)
    if n > MAX_TREE_TOKENS:
        raise RuntimeError(f"tree_mask: sequence {seq} has {n} tree tokens, more than {MAX_TREE_TOKENS}")
    words, depths = [], []
    for i in range(n):
        word, depth, j = 0, 0, i
        while j != -1:
            if not isinstance(j, int) or not -1 <= j < n:
                raise RuntimeError(f"tree_mask: sequence {seq}: parent {j!r} of a token in its chain from token "
                                   f"{i} is outside [-1, {n}) (-1: the root has no parent in the step)")
            if word >> j & 1:
                raise RuntimeError(f"tree_mask: sequence {seq}: the parents of token {i} form a cycle")
            word |= 1 << j
            if j != i:
                depth += 1
            j = parents[j]
        words.append(word)
        depths.append(depth)
    return words, depths


def check_tree_mask(tree_mask: torch.Tensor, cu_seqlens_q: torch.Tensor, causal: bool = True) -> None:
    """Checks tree-mask words on the host (they are copied there: call it where
    a sync is fine, never inside a captured graph). The kernels read any bits
    safely; this is where a bad tree is reported: a bit at or past the step's
    token count, or, under ``causal``, a bit that points at a later token (the
    kernels would ignore it)."""
    words = tree_mask.detach().to("cpu", torch.int64).tolist()
    cu = cu_seqlens_q.detach().to("cpu").tolist()
    if tree_mask.dim() != 1 or tree_mask.dtype != torch.int32:
        raise RuntimeError(f"tree_mask must be 1-D int32, got {tree_mask.dtype} of shape {tuple(tree_mask.shape)}")
    for s in range(len(cu) - 1):
        n = cu[s + 1] - cu[s]
        if n > MAX_TREE_TOKENS:
            raise RuntimeError(f"tree_mask: sequence {s} has {n} queries this step, more than a tree step's "
                               f"{MAX_TREE_TOKENS}")
        for i in range(n):
            word = words[cu[s] + i] & 0xFFFFFFFF
            if word >> n:
                raise RuntimeError(f"tree_mask[{cu[s] + i}] = {word:#x} (sequence {s}, step token {i}) has bits at "
                                   f"or past the step's {n} tokens")
            if causal and word >> (i + 1):
                raise RuntimeError(f"tree_mask[{cu[s] + i}] = {word:#x} (sequence {s}, step token {i}) points at "
                                   f"later tokens of the step, which causal attention never shows it; order the "
                                   f"tree so that parents come before their children")


def tree_mask_words(parents: Sequence[Sequence[int]], causal: bool = True, device=None) -> torch.Tensor:
    """The ``tree_mask`` words ``[num_tokens]`` int32 of a tree verify step, from
    each sequence's parent list (in ``cu_seqlens_q`` order): ``parents[s][i]``
    is the step token that token ``i`` of sequence ``s`` extends, -1 for a
    root (the first token: the last accepted one). Bit ``j`` of token ``i``'s
    word is set for ``i`` itself and each of its ancestors. Checked on the
    host (``check_tree_mask``): at most 16 tokens per sequence, parents inside
    the step, no cycles, and under ``causal`` every parent before its child."""
    words, cu = [], [0]
    for s, ps in enumerate(parents):
        w, _ = _tree_ancestors(list(ps), s)
        words += w
        cu.append(cu[-1] + len(w))
    mask = torch.tensor(words, dtype=torch.int32)
    check_tree_mask(mask, torch.tensor(cu, dtype=torch.int32), causal)
    return mask.to(device) if device is not None else mask


def tree_positions(parents: Sequence[Sequence[int]], seq_lens: Sequence[int], device=None) -> torch.Tensor:
    """RoPE positions ``[num_tokens]`` int64 of a tree verify step: token ``i``
    of sequence ``s`` at the step's first position plus its depth in the tree
    (``seq_lens[s] - n_s + depth``, ``seq_lens`` counting the step's tokens as
    the ops do). Its cache slot stays ``seq_lens[s] - n_s + i``."""
    out = []
    for s, (ps, length) in enumerate(zip(parents, seq_lens)):
        _, depths = _tree_ancestors(list(ps), s)
        out += [int(length) - len(ps) + d for d in depths]
    pos = torch.tensor(out, dtype=torch.int64)
    return pos.to(device) if device is not None else pos


@dataclass
class AttentionMetadata:
    block_tables: torch.Tensor   # [num_seqs, max_pages] int32: page ids of each sequence
    seq_lens: torch.Tensor       # [num_seqs] int32: positions cached after this step's keys
    cu_seqlens_q: torch.Tensor   # [num_seqs + 1] int32: prefix sums of this step's query counts
    max_q_len: int               # host bound of any sequence's query count (a shape, not a length)
    causal: bool = True          # False: every query sees all seq_lens[s] positions (drafting)
    tree_mask: Optional[torch.Tensor] = None       # [num_tokens] int32 tree verify words, or None
    rope_positions: Optional[torch.Tensor] = None  # [num_tokens] int64 RoPE positions (tree depths), or None

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
        tree_parents: Sequence[Sequence[int]] | None = None,
    ) -> "AttentionMetadata":
        """From host lists: each sequence's page ids, its length after this step,
        and its number of queries this step. ``tree_parents`` (one parent list
        per sequence, as ``tree_mask_words``): a tree verify step, with its
        tree mask and RoPE positions."""
        if not isinstance(block_tables, torch.Tensor):
            width = max_pages or max((len(t) for t in block_tables), default=1) or 1
            bt = torch.zeros(len(block_tables), width, dtype=torch.int32)
            for i, t in enumerate(block_tables):
                bt[i, : len(t)] = torch.tensor(list(t), dtype=torch.int32)
            block_tables = bt
        cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(list(q_lens), dtype=torch.int64).cumsum(0).int()
        tree_mask = rope_positions = None
        if tree_parents is not None:
            if [len(p) for p in tree_parents] != list(q_lens):
                raise RuntimeError("tree_mask: tree_parents must hold one parent per query of each sequence")
            tree_mask = tree_mask_words(tree_parents, causal, device)
            rope_positions = tree_positions(tree_parents, seq_lens, device)
        return cls(
            block_tables=block_tables.to(device=device, dtype=torch.int32),
            seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32).to(device),
            cu_seqlens_q=cu.to(device),
            max_q_len=max(q_lens, default=0),
            causal=causal,
            tree_mask=tree_mask,
            rope_positions=rope_positions,
        )

    @classmethod
    def static(cls, max_seqs: int, max_pages: int, max_q_len: int, device, causal: bool = True,
               tree_tokens: int | None = None):
        """Buffers for CUDA-graph capture: every slot padded (length 0, no queries).
        ``tree_tokens``: also tree-mask and RoPE-position buffers for steps of up
        to that many tokens (tree verify)."""
        tree = tree_tokens is not None
        return cls(
            block_tables=torch.zeros(max_seqs, max_pages, dtype=torch.int32, device=device),
            seq_lens=torch.zeros(max_seqs, dtype=torch.int32, device=device),
            cu_seqlens_q=torch.zeros(max_seqs + 1, dtype=torch.int32, device=device),
            max_q_len=max_q_len,
            causal=causal,
            tree_mask=torch.zeros(tree_tokens, dtype=torch.int32, device=device) if tree else None,
            rope_positions=torch.zeros(tree_tokens, dtype=torch.int64, device=device) if tree else None,
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
        if (self.tree_mask is None) != (other.tree_mask is None):
            raise ValueError("step and static metadata differ in having a tree_mask (a captured graph bakes it in)")
        if self.tree_mask is not None:
            t = other.tree_mask.shape[0]
            if t > self.tree_mask.shape[0]:
                raise ValueError(f"tree_mask: step of {t} tokens does not fit the static {self.tree_mask.shape[0]}")
            self.tree_mask.fill_(-1)  # padding tokens: all bits (nothing hidden)
            self.tree_mask[:t].copy_(other.tree_mask, non_blocking=True)
            self.rope_positions.zero_()
            self.rope_positions[:t].copy_(other.rope_positions, non_blocking=True)
        return self
