"""Paged attention problems built on the GPU, and the implementations that
bench_prefill.py and bench_decode.py time side by side: our ops, torch SDPA
(cuDNN and flash backends) on a contiguous cache, gather-pages-then-SDPA, the
eager reference, and FlashInfer when it imports.

Every callable returned here is `fn(*args)` with its arguments in one tuple per
input set, so common.bench can rotate sets (L2) and capture graphs.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

import common

# ----------------------------------------------------------------------------- problems


@dataclass
class Problem:
    """One input set: a varlen batch over a paged cache (testing.PagedProblem's
    layout), plus what peers need. Sets of one case share the pools (disjoint
    pages), so rotating sets costs no extra pool memory."""
    q: torch.Tensor             # [num_tokens, hq, d]
    k_cache: torch.Tensor       # [num_pages, hkv, page, d]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_pages] int32
    seq_lens: torch.Tensor      # [num_seqs] int32
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    lens: list                  # host copies of seq_lens / q_lens
    q_lens: list
    max_q_len: int
    scale: float

    @property
    def hq(self) -> int:
        return self.q.shape[1]

    @property
    def hkv(self) -> int:
        return self.k_cache.shape[1]

    @property
    def d(self) -> int:
        return self.q.shape[2]

    @property
    def page(self) -> int:
        return self.k_cache.shape[2]

    def uniform(self) -> bool:
        """Same context and query count for every sequence: contiguous peers need it."""
        return len(set(self.lens)) == 1 and len(set(self.q_lens)) == 1


def make_sets(lens: Sequence[int], q_lens: Sequence[int], hq: int, hkv: int, d: int, page: int = 64,
              dtype: torch.dtype = torch.bfloat16, n_sets: int = 1, seed: int = 0) -> list:
    """n_sets random problems with the same shapes, generated on the GPU (the
    CPU builder in tileinfer_attn.testing is too slow for GB-sized caches).
    Pages are shuffled over the shared pool; table entries past a sequence's
    pages point at random pages (as testing.make_problem)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(seed)
    pages = [math.ceil(L / page) for L in lens]
    per_set = sum(pages)
    max_pages = max(pages) + 1
    num_pages = n_sets * per_set + 1
    k_cache = torch.randn(num_pages, hkv, page, d, device=dev, dtype=dtype, generator=g)
    v_cache = torch.randn(num_pages, hkv, page, d, device=dev, dtype=dtype, generator=g)
    perm = torch.randperm(num_pages, device=dev, generator=g).int()
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(list(q_lens)).cumsum(0)
    sets = []
    for s in range(n_sets):
        table = torch.randint(0, num_pages, (len(lens), max_pages), device=dev, dtype=torch.int32, generator=g)
        used = s * per_set
        for i, n in enumerate(pages):
            table[i, :n] = perm[used:used + n]
            used += n
        sets.append(Problem(
            q=torch.randn(sum(q_lens), hq, d, device=dev, dtype=dtype, generator=g),
            k_cache=k_cache, v_cache=v_cache, block_tables=table,
            seq_lens=torch.tensor(list(lens), dtype=torch.int32, device=dev), cu_seqlens_q=cu.to(dev),
            lens=list(lens), q_lens=list(q_lens), max_q_len=max(q_lens), scale=d ** -0.5))
    return sets


def kv_bytes(p: Problem) -> int:
    """Bytes of cache that attention must read: k and v of every position, once."""
    return 2 * sum(p.lens) * p.hkv * p.d * p.k_cache.element_size()


def set_bytes(p: Problem) -> int:
    """Bytes one call touches (cache read, q read, out written): sizes the L2 rotation."""
    return kv_bytes(p) + 2 * p.q.numel() * p.q.element_size()


