"""Helpers of the op tests (not a test module): the one place for the oracle
(exact_attention), the error bounds (check_out, check_lse), the calls of the
attention ops on a problem (run_prefill, run_decode, run_combine,
run_attention) and the skips of builds without a CUDA kernel (need).

The `seed` fixture (a reproducible seed per test case) is in conftest.py.

Bounds against float64 attention on the same inputs: bf16 / fp16 outputs
within ULPS ulps of each row's magnitude, fp32 within REL relative error; lse
(fp32 for every dtype) within LSE_REL[dtype] of max(1, |lse|): bf16 / fp16
scores come from tensor cores, whose fp32 accumulation is not IEEE-rounded.
"""
import math
import os
import re

import pytest
import torch

from tileinfer_attn import reference
from tileinfer_attn.testing import make_problem, poison_, rel_error, ulp_error

ops = torch.ops.tileinfer_attn

# Every head dim the ops take (tile_table.h); 80 and 96 run on 128's kernels.
HEAD_DIMS = [64, 80, 96, 128, 256]
ULPS = 4.0  # bf16 / fp16 outputs
REL = 1e-5  # fp32 outputs
LSE_REL = {torch.float32: 1e-5, torch.bfloat16: 1e-4, torch.float16: 1e-4}

# Parametrization of tests that run on both devices: CUDA cases are gpu-marked
# and skip without a device.
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ]),
]


# ------------------------------------------------------------------ builds and skips
def has_cuda_kernel(op: str) -> bool:
    """Whether this build registers a CUDA kernel for torch.ops.tileinfer_attn.<op>."""
    return torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key(
        f"tileinfer_attn::{op}", "CUDA")


def need(*names: str) -> None:
    """Skips the test unless this build has CUDA kernels for all the ops named."""
    missing = [n for n in names if not has_cuda_kernel(n)]
    if missing:
        pytest.skip(f"this build has no CUDA kernel for {', '.join('tileinfer_attn::' + n for n in missing)}")


# The CUDA kernels behind each way of computing attention: `attention` itself
# is always registered; it calls prefill, or decode + combine.
PATH_KERNELS = {"prefill": ("prefill",), "decode": ("decode", "combine"),
                "attention": ("prefill", "decode", "combine")}


def need_path(path: str) -> None:
    """need() for the kernels behind a test path: "prefill", "decode" (+ combine) or "attention"."""
    need(*PATH_KERNELS[path])


