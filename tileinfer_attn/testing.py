"""Helpers for tests and benchmarks: random paged problems, poisoning, error measures.

One problem builder serves every test and benchmark, so that all of them walk
the same kind of block tables: pages of a sequence scattered over the pool, and
unused table entries pointing at other sequences' pages (reading past a
sequence's length gives a visibly wrong answer, never a lucky one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from . import reference

__all__ = ["PagedProblem", "make_problem", "poison_", "ulp_error", "rel_error", "ulp"]


@dataclass
class PagedProblem:
    q: torch.Tensor             # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor       # [num_pages, num_kv_heads, page_size, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_pages] int32
    seq_lens: torch.Tensor      # [num_seqs] int32
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    max_q_len: int
    scale: float
    k_scale: Optional[torch.Tensor] = None
    v_scale: Optional[torch.Tensor] = None
    k_smooth: Optional[torch.Tensor] = None

    def args(self):
        """Positional arguments of prefill/attention after `out` (and `lse`), before scale."""
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens, self.cu_seqlens_q,
                self.max_q_len)

    def quant_kwargs(self):
        return dict(k_scale=self.k_scale, v_scale=self.v_scale, k_smooth=self.k_smooth)


def make_problem(
    seq_lens: Sequence[int],
    q_lens: Sequence[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_pages: int = 3,
    extra_table_cols: int = 1,
    int8: bool = False,
    cache_dtype: Optional[torch.dtype] = None,
    scale_kind: str = "vector",
    smooth: bool = True,
) -> PagedProblem:
    """A random varlen batch: sequence i holds seq_lens[i] positions (this step's
    q_lens[i] queries are its last ones), pages shuffled over the pool.

    int8=True (or cache_dtype=torch.int8), cache_dtype=torch.float8_e4m3fn: the
    pools are quantized, with random fp32 scales per vector (``scale_kind="vector"``,
    rounded up to the significant bits the cache writes keep) or, fp8 only, one per pool (``scale_kind="tensor"``), and random smoothing
    factors (``smooth=False``: none); q has `dtype`."""
    if int8:
        cache_dtype = torch.int8
    assert len(seq_lens) == len(q_lens)
    assert all(0 <= n <= L for n, L in zip(q_lens, seq_lens)), "each q_len must be <= its seq_len"
    g = torch.Generator().manual_seed(seed)
    pages_per_seq = [math.ceil(L / page_size) for L in seq_lens]
    max_pages = max(max(pages_per_seq, default=0), 1) + extra_table_cols
    num_pages = sum(pages_per_seq) + spare_pages
    perm = torch.randperm(num_pages, generator=g)
    tables = torch.empty(len(seq_lens), max_pages, dtype=torch.int32)
    used = 0
    for i, n in enumerate(pages_per_seq):
        tables[i, :n] = perm[used:used + n].int()
        used += n
        # Entries past the sequence's pages point at random pages of the pool.
        tables[i, n:] = torch.randint(0, num_pages, (max_pages - n,), generator=g, dtype=torch.int32)
    shape = (num_pages, num_kv_heads, page_size, head_dim)
    k_scale = v_scale = k_smooth = None
    if cache_dtype in (torch.int8, torch.float8_e4m3fn):
        if cache_dtype == torch.int8:
            k_cache = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
            v_cache = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
        else:  # spread over e4m3's range, subnormals included
            k_cache = (torch.randn(shape, generator=g) * 100).clamp(-448, 448).to(cache_dtype)
            v_cache = (torch.randn(shape, generator=g) * 100).clamp(-448, 448).to(cache_dtype)
        scale_shape = shape[:3] if scale_kind == "vector" else (1,)
        k_scale = torch.rand(scale_shape, generator=g) * 0.02 + 0.005
        v_scale = torch.rand(scale_shape, generator=g) * 0.02 + 0.005
        if scale_kind == "vector":  # as the cache writes store them (reference.round_scale_up)
            k_scale, v_scale = (reference.round_scale_up(x, reference.SCALE_BITS[cache_dtype])
                                for x in (k_scale, v_scale))
        k_smooth = torch.rand(num_kv_heads, head_dim, generator=g) * 2 + 0.25
        if not smooth:
            k_smooth = None
    else:
        k_cache = torch.randn(shape, generator=g).to(dtype)
        v_cache = torch.randn(shape, generator=g).to(dtype)
    num_tokens = sum(q_lens)
    q = torch.randn(num_tokens, num_q_heads, head_dim, generator=g).to(dtype)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(list(q_lens), dtype=torch.int64).cumsum(0).int()
    dev = torch.device(device)
    mv = lambda t: None if t is None else t.to(dev)  # noqa: E731
    return PagedProblem(
        q=mv(q), k_cache=mv(k_cache), v_cache=mv(v_cache), block_tables=mv(tables),
        seq_lens=mv(torch.tensor(list(seq_lens), dtype=torch.int32)), cu_seqlens_q=mv(cu),
        max_q_len=max(q_lens, default=0), scale=head_dim ** -0.5,
        k_scale=mv(k_scale), v_scale=mv(v_scale), k_smooth=mv(k_smooth),
    )


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fills an output with NaN (floats) or a sentinel (ints), so unwritten elements show."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(-77)


def ulp(dtype: torch.dtype) -> float:
    """Spacing of `dtype` at 1.0."""
    return torch.finfo(dtype).eps


def ulp_error(out: torch.Tensor, exact: torch.Tensor, dtype: Optional[torch.dtype] = None) -> float:
    """Largest error of ``out`` against ``exact``, in ulps of ``dtype`` at each
    row's magnitude (rows: the last dim): ``|out - exact| / (2^floor(log2(m)) *
    eps(dtype))`` with ``m`` the row's largest ``|exact|`` (the unit no smaller
    than the spacing of ``dtype``'s subnormals). NaN or inf anywhere
    in ``out`` gives inf.

    Args:
        out: the result to measure (any float dtype; compared in float64).
        exact: the yardstick, e.g. ``reference.paged_attention(..., exact=True)``.
        dtype: the floating dtype whose ulp is the unit, typically the element
            type the result was computed in. Default: ``out.dtype``. Pass it
            when ``out`` is held in a wider type than its precision (e.g.
            bf16 attention merged in float64).
    """
    if dtype is None:
        dtype = out.dtype
    if not dtype.is_floating_point:
        raise TypeError(f"ulp_error: dtype must be a floating dtype (the unit is its ulp), got {dtype}")
    o = out.double()
    e = exact.double()
    if not torch.isfinite(o).all():
        return float("inf")
    mag = e.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    # Below the smallest normal the spacing stops shrinking: fp16's subnormals
    # are 2^-24 apart, so a row of magnitude 1e-6 (attention that puts almost
    # all of its probability on a sink) cannot be nearer than that.
    finfo = torch.finfo(dtype)
    unit = (torch.exp2(torch.floor(torch.log2(mag))) * ulp(dtype)).clamp_min(finfo.smallest_normal * finfo.eps)
    return float(((o - e).abs() / unit).max()) if o.numel() else 0.0


def rel_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    """||out - exact|| / ||exact|| (inf on NaN)."""
    o = out.double()
    e = exact.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - e).norm() / e.norm().clamp_min(1e-30))