def attention_flops(p: Problem, causal: bool = True) -> float:
    """2 matmuls x 2 FLOPs x (query, key) pairs x d x query heads. The causal
    count for a full prompt of L is 2*2*L*L/2*d*Hq (half the pairs, the usual
    convention); a step of n < L queries at the end of L positions sees
    n*(L-n) + n*(n+1)/2 pairs; non-causal n*L."""
    total = 0.0
    for L, n in zip(p.lens, p.q_lens, strict=True):
        if not causal:
            pairs = n * L
        elif n == L:
            pairs = L * L / 2
        else:
            pairs = n * (L - n) + n * (n + 1) / 2
        total += 2 * 2 * pairs * p.d * p.hq
    return total


# ----------------------------------------------------------------------------- our ops

def ours_prefill(p: Problem, causal: bool = True):
    out = torch.empty_like(p.q)

    def fn(out, q, kc, vc, bt, sl, cu):
        torch.ops.tileinfer_attn.prefill(out, None, q, kc, vc, bt, sl, cu, p.max_q_len, p.scale, causal)
        return out
    return fn, (out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q)


def with_environment(name: str, value: str, made: tuple) -> tuple:
    """made = (fn, args) of one of ours, with the environment variable
    name=value around every call (a graph's capture included): a launch
    switch that the extension reads at each call."""
    fn, args = made

    def run(*xs):
        with common.environment_variable(name, value):
            return fn(*xs)
    return run, args


def on_decode_row_tile(rows: int, made: tuple) -> tuple:
    """made = (fn, args) of an attention call whose decode launch has 17-32
    packed rows (group x queries), on the decode tile of `rows` (16 or 64)
    rows whatever the launch's rule (decode.cu, decode_small_tile)."""
    return with_environment("TILEINFER_DECODE_ROW_TILE", str(rows), made)


def ours_prefill_per_head(p: Problem, causal: bool = True):
    """ours_prefill with TILEINFER_PREFILL_PER_HEAD=1: the warp-specialized
    kernel with an item per query head, whatever the group."""
    return with_environment("TILEINFER_PREFILL_PER_HEAD", "1", ours_prefill(p, causal))


def ours_attention(p: Problem, causal: bool = True, batch_invariant: bool = False, table_positions: int = 0):
    """The dispatcher: decode + combine for <= 16 queries per sequence, prefill
    for longer ones. table_positions: a block table widened to that many
    positions (as an engine sizes it for its longest context; the extra entries
    repeat page 0), which sets the batch-invariant grid's split count."""
    out = torch.empty_like(p.q)
    bt = p.block_tables
    page = p.k_cache.shape[2]
    if table_positions > bt.shape[1] * page:
        extra = math.ceil(table_positions / page) - bt.shape[1]
        bt = torch.cat([bt, bt[:, :1].expand(-1, extra)], dim=1).contiguous()

    def fn(out, q, kc, vc, bt, sl, cu):
        torch.ops.tileinfer_attn.attention(out, q, kc, vc, bt, sl, cu, p.max_q_len, p.scale, causal,
                                           batch_invariant=batch_invariant)
        return out
    return fn, (out, p.q, p.k_cache, p.v_cache, bt, p.seq_lens, p.cu_seqlens_q)


def ours_attention_variant(p: Problem, window_left: int = -1, soft_cap: float = 0.0, sinks: bool = False,
                           causal: bool = True):
    """The attention op with the per-layer variants: a sliding window, a logits
    soft-cap, learned sinks (one random logit per query head)."""
    out = torch.empty_like(p.q)
    sink = torch.randn(p.hq, device=p.q.device, dtype=torch.float32) if sinks else None

    def fn(out, q, kc, vc, bt, sl, cu):
        torch.ops.tileinfer_attn.attention(out, q, kc, vc, bt, sl, cu, p.max_q_len, p.scale, causal, None, None, None,
                                           window_left, soft_cap, sink)
        return out
    return fn, (out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q)


