"""PagedKVCache: the pools of every layer, one page allocator, per-sequence
block tables and lengths.

Layout: each layer's pools are ``[num_pages, num_kv_heads,
page_size, head_dim]`` views of one ``[num_layers, ...]`` tensor; all layers
share one page allocator (a sequence's page ``j`` is the same page id in every
layer). ``block_tables [max_seqs, max_pages_per_seq]`` and ``seq_lens
[max_seqs]`` are int32 device tensors indexed by sequence slot and updated in
place, so CUDA graphs can capture them; the allocator's bookkeeping lives on
the host.

A step (runs as written, on the GPU where there is one)::

    import torch
    import tileinfer_attn as ti

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cache = ti.PagedKVCache(num_layers=2, num_pages=64, num_kv_heads=2, head_dim=64, page_size=16,
                            dtype=torch.bfloat16, device=device)
    a, b = cache.add(), cache.add()
    md = cache.prepare_step([a, b], [20, 7])  # appends 20 and 7 positions, returns the step's metadata
    for layer in range(2):
        q = torch.randn(md.num_tokens, 8, 64, dtype=torch.bfloat16, device=device)
        k, v = (torch.randn(md.num_tokens, 2, 64, dtype=torch.bfloat16, device=device) for _ in "kv")
        k_cache, v_cache = cache.layer_cache(layer)[:2]
        ti.cache_write(k_cache, v_cache, k, v, md.block_tables, md.seq_lens, md.cu_seqlens_q)
        out = ti.attention(q, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q, md.max_q_len)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from .metadata import AttentionMetadata

__all__ = ["PagedKVCache", "CacheFullError", "StepMetadata"]

# What the kernels support: the extension's table (csrc/include/tileinfer/tile_table.h),
# read once at import (plain tuples, so nothing here reaches torch.compile).
_HEAD_DIMS = tuple(torch.ops.tileinfer_attn.supported("head_dims"))
_PAGE_SIZES = tuple(torch.ops.tileinfer_attn.supported("page_sizes"))
_DTYPES = tuple(getattr(torch, name) for name in torch.ops.tileinfer_attn.supported_dtypes("cache"))
# The quantized cache types (int8, float8_e4m3fn), with fp32 scales.
QUANT_DTYPES = tuple(getattr(torch, name) for name in torch.ops.tileinfer_attn.supported_dtypes("quant"))


def _one_of(values) -> str:
    """'64, 128 or 256'."""
    names = [str(v).replace("torch.", "") for v in values]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


class CacheFullError(RuntimeError):
    """No free page, no free sequence slot, or a sequence past max_pages_per_seq."""


@dataclass
class StepMetadata(AttentionMetadata):
    """A step's metadata for the ops (AttentionMetadata's fields are views of the
    cache's static step buffers: the same storage every step, so a captured CUDA
    graph sees new contents), plus what the cache knows of the step."""

    num_tokens: int = 0                             # cu_seqlens_q[-1] (host int)
    seqs: List[int] = field(default_factory=list)   # the scheduled sequences, in order

    def positions(self, num_tokens: Optional[int] = None) -> torch.Tensor:
        """Position of every token of the step, [num_tokens] int64 (-1 for padding tokens)."""
        return super().positions(self.num_tokens if num_tokens is None else num_tokens)


class PagedKVCache:
    """Paged KV cache of ``num_layers`` layers sharing one page allocator.

    Args:
        num_layers, num_pages, num_kv_heads, head_dim, page_size: pool geometry
            (head_dim and page_size: values the kernels support,
            ``torch.ops.tileinfer_attn.supported("head_dims")`` / ``("page_sizes")``).
        dtype: bfloat16, float16, float32, or a quantized type: int8 or
            float8_e4m3fn, with fp32 scales ``k_scales``/``v_scales`` and
            per-channel key smoothing ``k_smooth`` per layer (ones by default:
            set ``cache.k_smooth[layer]`` before writing).
        scale: a quantized cache's scale granularity: ``"vector"`` (one scale
            per cached vector, ``[num_pages, num_kv_heads, page_size]`` per
            layer, computed by each write as amax / 127 or amax / 448, rounded up
            to 4 or 7 significant bits) or, for
            float8_e4m3fn only, ``"tensor"`` (one scale per layer and pool,
            ``k_scales[layer]`` of shape ``[1]``, given by the caller as vLLM's
            ``k_scale`` / ``v_scale``: set it before writing; writes divide by it
            and saturate to +-448).
        device: where the pools and the metadata live.
        max_seqs: sequence slots (rows of ``block_tables``).
        max_pages_per_seq: columns of ``block_tables`` (default: enough for the whole pool).

    Sequences are identified by their slot (an int). ``add`` / ``reserve`` /
    ``append`` / ``fork`` / ``free`` keep the device ``block_tables`` and
    ``seq_lens`` rows current; ``prepare_step`` builds the metadata of a step.
    Errors: :class:`CacheFullError` when pages or slots run out (nothing is
    allocated then), ``ValueError`` for unknown sequences or bad counts.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = 64,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        max_seqs: int = 64,
        max_pages_per_seq: Optional[int] = None,
        scale: str = "vector",
    ):
        if dtype == torch.float8_e5m2:
            raise ValueError("PagedKVCache: dtype torch.float8_e5m2 is not supported (the fp8 cache is "
                             "torch.float8_e4m3fn)")
        if dtype not in _DTYPES:
            raise ValueError(f"PagedKVCache: dtype must be {_one_of(_DTYPES)}, got {dtype}")
        if head_dim not in _HEAD_DIMS:
            raise ValueError(f"PagedKVCache: head_dim must be {_one_of(_HEAD_DIMS)}, got {head_dim}")
        if page_size not in _PAGE_SIZES:
            raise ValueError(f"PagedKVCache: page_size must be {_one_of(_PAGE_SIZES)}, got {page_size}")
        for name, v in (("num_layers", num_layers), ("num_pages", num_pages), ("num_kv_heads", num_kv_heads),
                        ("max_seqs", max_seqs)):
            if v < 1:
                raise ValueError(f"PagedKVCache: {name} must be >= 1, got {v}")
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_seqs = max_seqs
        self.max_pages_per_seq = max_pages_per_seq or num_pages
        if self.max_pages_per_seq < 1:
            raise ValueError(f"PagedKVCache: max_pages_per_seq must be >= 1, got {max_pages_per_seq}")

        shape = (num_layers, num_pages, num_kv_heads, page_size, head_dim)
        self.k_pools = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v_pools = torch.zeros(shape, dtype=dtype, device=self.device)
        self.int8 = dtype == torch.int8
        self.quantized = dtype in QUANT_DTYPES
        if scale not in ("vector", "tensor"):
            raise ValueError(f"PagedKVCache: scale must be 'vector' or 'tensor', got {scale!r}")
        if scale == "tensor" and dtype != torch.float8_e4m3fn:
            raise ValueError(f"PagedKVCache: scale='tensor' is for a torch.float8_e4m3fn cache, got dtype {dtype}")
        self.scale = scale if self.quantized else None
        if self.quantized:
            scale_shape = shape[:4] if scale == "vector" else (num_layers, 1)
            self.k_scales = torch.ones(scale_shape, dtype=torch.float32, device=self.device)
            self.v_scales = torch.ones(scale_shape, dtype=torch.float32, device=self.device)
            self.k_smooth = torch.ones(num_layers, num_kv_heads, head_dim, dtype=torch.float32, device=self.device)
        else:
            self.k_scales = self.v_scales = self.k_smooth = None

        # Device metadata, one row per slot, updated in place. Unused table
        # entries hold page 0, a valid page, so nothing reads outside the pool
        # even if a kernel looks ahead of a sequence's length.
        self.block_tables = torch.zeros(max_seqs, self.max_pages_per_seq, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.zeros(max_seqs, dtype=torch.int32, device=self.device)
        # Static buffers of prepare_step (views of their first rows are handed out).
        self._step_tables = torch.zeros_like(self.block_tables)
        self._step_lens = torch.zeros_like(self.seq_lens)
        self._step_cu = torch.zeros(max_seqs + 1, dtype=torch.int32, device=self.device)

        # Host bookkeeping.
        self._pages: Dict[int, List[int]] = {}  # slot -> page ids (reserved ones included)
        self._lens: Dict[int, int] = {}         # slot -> positions held
        self._refcount = [0] * num_pages
        self._free_pages = list(range(num_pages - 1, -1, -1))  # a stack: low ids first
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self._dirty: set = set()

    # ----------------------------------------------------------------- queries
    def layer_cache(self, layer: int):
        """``(k_cache, v_cache)`` of a layer, plus ``(k_scale, v_scale, k_smooth)`` for a
        quantized cache: the tuple tileinfer_attn.layer takes."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"PagedKVCache: layer {layer} outside [0, {self.num_layers})")
        if self.quantized:
            return (self.k_pools[layer], self.v_pools[layer], self.k_scales[layer], self.v_scales[layer],
                    self.k_smooth[layer])
        return self.k_pools[layer], self.v_pools[layer]

    def quant_kwargs(self, layer: int) -> dict:
        """``k_scale`` / ``v_scale`` / ``k_smooth`` keyword arguments of the ops (empty unless quantized)."""
        if not self.quantized:
            return {}
        return dict(k_scale=self.k_scales[layer], v_scale=self.v_scales[layer], k_smooth=self.k_smooth[layer])

    @property
    def num_free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def num_free_seqs(self) -> int:
        return len(self._free_slots)

    @property
    def seqs(self) -> List[int]:
        """Live sequences (slots), in slot order."""
        return sorted(self._pages)

    def seq_len(self, seq: int) -> int:
        self._live(seq)
        return self._lens[seq]

    def pages(self, seq: int) -> List[int]:
        """Page ids of a sequence, reserved ones included."""
        self._live(seq)
        return list(self._pages[seq])

    def refcount(self, page: int) -> int:
        return self._refcount[page]

    # --------------------------------------------------------------- mutation
    def add(self, num_positions: int = 0) -> int:
        """A new sequence (its slot), holding ``num_positions`` positions (pages allocated)."""
        if num_positions < 0:
            raise ValueError(f"PagedKVCache.add: num_positions must be >= 0, got {num_positions}")
        if not self._free_slots:
            raise CacheFullError(f"PagedKVCache: out of sequence slots (all {self.max_seqs} in use)")
        need = self._pages_for(num_positions)
        self._check_fits(need, "add", num_positions)
        seq = self._free_slots.pop()
        self._pages[seq] = []
        self._lens[seq] = 0
        self._append(seq, num_positions)
        self._flush()
        return seq

    def reserve(self, seq: int, num_positions: int) -> None:
        """Allocates pages so that ``num_positions`` more positions fit (length unchanged)."""
        self._reserve(seq, num_positions)
        self._flush()

    def append(self, seq: int, num_positions: int = 1) -> int:
        """Extends a sequence by ``num_positions`` (allocating pages as needed); returns its new length.
        The step's keys then go to positions ``[old_len, new_len)`` (cache_write)."""
        self._append(seq, num_positions)
        self._flush()
        return self._lens[seq]

    def fork(self, seq: int) -> int:
        """A new sequence with the contents of ``seq``: its full pages are shared
        (reference-counted; nobody writes a full page again), its partial last
        page is copied into a new page (both sequences append there next)."""
        self._live(seq)
        if not self._free_slots:
            raise CacheFullError(f"PagedKVCache.fork: out of sequence slots (all {self.max_seqs} in use)")
        length = self._lens[seq]
        full = length // self.page_size
        partial = length % self.page_size != 0
        if partial and not self._free_pages:
            raise CacheFullError("PagedKVCache.fork: out of pages (needs 1 page for the partial last page, 0 free)")
        child = self._free_slots.pop()
        pages = self._pages[seq][:full]
        for p in pages:
            self._refcount[p] += 1
        if partial:
            src = self._pages[seq][full]
            dst = self._take_page()
            self._copy_page(src, dst)
            pages = pages + [dst]
        self._pages[child] = pages
        self._lens[child] = length
        self._dirty.add(child)
        self._flush()
        return child

    def free(self, seq: int) -> None:
        """Releases a sequence: its pages return to the free list when no other
        sequence shares them; its slot is reused."""
        self._live(seq)
        for p in self._pages.pop(seq):
            self._refcount[p] -= 1
            if self._refcount[p] == 0:
                self._free_pages.append(p)
        del self._lens[seq]
        self._free_slots.append(seq)
        self._dirty.add(seq)
        self._flush()

    def prepare_step(self, seqs: Sequence[int], query_lens: Sequence[int], causal: bool = True,
                     append: bool = True) -> StepMetadata:
        """Metadata of a step that runs ``query_lens[i]`` new tokens of ``seqs[i]``
        (tokens packed in that order). With ``append`` (default) the sequences are
        first extended by their query counts (all or nothing: if the pages do not
        suffice, nothing changes). Returns views of static buffers."""
        seqs = [int(s) for s in seqs]
        query_lens = [int(n) for n in query_lens]
        if len(seqs) != len(query_lens):
            raise ValueError(f"prepare_step: {len(seqs)} sequences but {len(query_lens)} query counts")
        if len(set(seqs)) != len(seqs):
            raise ValueError(f"prepare_step: a sequence is scheduled twice: {seqs}")
        for s, n in zip(seqs, query_lens):
            self._live(s)
            if n < 0:
                raise ValueError(f"prepare_step: query count of sequence {s} is {n}")
        if append:
            # Every check before the first append: a sequence past max_pages_per_seq
            # must not leave the ones before it extended (all or nothing).
            for s, n in zip(seqs, query_lens):
                total = self._pages_for(self._lens[s] + n)
                if total > self.max_pages_per_seq:
                    raise CacheFullError(f"PagedKVCache.prepare_step: sequence {s} would need {total} pages, more "
                                         f"than max_pages_per_seq = {self.max_pages_per_seq}")
            need = sum(self._new_pages(s, n) for s, n in zip(seqs, query_lens))
            if need > len(self._free_pages):
                raise CacheFullError(f"PagedKVCache.prepare_step: out of pages (needs {need}, "
                                     f"{len(self._free_pages)} free of {self.num_pages})")
            for s, n in zip(seqs, query_lens):
                self._append(s, n)
        else:
            for s, n in zip(seqs, query_lens):
                if n > self._lens[s]:
                    raise ValueError(f"prepare_step: sequence {s} has {n} queries but only {self._lens[s]} positions")
        self._flush()
        num = len(seqs)
        idx = torch.tensor(seqs, dtype=torch.long, device=self.device)
        torch.index_select(self.block_tables, 0, idx, out=self._step_tables[:num])
        torch.index_select(self.seq_lens, 0, idx, out=self._step_lens[:num])
        cu = torch.zeros(num + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(query_lens, dtype=torch.int64).cumsum(0).int()
        self._step_cu[: num + 1].copy_(cu)
        return StepMetadata(
            block_tables=self._step_tables[:num], seq_lens=self._step_lens[:num], cu_seqlens_q=self._step_cu[: num + 1],
            max_q_len=max(query_lens, default=0), num_tokens=int(sum(query_lens)), seqs=seqs, causal=causal,
        )

    # ---------------------------------------------------------------- helpers
    def _live(self, seq: int) -> None:
        if seq not in self._pages:
            raise ValueError(f"PagedKVCache: sequence {seq} is not live (add() it first)")

    def _pages_for(self, positions: int) -> int:
        return (positions + self.page_size - 1) // self.page_size

    def _new_pages(self, seq: int, n: int) -> int:
        """Pages that appending n positions to seq would allocate."""
        return max(0, self._pages_for(self._lens[seq] + n) - len(self._pages[seq]))

    def _check_fits(self, total_pages: int, what: str, positions: int) -> None:
        if total_pages > self.max_pages_per_seq:
            raise CacheFullError(f"PagedKVCache.{what}: {positions} positions need {total_pages} pages, more than "
                                 f"max_pages_per_seq = {self.max_pages_per_seq}")
        if total_pages > len(self._free_pages):
            raise CacheFullError(f"PagedKVCache.{what}: out of pages (needs {total_pages}, "
                                 f"{len(self._free_pages)} free of {self.num_pages})")

    def _take_page(self) -> int:
        p = self._free_pages.pop()
        self._refcount[p] = 1
        return p

    def _reserve(self, seq: int, n: int) -> None:
        self._live(seq)
        if n < 0:
            raise ValueError(f"PagedKVCache: cannot reserve/append {n} positions")
        total = self._pages_for(self._lens[seq] + n)
        if total > self.max_pages_per_seq:
            raise CacheFullError(f"PagedKVCache: sequence {seq} would need {total} pages, more than "
                                 f"max_pages_per_seq = {self.max_pages_per_seq}")
        new = total - len(self._pages[seq])
        if new > len(self._free_pages):
            raise CacheFullError(f"PagedKVCache: out of pages (sequence {seq} needs {new} more, "
                                 f"{len(self._free_pages)} free of {self.num_pages})")
        for _ in range(max(0, new)):
            self._pages[seq].append(self._take_page())
        if new > 0:
            self._dirty.add(seq)

    def _append(self, seq: int, n: int) -> None:
        self._reserve(seq, n)
        if n:
            self._lens[seq] += n
            self._dirty.add(seq)

    def _copy_page(self, src: int, dst: int) -> None:
        # Every layer: the page id is shared by all of them.
        self.k_pools[:, dst].copy_(self.k_pools[:, src])
        self.v_pools[:, dst].copy_(self.v_pools[:, src])
        if self.scale == "vector":  # a per-tensor scale belongs to no page
            self.k_scales[:, dst].copy_(self.k_scales[:, src])
            self.v_scales[:, dst].copy_(self.v_scales[:, src])

    def _flush(self) -> None:
        """Copies the host rows of changed slots into the device tensors (one copy each)."""
        if not self._dirty:
            return
        slots = sorted(self._dirty)
        self._dirty.clear()
        rows = torch.zeros(len(slots), self.max_pages_per_seq, dtype=torch.int32)
        lens = torch.zeros(len(slots), dtype=torch.int32)
        for i, s in enumerate(slots):
            pages = self._pages.get(s)
            if pages:
                rows[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            lens[i] = self._lens.get(s, 0)
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        self.block_tables.index_copy_(0, idx, rows.to(self.device))
        self.seq_lens.index_copy_(0, idx, lens.to(self.device))

    def __repr__(self) -> str:
        return (f"PagedKVCache(layers={self.num_layers}, pages={self.num_pages} ({self.num_free_pages} free), "
                f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, page_size={self.page_size}, "
                f"dtype={self.dtype}, seqs={len(self._pages)}/{self.max_seqs}, device={self.device})")
