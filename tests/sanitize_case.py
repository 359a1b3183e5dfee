"""A small run of every CUDA attention op, for compute-sanitizer (scripts/sanitize.sh).

Not a pytest module: it calls prefill, decode, combine and attention (and
cache_write / attention_inputs when this build has their CUDA kernels) on tiny
problems that still reach every code path (several page sizes and head dims,
causal and not, GQA groups that take the decode and the prefill path, fp32 and
bf16, int8 and fp8 caches, head dims 80 / 96 on their padded tiles, the
per-layer variants and a tree mask, empty splits, padded batch slots; attention
also with batch_invariant, and with splits merged in clusters), then,
unless --clean-only, the same ops
on bad device metadata (page ids outside the pool, lengths beyond the table or
negative, garbage query offsets), where the kernels must stay inside the
buffers. Prints "sanitize_case: ok" at the end.

--clean-only is for initcheck: with garbage cu_seqlens_q, decode leaves the
partials of tokens of no sequence unwritten and combine reads them (harmless:
those rows are unspecified), which initcheck would report.
"""
import argparse
import dataclasses
import os

import torch

import tileinfer_attn  # noqa: F401  (registers the ops)
from op_helpers import has_cuda_kernel, misalign_scales_
from tileinfer_attn.testing import make_problem, poison_

ops = torch.ops.tileinfer_attn
DEV = "cuda"
FP8 = torch.float8_e4m3fn


def call(op, *args, **kwargs):
    """Calls an op; an argument-check error (a configuration this build rejects)
    is printed and skipped, anything from CUDA itself is raised."""
    try:
        getattr(ops, op)(*args, **kwargs)
    except RuntimeError as e:
        if "CUDA" in str(e):
            raise
        print(f"sanitize_case: {op} skipped: {str(e).splitlines()[0]}", flush=True)


def run_attention_ops(p, splits=4, causal=(True, False), with_prefill=True, variants=None):
    """prefill (with lse; skipped with with_prefill=False), decode + combine,
    attention; `variants`: window_left / logits_soft_cap / sinks / tree_mask
    keywords for all of them (tree_mask for decode and attention only)."""
    t, h, d = p.q.shape
    kw = dict(p.quant_kwargs() if p.k_scale is not None else {}, **(variants or {}))
    prefill_kw = {k: v for k, v in kw.items() if k != "tree_mask"}
    for c in causal:
        if with_prefill and has_cuda_kernel("prefill"):
            out = poison_(torch.empty_like(p.q))
            lse = poison_(torch.empty(t, h, dtype=torch.float32, device=DEV))
            call("prefill", out, lse, *p.args(), p.scale, c, **prefill_kw)
        if has_cuda_kernel("decode") and p.max_q_len <= 16:
            po = poison_(torch.empty(splits, t, h, d, dtype=torch.float32, device=DEV))
            pl = poison_(torch.empty(splits, t, h, dtype=torch.float32, device=DEV))
            call("decode", po, pl, *p.args(), p.scale, c, **kw)
            if has_cuda_kernel("combine"):
                out = poison_(torch.empty_like(p.q))
                lse = poison_(torch.empty(t, h, dtype=torch.float32, device=DEV))
                call("combine", out, lse, po, pl)
        if all(has_cuda_kernel(n) for n in ("prefill", "decode", "combine")):
            for invariant in (False, True):
                call("attention", poison_(torch.empty_like(p.q)), *p.args(), p.scale, c, **kw,
                     batch_invariant=invariant)


def run_input_ops(p):
    """cache_write and attention_inputs, where this build has them."""
    t, _, d = p.q.shape
    kv_heads = p.k_cache.shape[1]
    k = torch.randn(t, kv_heads, d, device=DEV).to(p.q.dtype)
    v = torch.randn(t, kv_heads, d, device=DEV).to(p.q.dtype)
    meta = (p.block_tables, p.seq_lens, p.cu_seqlens_q)
    kw = p.quant_kwargs() if p.k_scale is not None else {}
    if has_cuda_kernel("cache_write"):
        call("cache_write", p.k_cache, p.v_cache, k, v, *meta, **kw)
    if has_cuda_kernel("attention_inputs"):
        cos_sin = torch.randn(4096, d, device=DEV)
        w = torch.randn(d, device=DEV).to(p.q.dtype)
        call("attention_inputs", poison_(torch.empty_like(p.q)), p.k_cache, p.v_cache, p.q, k, v, *meta, cos_sin, d,
             w, w, 1e-6, **kw)