def ours_decode_combine(p: Problem, splits: int, causal: bool = True, int8: Optional[dict] = None):
    """decode into `splits` fp32 partials, then combine: the attention op's
    decode path with another split count than the dispatcher's
    (decode_num_splits), to measure that choice. int8: the int8 cache to read
    instead of p's (bench_int8's p.int8: k_cache, v_cache, k_scale, v_scale,
    k_smooth)."""
    ops = torch.ops.tileinfer_attn
    t, h, d = p.q.shape
    out = torch.empty_like(p.q)
    po = torch.empty(splits, t, h, d, dtype=torch.float32, device=p.q.device)
    pl = torch.empty(splits, t, h, dtype=torch.float32, device=p.q.device)
    caches = (p.k_cache, p.v_cache) if int8 is None else (int8["k_cache"], int8["v_cache"])
    extra = () if int8 is None else (int8["k_scale"], int8["v_scale"], int8["k_smooth"])

    def fn(out, po, pl, q, kc, vc, bt, sl, cu, *scales):
        ops.decode(po, pl, q, kc, vc, bt, sl, cu, p.max_q_len, p.scale, causal, *scales)
        ops.combine(out, None, po, pl)
        return out
    return fn, (out, po, pl, p.q, *caches, p.block_tables, p.seq_lens, p.cu_seqlens_q, *extra)


# ----------------------------------------------------------------------------- peers

SDPA_BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
}


def gather_contiguous(p: Problem):
    """k, v as [num_seqs, hkv, L, d] (uniform lengths): what a non-paged engine keeps."""
    L, pages = p.lens[0], math.ceil(p.lens[0] / p.page)
    idx = p.block_tables[:, :pages].long()
    k = p.k_cache[idx].permute(0, 2, 1, 3, 4).reshape(len(p.lens), p.hkv, pages * p.page, p.d)[:, :, :L]
    v = p.v_cache[idx].permute(0, 2, 1, 3, 4).reshape(len(p.lens), p.hkv, pages * p.page, p.d)[:, :, :L]
    return k, v


def q_contiguous(p: Problem) -> torch.Tensor:
    """q as [num_seqs, hq, n, d]."""
    n = p.q_lens[0]
    return p.q.view(len(p.lens), n, p.hq, p.d).transpose(1, 2).contiguous()


def _sdpa_causal(p: Problem, causal: bool):
    """SDPA's is_causal aligns the mask top-left; that equals ours (bottom-right)
    only when queries and keys have the same length. One query sees everything."""
    n, L = p.q_lens[0], p.lens[0]
    if not causal or n == 1:
        return False
    if n == L:
        return True
    raise ValueError(f"SDPA is_causal is top-left aligned: needs n_q == n_k (got {n} vs {L})")


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend
    return getattr(SDPBackend, SDPA_BACKENDS[name])


def sdpa_contiguous(p: Problem, backend: str, causal: bool = True):
    """torch SDPA with one backend on a contiguous cache prepared outside the
    timing. GQA through enable_gqa; where the backend refuses it, k and v are
    repeated to hq heads first (noted: the peer then reads group x the bytes)."""
    from torch.nn.attention import sdpa_kernel
    if not p.uniform():
        raise ValueError("contiguous SDPA needs equal lengths")
    is_causal = _sdpa_causal(p, causal)
    be = _sdpa_backend(backend)
    q4 = q_contiguous(p)
    k4, v4 = (t.contiguous() for t in gather_contiguous(p))

    def fn(q4, k4, v4, gqa):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q4, k4, v4, is_causal=is_causal, scale=p.scale, enable_gqa=gqa)
    note = "enable_gqa"
    gqa = p.hq != p.hkv
    try:
        fn(q4, k4, v4, gqa)
    except RuntimeError:
        if not gqa:
            raise
        g = p.hq // p.hkv
        k4, v4 = k4.repeat_interleave(g, dim=1), v4.repeat_interleave(g, dim=1)
        gqa, note = False, f"kv repeated x{g}"
        fn(q4, k4, v4, gqa)
    return fn, (q4, k4, v4, gqa), note