def call_or_skip_not_implemented(fn, *args, **kwargs):
    """Calls an op on CUDA; skips the test if the op says it is not implemented
    on CUDA yet (partial builds), re-raises anything else."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, NotImplementedError) as e:
        if "not implemented" in str(e).lower():
            pytest.skip(f"not implemented on CUDA in this build: {str(e).splitlines()[0]}")
        raise


# ------------------------------------------------------------------ oracle and bounds
def exact_attention(p, causal, **variants):
    """float64 (out, lse) of a problem (an int8 problem's cache dequantized with
    its k_scale / v_scale / k_smooth), with the per-layer `variants`
    (window_left, logits_soft_cap, sinks) if given. A sequence with queries
    but no position (seq_lens <= 0) is given one position on no page, which
    the reference treats the same way: its rows see nothing (it cannot reduce
    over zero positions)."""
    lens = p.seq_lens.clone()
    tables = p.block_tables.clone()
    empty = lens <= 0
    lens[empty] = 1
    tables[empty] = -1
    return reference.paged_attention(p.q, p.k_cache, p.v_cache, tables, lens, p.cu_seqlens_q, p.max_q_len,
                                     p.scale, causal, k_scale=p.k_scale, v_scale=p.v_scale, k_smooth=p.k_smooth,
                                     **variants, exact=True, return_lse=True)


def window_first_page(length, n, page, window_left):
    """The page of the first key that the first of a sequence's n queries
    sees (it sits at length - n): where decode's split ranges start and
    before which no kernel reads a page. 0 without a window."""
    if window_left < 0:
        return 0
    return max(0, length - n - window_left) // page


# Quantized caches of the tests: id -> testing.make_problem's arguments.
QUANT_KINDS = {
    "int8": dict(cache_dtype=torch.int8),
    "fp8-vector": dict(cache_dtype=torch.float8_e4m3fn),
    "fp8-tensor": dict(cache_dtype=torch.float8_e4m3fn, scale_kind="tensor"),
}
# The same, plus the unquantized cache (the queries' dtype): "bf16".
CACHE_KINDS = {"bf16": {}, **QUANT_KINDS}


def poison_unowned_(p, window_left=-1):
    """NaN in every cache slot that no kernel may let into a result: slots of
    no sequence's positions (past a sequence's end, spare pages) and, with a
    window, every slot of the pages before the page of the first key that a
    sequence's first query of the step sees (pages wholly outside every
    query's window: never read). A quantized cache gets NaN scales there (per
    vector), and an fp8 one NaN elements too (int8 has no NaN).
    A kernel that reads such a slot into a product (0 * NaN in P V included)
    gives NaN. Compute the oracle first: the reference reads every page it
    gathers."""
    num_pages, _, page, _ = p.k_cache.shape
    owned = torch.zeros(num_pages, page, dtype=torch.bool)
    tables = p.block_tables.cpu()
    cu = p.cu_seqlens_q.tolist()
    for s, length in enumerate(p.seq_lens.tolist()):
        first = window_first_page(length, cu[s + 1] - cu[s], page, window_left)
        pos = torch.arange(first * page, max(length, 0))
        pid = tables[s, pos // page].long()
        ok = (pid >= 0) & (pid < num_pages)
        owned[pid[ok], (pos % page)[ok]] = True
    bad = ~owned.to(p.k_cache.device)[:, None, :].expand(-1, p.k_cache.shape[1], -1)
    if p.k_scale is not None and p.k_scale.numel() > 1:
        p.k_scale[bad] = float("nan")
        p.v_scale[bad] = float("nan")
    if p.k_cache.dtype == torch.float8_e4m3fn:  # 0x7f: e4m3's NaN (no masked_fill for float8)
        p.k_cache.view(torch.uint8)[bad] = 0x7F
        p.v_cache.view(torch.uint8)[bad] = 0x7F
    elif p.k_cache.dtype != torch.int8:
        p.k_cache[bad] = float("nan")
        p.v_cache[bad] = float("nan")
    return p


def hopper() -> bool:
    """A compute-capability 9.0 device: the one the warp-specialized prefill kernel runs on."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def kernels_run(fn):
    """Names of the CUDA kernels that fn() runs (torch profiler), and fn()'s result."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()], result


def prefill_consumers(names):
    """The consumer warpgroup counts ("2", "3") of the warp-specialized
    Hopper prefill kernels among kernel names (kernels_run's), from each
    name's PrefillTile<QT, D, CacheT, vector scales, consumers> (a name
    without the last argument, its default, is "2"); sorted, each once."""
    tiles = [m.group(1).split(", ") for n in names if "sm90::prefill_kernel" in n
             for m in [re.search(r"PrefillTile<([^<>]*)>", n)] if m]
    return sorted({args[4] if len(args) > 4 else "2" for args in tiles})


def hopper_quantized_prefill(p):
    """Whether `prefill` runs problem p (a quantized cache) on the Hopper
    warp-specialized kernel: a compute-capability 9.0 device, bf16 / fp16
    queries, head dims up to 128, per-vector scales and k_smooth starting
    16-byte aligned (and a build with sm_90a code, setup.py's default), unless
    TILEINFER_PREFILL_KERNEL=tile sends it to the tile kernel. That kernel
    rounds int8 problems' queries to fp16, as for fp8."""
    aligned = p.k_scale.numel() == 1 or (p.k_scale.data_ptr() % 16 == 0 and p.v_scale.data_ptr() % 16 == 0)
    aligned = aligned and (p.k_smooth is None or p.k_smooth.data_ptr() % 16 == 0)
    forced = os.environ.get("TILEINFER_PREFILL_KERNEL") == "tile"
    return hopper() and not forced and p.q.dtype in (torch.bfloat16, torch.float16) and p.q.shape[-1] <= 128 and aligned


def misaligned_copy(t):
    """A copy of t in a contiguous view one element into a larger buffer, so
    that it starts past a 16-byte boundary (valid input; t.contiguous() of it
    is the view itself)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0 and view.is_contiguous()
    return view


def misalign_scales_(p):
    """Moves p's per-vector scales to views that start 4 bytes past a 16-byte
    boundary (misaligned_copy: valid input, which the bulk copies cannot
    take, so `prefill` runs the mma.sync tile kernel)."""
    p.k_scale, p.v_scale = misaligned_copy(p.k_scale), misaligned_copy(p.v_scale)
    return p


def kernel_queries(p, prefill=False):
    """The queries as the quantized-cache kernels' products see them, as
    float64: x = q * k_smooth in fp32 (each query head times its KV head's
    factors; q alone without k_smooth), then per (token, head) row x * 2^(14 -
    e) with the row's max |x| in [2^(e-1), 2^e), rounded half-even to an
    integer (int8 cache on the tile kernels: 15 bits) or to fp16 (fp8 cache;
    int8 too where `prefill` runs on the Hopper kernel, with prefill=True),
    times 2^(e - 14)."""
    group = p.q.shape[1] // p.k_cache.shape[1]
    x = p.q.float()
    if p.k_smooth is not None:
        x = x * p.k_smooth.repeat_interleave(group, 0)[None]
    amax = x.abs().amax(dim=-1, keepdim=True)
    _, e = torch.frexp(amax)
    scale = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), (14 - e).clamp(max=126)), torch.ones_like(amax))
    if p.k_cache.dtype == torch.int8 and not (prefill and hopper_quantized_prefill(p)):
        q = torch.round(x * scale).clamp(-16384, 16384)
    else:
        q = (x * scale).half()
    return q.double() / scale.double()


_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    """The tensor's bits as integers, for bit-for-bit comparisons (NaN == NaN, -0 != +0)."""
    return t.contiguous().view(_INT_OF_SIZE[t.element_size()])


def check_out(out, exact, dtype, what, ulps=ULPS):
    """An output against float64: finite, and within `ulps` ulps of each row's
    magnitude (bf16 / fp16) or REL relative error (fp32). Returns the error."""
    assert torch.isfinite(out).all(), f"{what}: NaN / inf (unwritten or invalid) in rows that must be written"
    if dtype == torch.float32:
        err = rel_error(out, exact)
        assert err <= REL, f"{what}: relative error {err:.3g} > {REL}"
    else:
        err = ulp_error(out, exact, dtype)
        assert err <= ulps, f"{what}: {err:.2f} ulps > {ulps}"
    return err


def check_lse(lse, exact_lse, dtype, what, rel=None):
    """An lse against float64: no NaN, -inf exactly where the exact one is
    (rows that see nothing), elsewhere within `rel` (default LSE_REL of the
    output's `dtype`) relative of max(1, |lse|)."""
    rel = LSE_REL[dtype] if rel is None else rel
    lse = lse.double()
    assert not torch.isnan(lse).any(), f"{what}: NaN in lse"
    seen = torch.isfinite(exact_lse)
    assert torch.equal(torch.isfinite(lse), seen), f"{what}: lse finite where exact is -inf (or the reverse)"
    assert torch.all(lse[~seen] == float("-inf")), f"{what}: rows that see nothing must have lse = -inf"
    if seen.any():
        err = ((lse[seen] - exact_lse[seen]).abs() / exact_lse[seen].abs().clamp_min(1.0)).max().item()
        assert err <= rel, f"{what}: lse error {err:.3g} > {rel}"


def check_neutral_splits(po, pl, p, splits, window_left=-1, sinks=None):
    """Splits past a sequence's pages write the neutral partial: out 0, lse
    -inf (split 0 holds the sink, if any: not neutral)."""
    page = p.k_cache.shape[2]
    cu = p.cu_seqlens_q.tolist()
    for s, length in enumerate(p.seq_lens.tolist()):
        first = window_first_page(length, cu[s + 1] - cu[s], page, window_left)
        pages = math.ceil(length / page) - first
        per = math.ceil(pages / splits)
        for i in range(1 if sinks is not None else 0, splits):
            if i * per >= pages:
                rows = slice(cu[s], cu[s + 1])
                assert torch.all(po[i, rows] == 0) and torch.all(pl[i, rows] == float("-inf")), \
                    f"split {i} of sequence {s} has no pages but is not neutral"


def split_pages(length, page, i, splits, first_page=0):
    """Positions [lo, hi) of split i of `splits` over a sequence of `length`
    positions: pages first_page + [i * ceil(P / S), (i + 1) * ceil(P / S)) of
    its P pages from first_page on (window_first_page; 0 without a window)."""
    pages = -(-max(length, 0) // page) - first_page
    per = -(-pages // splits)
    base = first_page * page
    return min(length, base + i * per * page), min(length, base + (i + 1) * per * page)


def split_exact(p, s, lo, hi, causal, **variants):
    """float64 (out, lse) of sequence s's queries over its positions [lo, hi)
    alone (lo on a page boundary; causal as in the whole sequence; the
    per-layer `variants` as given, sinks included): the reference with the
    sequence's other pages marked outside the pool and the other sequences'
    queries dropped. Rows that see none: out 0, lse -inf (or the sink)."""
    page = p.k_cache.shape[2]
    first, end = lo // page, -(-hi // page) if hi > lo else 0  # pages kept: [first, end)
    tables = p.block_tables.clone()
    tables[s, :first] = -1
    tables[s, max(first, end):] = -1
    cu = p.cu_seqlens_q.clone()
    b, e = cu[s].item(), cu[s + 1].item()
    cu[:s + 1], cu[s + 1:] = b, e
    out, lse = reference.paged_attention(p.q, p.k_cache, p.v_cache, tables, p.seq_lens, cu, p.max_q_len, p.scale,
                                         causal, **variants, exact=True, return_lse=True)
    return out[b:e], lse[b:e]


# ------------------------------------------------------------------ the ops on a problem
# Outputs are poisoned with NaN first, so unwritten elements show. An int8
# problem's k_scale / v_scale / k_smooth go in as keywords (prefill,
# attention) and positionally (decode): both forms of the schema's optional
# trailing tensors. For other problems they are None. `variants`: the
# per-layer window_left / logits_soft_cap / sinks keywords, passed through.
def run_prefill(p, causal, with_lse=True, scale=None, guard=0, **variants):
    """prefill's (out, lse); lse None without with_lse. With guard > 0, out and
    lse are views into buffers with `guard` poisoned tokens on either side,
    returned too: (out, lse, out_buffer, lse_buffer)."""
    t, h, d = p.q.shape
    big = poison_(torch.empty(t + 2 * guard, h, d, dtype=p.q.dtype, device=p.q.device))
    big_lse = poison_(torch.empty(t + 2 * guard, h, dtype=torch.float32, device=p.q.device))
    out = big[guard:guard + t]
    lse = big_lse[guard:guard + t] if with_lse else None
    ops.prefill(out, lse, *p.args(), p.scale if scale is None else scale, causal, **p.quant_kwargs(), **variants)
    if guard:
        return out, lse, big, big_lse
    return out, lse


def run_decode(p, causal, splits, **variants):
    """decode's (partial_out, partial_lse) with `splits` splits."""
    t, h, d = p.q.shape
    po = poison_(torch.empty(splits, t, h, d, dtype=torch.float32, device=p.q.device))
    pl = poison_(torch.empty(splits, t, h, dtype=torch.float32, device=p.q.device))
    ops.decode(po, pl, *p.args(), p.scale, causal, p.k_scale, p.v_scale, p.k_smooth, **variants)
    return po, pl


def run_combine(po, pl, dtype, with_lse=True):
    """combine's (out, lse), out of `dtype`; lse None without with_lse."""
    _, t, h, d = po.shape
    out = poison_(torch.empty(t, h, d, dtype=dtype, device=po.device))
    lse = poison_(torch.empty(t, h, dtype=torch.float32, device=po.device)) if with_lse else None
    ops.combine(out, lse, po, pl)
    return out, lse


def run_attention(p, causal, positional=False, **variants):
    """The attention op's out; positional: the int8 arguments given positionally."""
    out = poison_(torch.empty_like(p.q))
    if positional:
        ops.attention(out, *p.args(), p.scale, causal, p.k_scale, p.v_scale, p.k_smooth, **variants)
    else:
        ops.attention(out, *p.args(), p.scale, causal, **p.quant_kwargs(), **variants)
    return out


# ------------------------------------------------------------------ valid calls of every op
def sample_args(op: str, device: str, quant=False, variants: bool = False) -> dict:
    """Keyword arguments of a small valid call of torch.ops.tileinfer_attn.<op>
    (bf16, 2 sequences, 8 query / 2 KV heads, head_dim 64, page 16); `quant`:
    a quantized cache (a QUANT_KINDS name, or True for int8); with
    `variants`, the attention ops also get a window, a soft-cap and sinks
    (and attention batch_invariant=True)."""
    kind = QUANT_KINDS["int8" if quant is True else quant] if quant else {}
    p = make_problem([20, 5], [3, 1], 8, 2, 64, 16, dtype=torch.bfloat16, device=device, **kind)
    t, hq, d = p.q.shape
    meta = dict(block_tables=p.block_tables, seq_lens=p.seq_lens, cu_seqlens_q=p.cu_seqlens_q)
    cache = dict(k_cache=p.k_cache, v_cache=p.v_cache, **meta)
    if quant:
        cache.update(p.quant_kwargs())
    att = dict(q=p.q, **cache, max_q_len=p.max_q_len, scale=p.scale, causal=True)
    if variants:
        att.update(window_left=5, logits_soft_cap=20.0,
                   sinks=torch.randn(hq, generator=torch.Generator().manual_seed(1)).to(device))
    kv = dict(k=torch.randn(t, 2, d, device=device).bfloat16(), v=torch.randn(t, 2, d, device=device).bfloat16())
    f32 = dict(dtype=torch.float32, device=device)
    cos_sin = torch.randn(64, d, **f32)
    if op == "prefill":
        return dict(out=torch.empty_like(p.q), lse=torch.empty(t, hq, **f32), **att)
    if op == "decode":
        return dict(partial_out=torch.empty(2, t, hq, d, **f32), partial_lse=torch.empty(2, t, hq, **f32), **att)
    if op == "attention":
        return dict(out=torch.empty_like(p.q), **att, **(dict(batch_invariant=True) if variants else {}))
    if op == "combine":
        return dict(out=torch.empty(t, hq, d, dtype=torch.bfloat16, device=device), lse=torch.empty(t, hq, **f32),
                    partial_out=torch.randn(3, t, hq, d, **f32), partial_lse=torch.randn(3, t, hq, **f32))
    if op == "rms_norm":
        return dict(out=torch.empty_like(p.q), x=p.q, weight=torch.ones(d, dtype=torch.bfloat16, device=device),
                    eps=1e-6)
    if op == "rope":
        return dict(out=torch.empty_like(p.q), x=p.q, positions=torch.arange(t, device=device),
                    cos_sin_cache=cos_sin, rotary_dim=d)
    if op == "cache_write":
        return dict(**cache, **kv)
    if op == "attention_inputs":
        w = torch.ones(d, dtype=torch.bfloat16, device=device)
        return dict(q_out=torch.empty_like(p.q), q=p.q, **kv, **cache, cos_sin_cache=cos_sin, rotary_dim=d,
                    q_norm_weight=w, k_norm_weight=w, eps=1e-6)
    raise AssertionError(op)


# ------------------------------------------------------------------ decode steps under a CUDA graph
class GrowingDecodeBatch:
    """num_seqs sequences (start lengths `start`) decoding one token per step
    for up to `steps` steps, over two copies of randomly filled pools (one for
    the graph, one for eager calls), with the static buffers a captured step
    reads on every replay: q / k / v, block_tables, seq_lens, cu_seqlens_q,
    out. The host keeps its own copy of the table (-1: no page yet) and the
    lengths; grow() moves every sequence one position on."""

    def __init__(self, g, num_seqs, kv_heads, group, start, steps, page=16, d=128, dtype=torch.bfloat16,
                 device="cuda"):
        self.g, self.num_seqs, self.page, self.dtype = g, num_seqs, page, dtype
        max_pages = math.ceil((max(start) + steps) / page) + 1
        num_pages = num_seqs * max_pages + 3
        self.pools = [torch.randn(num_pages, kv_heads, page, d, generator=g).to(dtype).to(device) for _ in range(2)]
        self.eager_pools = [t.clone() for t in self.pools]
        self.free = torch.randperm(num_pages, generator=g).tolist()
        self.table = torch.full((num_seqs, max_pages), -1, dtype=torch.int32)
        self.lens = list(start)
        for s, length in enumerate(self.lens):
            for j in range(math.ceil(length / page)):
                self.table[s, j] = self.free.pop()
        self.scale = d ** -0.5
        self.q = torch.empty(num_seqs, group * kv_heads, d, dtype=dtype, device=device)
        self.k = torch.empty(num_seqs, kv_heads, d, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.block_tables = self.table.to(device)
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
        self.out = torch.empty_like(self.q)

    def grow(self):
        """Every sequence one position longer (a new page when it crosses a
        boundary), new random q / k / v: copied into the static buffers."""
        for s in range(self.num_seqs):
            if self.lens[s] % self.page == 0:
                self.table[s, self.lens[s] // self.page] = self.free.pop()
            self.lens[s] += 1
        for dst in (self.q, self.k, self.v):
            dst.copy_(torch.randn(dst.shape, generator=self.g).to(self.dtype))
        self.block_tables.copy_(self.table)
        self.seq_lens.copy_(torch.tensor(self.lens, dtype=torch.int32))

    def capture(self, step):
        """step(k_pool, v_pool, out, q, k, v, block_tables, seq_lens) on the
        graph's pools and static buffers, warmed up on a side stream, then
        captured; returns the graph."""
        args = (*self.pools, self.out, self.q, self.k, self.v, self.block_tables, self.seq_lens)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(*args)  # warm-up (writes this step's k / v: the same values)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(*args)
        return graph

    def eager(self, step):
        """The same step on the eager pools and copies of the buffers: its out (poisoned first)."""
        out = poison_(torch.empty_like(self.out))
        step(*self.eager_pools, out, self.q.clone(), self.k.clone(), self.v.clone(), self.block_tables.clone(),
             self.seq_lens.clone())
        return out