def clean_cases():
    """bf16 at every head dim (with its own page size), fp32 (a separate CUDA-core
    kernel), int8 and fp8 caches (per vector and per tensor) at a few; per shape: decode
    steps, verify-sized steps and full prompts, alternating groups of 4 and 3 (the decode
    path for both, and the prefill path for the full prompts)."""
    seed = 0
    for dtype, head_dim, page, quant in ((torch.bfloat16, 64, 16, {}), (torch.bfloat16, 80, 32, {}),
                                         (torch.bfloat16, 96, 64, {}), (torch.bfloat16, 128, 64, {}),
                                         (torch.bfloat16, 256, 128, {}), (torch.float32, 96, 32, {}),
                                         (torch.float32, 128, 32, {}),
                                         (torch.bfloat16, 128, 32, dict(cache_dtype=torch.int8)),
                                         (torch.float16, 256, 16, dict(cache_dtype=torch.int8)),
                                         (torch.bfloat16, 80, 16, dict(cache_dtype=FP8)),
                                         (torch.float16, 128, 64, dict(cache_dtype=FP8, scale_kind="tensor"))):
        lens = [1, page - 1, page + 1, 3 * page + 5, 0]  # one position, page +- 1, several pages, a padded slot
        for i, q_lens in enumerate(([1, 1, 1, 1, 0], [1, 5, 16, 3, 0], lens)):
            seed += 1
            group = 4 if i % 2 == 0 else 3
            yield make_problem(lens, q_lens, 2 * group, 2, head_dim, page, dtype=dtype, device=DEV, seed=seed,
                               **quant)