def gather_then_sdpa(p: Problem, backend: str = "flash", causal: bool = True):
    """What an engine without paged kernels does: gather the pages into a
    contiguous buffer, then SDPA. Both are timed."""
    from torch.nn.attention import sdpa_kernel
    if not p.uniform():
        raise ValueError("gather+SDPA here needs equal lengths")
    is_causal = _sdpa_causal(p, causal)
    be = _sdpa_backend(backend)
    n = p.q_lens[0]
    gqa = p.hq != p.hkv

    def fn(q, kc, vc, bt):
        pp = Problem(q, kc, vc, bt, p.seq_lens, p.cu_seqlens_q, p.lens, p.q_lens, p.max_q_len, p.scale)
        k4, v4 = gather_contiguous(pp)
        q4 = q.view(len(p.lens), n, p.hq, p.d).transpose(1, 2)
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q4, k4, v4, is_causal=is_causal, scale=p.scale, enable_gqa=gqa)
    args = (p.q, p.k_cache, p.v_cache, p.block_tables)
    fn(*args)
    return fn, args, f"gather + {backend}"


def eager_reference(p: Problem, causal: bool = True):
    """tileinfer_attn.reference.paged_attention (exact=False): HF-eager-style math."""
    ref = common.load_reference()

    def fn(q, kc, vc, bt, sl, cu):
        return ref.paged_attention(q, kc, vc, bt, sl, cu, p.max_q_len, p.scale, causal)
    return fn, (p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q)


# ----------------------------------------------------------------------------- FlashInfer

_flashinfer: Optional[tuple] = None


def flashinfer_allowed(what: str) -> bool:
    """TILEINFER_FLASHINFER_OPS=decode,prefill (set by gpu_check.sh from its
    warm-up) limits FlashInfer to the kernels that compiled: a failed JIT would
    otherwise be retried, for minutes, at every case."""
    ops = os.environ.get("TILEINFER_FLASHINFER_OPS")
    return ops is None or what in ops.split(",")


def load_flashinfer():
    """(module, None) or (None, reason). TILEINFER_NO_FLASHINFER=1 turns it off
    (its JIT compiles each kernel variant on first use: minutes)."""
    global _flashinfer
    if _flashinfer is None:
        if os.environ.get("TILEINFER_NO_FLASHINFER"):
            _flashinfer = (None, "TILEINFER_NO_FLASHINFER set")
        elif not torch.cuda.is_available():
            _flashinfer = (None, "no CUDA device")
        else:
            try:
                import flashinfer
                _flashinfer = (flashinfer, None)
            except Exception as e:  # noqa: BLE001 -- not installed or broken: skip the peer
                _flashinfer = (None, f"import flashinfer failed: {type(e).__name__}: {e}"[:200])
    return _flashinfer


def _flashinfer_pages(p: Problem):
    """Our block tables as FlashInfer's CSR page list (indptr, indices, last_page_len)."""
    pages = [math.ceil(L / p.page) for L in p.lens]
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(pages).cumsum(0)
    indices = torch.cat([p.block_tables[i, :n] for i, n in enumerate(pages)]).int()
    last = torch.tensor([L - (n - 1) * p.page for L, n in zip(p.lens, pages, strict=True)], dtype=torch.int32)
    dev = p.q.device
    return indptr.to(dev), indices.contiguous(), last.to(dev)


# FlashInfer's workspace: its decode plan for one MQA sequence at 32k positions
# asks 256 MB for its split partials, more than the 128 MB of its examples.
_FI_WORKSPACE_BYTES = 512 << 20


def flashinfer_decode(p: Problem, fp8: Optional[dict] = None):
    """BatchDecodeWithPagedKVCacheWrapper on our pools as they are (layout HND =
    [pages, kv heads, page, d]), tensor-core path for GQA. fp8: an e4m3 cache
    with one scale per tensor (pools and 1-element k_scale / v_scale, as
    bench_int8 builds them), which FlashInfer takes as its calibration
    scales (read once here, outside the timing)."""
    what = "decode_fp8" if fp8 else "decode"
    fi, why = load_flashinfer()
    if fi is None or not flashinfer_allowed(what):
        raise RuntimeError(why or f"its {what} kernel did not compile in the warm-up")
    kc, vc = (fp8["k_cache"], fp8["v_cache"]) if fp8 else (p.k_cache, p.v_cache)
    scales = dict(k_scale=float(fp8["k_scale"]), v_scale=float(fp8["v_scale"])) if fp8 else {}
    ws = torch.empty(_FI_WORKSPACE_BYTES, dtype=torch.uint8, device=p.q.device)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="HND", use_tensor_cores=p.hq != p.hkv)
    indptr, indices, last = _flashinfer_pages(p)
    w.plan(indptr, indices, last, p.hq, p.hkv, p.d, p.page, q_data_type=p.q.dtype, kv_data_type=kc.dtype,
           sm_scale=p.scale)
    out = torch.empty_like(p.q)

    def fn(w, q, kc, vc, out):
        w.run(q, (kc, vc), out=out, **scales)
        return out
    return fn, (w, p.q, kc, vc, out)


def flashinfer_prefill(p: Problem, causal: bool = True):
    """BatchPrefillWithPagedKVCacheWrapper (backend auto: FA3 on Hopper); its
    causal mask is aligned to the end of each sequence, as ours."""
    fi, why = load_flashinfer()
    if fi is None or not flashinfer_allowed("prefill"):
        raise RuntimeError(why or "its prefill kernel did not compile in the warm-up")
    ws = torch.empty(_FI_WORKSPACE_BYTES, dtype=torch.uint8, device=p.q.device)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout="HND")
    indptr, indices, last = _flashinfer_pages(p)
    w.plan(p.cu_seqlens_q, indptr, indices, last, p.hq, p.hkv, p.d, p.page, causal=causal, sm_scale=p.scale,
           q_data_type=p.q.dtype, kv_data_type=p.k_cache.dtype)
    out = torch.empty_like(p.q)

    def fn(w, q, kc, vc, out):
        w.run(q, (kc, vc), out=out)
        return out
    return fn, (w, p.q, p.k_cache, p.v_cache, out)


# ----------------------------------------------------------------------------- checks

def packed_output(p: Problem, result) -> Optional[torch.Tensor]:
    """Any implementation's output as [num_tokens, hq, d] (SDPA returns [B, H, n, d])."""
    if result is None:
        return None
    if result.dim() == 4:
        return result.transpose(1, 2).reshape(-1, p.hq, p.d)
    return result