def bad_cases():
    """Out-of-range and negative page ids, a length beyond the table, a negative
    length; then the same with garbage cu_seqlens_q. Decode- and prefill-sized steps
    (the last: a chunk of 40 queries after a 30-position prefix, which the Hopper
    kernel's own-keys pass turns into prefix rows over those bad pages)."""
    int8, fp8_tensor = dict(cache_dtype=torch.int8), dict(cache_dtype=FP8, scale_kind="tensor")
    for dtype, q_lens, quant in ((torch.bfloat16, [1, 2, 1, 1], {}), (torch.bfloat16, [5, 3, 20, 1], {}),
                                 (torch.float32, [1, 2, 1, 1], {}), (torch.bfloat16, [1, 2, 1, 1], int8),
                                 (torch.bfloat16, [5, 3, 20, 1], int8), (torch.bfloat16, [5, 3, 20, 1], fp8_tensor),
                                 (torch.bfloat16, [40, 3, 20, 1], int8)):
        p = make_problem([70, 40, 33, 20], q_lens, 8, 2, 64, 16, dtype=dtype, device=DEV, seed=99, **quant)
        num_pages = p.k_cache.shape[0]
        p.block_tables[0, 1] = num_pages + 5
        p.block_tables[1, 0] = -3
        p.block_tables[0, 2] = 2**31 - 1
        p.seq_lens[2] = p.block_tables.shape[1] * 16 + 1000
        p.seq_lens[3] = -7
        yield p
        garbage = torch.tensor([0, 3, 1, 10**6, -5], dtype=torch.int32, device=DEV)
        yield dataclasses.replace(p, cu_seqlens_q=garbage)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean-only", action="store_true", help="skip the bad-metadata cases (for initcheck)")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    present = [n for n in ("prefill", "decode", "combine", "cache_write", "attention_inputs") if has_cuda_kernel(n)]
    print(f"sanitize_case: CUDA kernels in this build: {', '.join(present) or 'none'}", flush=True)
    cases = list(clean_cases()) + ([] if args.clean_only else list(bad_cases()))
    for p in cases:
        run_attention_ops(p)
        run_input_ops(p)
    # The per-layer variants and a tree mask (random bits, some pointing past
    # the step) on a decode-sized step and, without the tree, a prompt.
    for q_lens in ([1, 5, 16, 3, 0], [1, 40, 16, 3, 0]):
        p = make_problem([1, 61, 33, 69, 0], q_lens, 8, 2, 128, 16, device=DEV, seed=5)
        variants = dict(window_left=20, logits_soft_cap=30.0, sinks=torch.randn(8, device=DEV))
        if max(q_lens) <= 16:
            variants["tree_mask"] = torch.randint(-2**31, 2**31 - 1, (p.q.shape[0],), dtype=torch.int32, device=DEV)
        run_attention_ops(p, variants=variants)
    # Prefill-sized steps for the input ops: the queries kernel's 4 rows per
    # thread group (the int8 one with bad page ids too).
    for int8 in (False, True):
        big = make_problem([1500, 977], [1500, 300], 32, 8, 128, 64, dtype=torch.bfloat16, device=DEV, seed=7,
                           int8=int8)
        if int8 and not args.clean_only:
            big.block_tables[0, 3] = big.k_cache.shape[0] + 1
            big.block_tables[1, 0] = -2
        run_input_ops(big)
    # Batches of 70 and 64 sequences x 2 KV heads: the attention op's single
    # split (the decode kernel writes out itself) and, with 4 splits, more
    # blocks than fit two per SM (the int8 decode's 64-key tile); 64 (128
    # pairs): 2 splits on 132 SMs, which the attention op runs as clusters
    # whose blocks merge them through each other's shared memory
    # (cluster_merge.cuh). Then, unless clean only, 3 padding tokens (whose
    # partials combine reads with weight 0, unwritten: initcheck would report
    # them) and bad metadata. Decode-path ops only: racecheck is slow on many
    # blocks.
    for n, int8 in ((70, False), (70, True), (64, False), (64, True)):
        lens = [1 + (7 * i) % 40 for i in range(n)]
        p = make_problem(lens, [1] * n, 8, 2, 128, 16, device=DEV, seed=11, int8=int8)
        run_attention_ops(p, causal=(True,), with_prefill=False)
        if not args.clean_only:
            p = dataclasses.replace(p, q=torch.cat([p.q, p.q[:3]]))
            p.block_tables[0, 0] = p.k_cache.shape[0] + 5
            p.seq_lens[1] = p.block_tables.shape[1] * 16 + 1000
            p.seq_lens[2] = -7
            run_attention_ops(p, causal=(True,), with_prefill=False)
    # A batch-invariant plan whose blocks walk its splits: 41 sequences x 2 KV
    # heads give 3 blocks a pair for 6 partials (pages of 16, a table of 189
    # pages), the short sequences' later splits lse only; 70 give a block a
    # pair, which merges its splits itself (no partials, no combine); then
    # bad metadata.
    for n, int8 in ((41, False), (41, True), (70, False), (70, True)):
        p = make_problem([3000] + [1 + 9 * i for i in range(n - 1)], [1] * n, 8, 2, 128, 16, device=DEV, seed=17,
                         int8=int8)
        run_attention_ops(p, causal=(True,), with_prefill=False)
        if not args.clean_only:
            p.block_tables[0, 100] = p.k_cache.shape[0] + 5
            p.seq_lens[3] = p.block_tables.shape[1] * 16 + 1000
            p.seq_lens[4] = -7
            run_attention_ops(p, causal=(True,), with_prefill=False)
    # Combine over more splits than a row's lanes (32 at d 128, 16 at d 64),
    # which four warps a row share (combine.cuh): decode into 100 splits, and
    # the attention op's own plan for one KV head (MQA), whose few pairs get
    # more than 32 splits.
    for head_dim in (128, 64):
        p = make_problem([5000, 300, 1], [1, 1, 1], 8, 1, head_dim, 16, device=DEV, seed=19)
        run_attention_ops(p, splits=100, causal=(True,), with_prefill=False)
    # The Hopper prefill scheduler's doubles (two row tiles of one sequence and
    # KV head per unit) before its tail of single items: a prompt batch whose
    # keys and values, as max_q_len counts them (28 x 2 pairs x 1200
    # positions, 34 MB), exceed half the L2, with more pairs than its tail (11
    # of 38 row tiles); then, unless clean only, query counts past max_q_len
    # (garbage cu_seqlens_q: a sequence's own row tiles past the launch's) and
    # a bad length.
    lens = [1200] + [100 + (37 * i) % 321 for i in range(27)]
    p = make_problem(lens, lens, 8, 2, 128, 16, device=DEV, seed=13)
    run_attention_ops(p, causal=(True,))
    if not args.clean_only:
        p.cu_seqlens_q[1:] += 500  # sequence 0: 1700 queries, 54 row tiles of its own against the launch's 38
        p.seq_lens[7] = p.block_tables.shape[1] * 16 + 1000
        run_attention_ops(p, causal=(True,))
    # A mixed step with prefill items enough for its prompt chunk to run
    # beside its decodes (two prefill launches sharing the run-time hand-out:
    # prefill.cu, "Mixed steps beside their decodes"), over a bf16 and an
    # int8 cache (whose converter warps take the items the producer hands
    # out); then, unless clean only, query counts past max_q_len and a bad
    # length.
    os.environ["TILEINFER_MIXED_DECODE_SMS"] = "33"
    lens = [1200] + [1 + 37 * i for i in range(20)]
    for int8 in (False, True):
        p = make_problem(lens, [600] + [1] * 20, 8, 2, 128, 16, device=DEV, seed=19, int8=int8)
        run_attention_ops(p, causal=(True,))
        if not args.clean_only:
            p.cu_seqlens_q[1:] += 500  # sequence 0: 1100 queries against max_q_len 600
            p.seq_lens[3] = p.block_tables.shape[1] * 16 + 1000
            run_attention_ops(p, causal=(True,))
    del os.environ["TILEINFER_MIXED_DECODE_SMS"]
    # A 2100-query prompt of a group that is not a power of two, bf16 and
    # int8: on Hopper the warp-specialized kernel with an item per query head
    # (and its converter warps), elsewhere the tile kernel's 128-row tile.
    # Prefill only: the decode path is above.
    for int8 in (False, True):
        run_attention_ops(make_problem([2100, 70], [2100, 3], 6, 2, 128, 64, device=DEV, seed=7, int8=int8),
                          causal=(True,))
    # The tile kernel's 128-row int8 tile on Hopper too: per-vector scales
    # that start off a 16-byte boundary, which the bulk copies cannot take.
    run_attention_ops(misalign_scales_(make_problem([2100, 70], [2100, 3], 6, 2, 128, 64, device=DEV, seed=8,
                                                    int8=True)), causal=(True,))
    torch.cuda.synchronize()
    print(f"sanitize_case: ok ({len(cases)} problems)", flush=True)


if __name__ == "__main__":
    main()