def rel_diff(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> Optional[float]:
    """||a - b|| / ||b|| in float32: a sanity check that timed code computes attention
    (two bf16 implementations differ by ~1e-3; a broken kernel by ~1)."""
    if a is None or b is None:
        return None
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def timed(label: str, make: Callable, problems: Sequence[Problem], graph: bool, errors: list, **bench_kw):
    """Builds one callable per input set with make(problem) -> (fn, args[, note])
    (fn returns the output), checks that the first call runs, times it rotating
    the sets (graph replay when asked and capturable, else CUDA events), and
    returns (Timing, note, output of the first call), or None after printing why."""
    def build():
        built = [make(p) for p in problems]
        note = built[0][2] if len(built[0]) > 2 else ""
        fn, args = built[0][0], [b[1] for b in built]
        return fn, args, note, fn(*args[0])
    r = common.attempt(f"{label}", build, errors)
    if r is None:
        return None
    fn, args, note, first = r
    t = None
    if graph:
        t = common.attempt(f"{label}: graph capture failed, timing launches instead",
                           lambda: common.bench(fn, args, graph=True, **bench_kw))
    if t is None:
        t = common.attempt(label, lambda: common.bench(fn, args, **bench_kw), errors)
    if t is None:
        return None
    return t, note, first


def gpu_columns(t: "common.Timing") -> dict:
    """The card's state over a timed call (common.gpu_state) as row columns."""
    g = t.gpu or {}
    return dict(sm_mhz=g.get("sm_mhz"), power_w=g.get("power_w"), power_capped=g.get("power_capped"))


def time_impls(label: str, impls: Sequence[tuple], sets: Sequence[Problem], errors: list, *, ours: str,
               base: Sequence[str], metrics: Callable, extra: Optional[dict] = None, **bench_kw) -> list:
    """Times every (name, make, graph[, role]) of one case on the same input
    sets and returns one row each: times, metrics(Timing) (e.g. TFLOP/s, GB/s),
    the role ("ours" for `ours`, else the given one, default "peer"; "dev" marks
    an internal A/B variant that README's plot and tables leave out), the time
    ratio to ours (t / t_ours: above 1 means ours is faster) and the relative
    difference of its output to that of the first of `base` that ran (a sanity
    check, not a test; the row says which in `diff_vs`)."""
    rows, outs = [], {}
    for name, make, graph, *role in impls:
        r = timed(f"{label} {name}", make, sets, graph, errors, **bench_kw)
        if r is None:
            continue
        t, note, out = r
        outs[name] = packed_output(sets[0], out)
        rows.append(dict(case=label, impl=name, role="ours" if name == ours else (role[0] if role else "peer"),
                         **(extra or {}), us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us,
                         mode=t.mode, sets=t.sets, note=note, **gpu_columns(t), **metrics(t)))
        sys.stdout.flush()
    base_name = next((b for b in base if b in outs), None)
    mine = next((r for r in rows if r["impl"] == ours), None)
    for r in rows:
        r["diff_vs"] = base_name
        r["rel_diff"] = None if r["impl"] == base_name else rel_diff(outs.get(r["impl"]), outs.get(base_name))
        r["t_over_ours"] = r["us"] / mine["us"] if mine else None
    return rows


def _fp8_per_tensor(p: Problem) -> dict:
    """p's pools in e4m3 with one scale per tensor, in flashinfer_decode's fp8 form."""
    from bench_int8 import quantize  # (bench_int8 imports this module)
    (k8, ks), (v8, vs) = (quantize(t, torch.float8_e4m3fn, per_tensor=True) for t in (p.k_cache, p.v_cache))
    return dict(k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs)


def warm_flashinfer(head_dims: Sequence[int]) -> None:
    """Runs FlashInfer's decode and prefill once on tiny problems per head dim:
    its JIT compiles each variant on first use (a minute or more each), and
    gpu_check.sh does that in the background while our extension builds."""
    fi, why = load_flashinfer()
    if fi is None:
        print(f"flashinfer warm-up skipped: {why}")
        return
    for d in head_dims:
        kinds = [("decode", [256], [1], flashinfer_decode), ("prefill", [256], [256], flashinfer_prefill)]
        if d == 128:  # bench_int8's head dim: FlashInfer's decode of an fp8 cache, as bench_int8 quantizes it
            kinds.append(("decode_fp8", [256], [1], lambda p: flashinfer_decode(p, _fp8_per_tensor(p))))
        for what, lens, q_lens, make in kinds:
            p = make_sets(lens, q_lens, 32, 8, d)[0]
            t0 = time.time()
            fn_args = common.attempt(f"flashinfer {what} d{d}", lambda make=make, p=p: make(p))
            r = fn_args and common.attempt(f"flashinfer {what} d{d} run", lambda fa=fn_args: fa[0](*fa[1]))
            print(f"flashinfer {what} d{d}: {'ok' if r is not None else 'FAILED'} in {time.time() - t0:.0f} s",
                  flush=True)


if __name__ == "__main__":
    import argparse
    ap_ = argparse.ArgumentParser(description="JIT-compile FlashInfer's kernels ahead of the benchmarks")
    ap_.add_argument("--warm-flashinfer", type=int, nargs="*", default=[128], metavar="HEAD_DIM")
    warm_flashinfer(ap_.parse_args().warm_flashinfer)
