"""GPU tests of the attention ops end to end: prefill, decode + combine, combine
alone and the `attention` dispatcher, called as torch.ops.tileinfer_attn.*,
against float64 attention on the same inputs.

Complements tests/test_attention_kernels_gpu.py (each kernel's mechanisms, decode
checked through its partials): here every result goes through the CUDA ops a
model calls, including the combine kernel. Every case draws fresh random inputs
(a seed per test id) and poisons outputs with NaN first, so unwritten elements
fail. Tolerances (op_helpers): bf16 / fp16 within ULPS ulps of each row's
magnitude, fp32 within REL relative error, lse within LSE_REL.

Order matters at the end: the adversarial-metadata tests come last, so that a
kernel that faults (and kills the CUDA context) cannot hide other results.
"""
import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch

import tileinfer_attn
from op_helpers import (HEAD_DIMS, ULPS, GrowingDecodeBatch, bits, check_lse, check_out, exact_attention,
                        has_cuda_kernel, hopper, kernels_run, misaligned_copy, need, need_path, run_attention,
                        run_combine, run_decode, run_prefill)
from tileinfer_attn import reference
from tileinfer_attn.testing import make_problem, poison_

pytestmark = pytest.mark.gpu

ops = torch.ops.tileinfer_attn
DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


# ------------------------------------------------------------------ helpers
def real_rows(p):
    """Number of tokens that belong to a sequence (the rows a test may check)."""
    return int(p.cu_seqlens_q[-1])


def with_padding_tokens(p, n):
    """The problem with n extra tokens after cu_seqlens_q[-1] (a padded step)."""
    pad = torch.randn(n, *p.q.shape[1:], device=DEV).to(p.q.dtype)
    return dataclasses.replace(p, q=torch.cat([p.q, pad]))


# ------------------------------------------------------------------ prefill
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill(dtype, head_dim, page, causal, seed):
    need("prefill")
    # lengths 1, page-1, page, page+1, several pages; full prompts and chunked
    # prefill (fewer queries than positions); GQA 4.
    seq_lens = [1, page - 1, page, page + 1, 3 * page + 7]
    q_lens = [1, page - 1, page // 2, 1, 2 * page + 3]
    p = make_problem(seq_lens, q_lens, 8, 2, head_dim, page, dtype=dtype, device=DEV, seed=seed)
    out, lse = run_prefill(p, causal)
    exact, exact_lse = exact_attention(p, causal)
    check_out(out, exact, dtype, "prefill out")
    check_lse(lse, exact_lse, dtype, "prefill lse")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 6, 8, 16])
def test_prefill_group_sizes(group, causal, seed):
    """MHA, GQA of every power of two up to 16, and groups of 3 and 6."""
    need("prefill")
    p = make_problem([37, 200, 64, 130], [37, 100, 1, 17], 2 * group, 2, 128, 64, device=DEV, seed=seed)
    out, lse = run_prefill(p, causal)
    exact, exact_lse = exact_attention(p, causal)
    check_out(out, exact, torch.bfloat16, f"prefill group {group}")
    check_lse(lse, exact_lse, torch.bfloat16, f"prefill group {group} lse")


@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("head_dim", [80, 96])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_padded_head_dims(dtype, head_dim, group, seed):
    """Head dims 80 and 96 (run on head dim 128's kernels, zeros past the row)
    on each prefill kernel: the Hopper one (groups 1, 8 packed, group 3 an
    item per query head), fp32's; a prompt of 2100 queries for the larger
    tiles."""
    need("prefill")
    p = make_problem([2100, 200, 64, 1], [2100, 100, 17, 1], 2 * group, 2, head_dim, 64, dtype=dtype, device=DEV,
                     seed=seed)
    out, lse = run_prefill(p, True)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, f"prefill d {head_dim} group {group}")
    check_lse(lse, exact_lse, dtype, f"prefill d {head_dim} group {group} lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_long(dtype, seed):
    """A 4000-position prompt, plus a chunk of 333 queries at the end of another 4000."""
    need("prefill")
    p = make_problem([4000, 4000, 70], [4000, 333, 70], 4, 1, 128, 64, dtype=dtype, device=DEV, seed=seed)
    out, lse = run_prefill(p, True)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, "prefill long")
    check_lse(lse, exact_lse, dtype, "prefill long lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_without_lse(dtype, seed):
    need("prefill")
    p = make_problem([300, 45], [120, 45], 8, 2, 128, 32, dtype=dtype, device=DEV, seed=seed)
    out, _ = run_prefill(p, True, with_lse=False)
    check_out(out, exact_attention(p, True)[0], dtype, "prefill without lse")


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefix_suffix_merged_by_combine(dtype, page, head_dim, seed):
    """Shared-prefix (cascade) use: the first P pages non-causal, the rest causal,
    both prefill with lse, merged by combine, equal one causal pass over all
    pages, at every head dim (each prefill kernel's lse). The halves are
    rounded to the element type before the merge, so bf16/fp16 get one more
    ulp than a single pass."""
    need("prefill", "combine")
    P = 3
    lens = [5 * page + 37, 4 * page + 1]
    # every query after the prefix (n <= length - P * page), so the prefix is fully visible to all
    p = make_problem(lens, [40, page + 1], 8, 2, head_dim, page, dtype=dtype, device=DEV, seed=seed)
    halves = []
    for tables, seq_lens, causal in (
        (p.block_tables[:, :P], [P * page] * 2, False),
        (p.block_tables[:, P:], [L - P * page for L in lens], True),
    ):
        part = dataclasses.replace(p, block_tables=tables.contiguous(),
                                   seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV))
        halves.append(run_prefill(part, causal))
    po = torch.stack([h[0].float() for h in halves])
    pl = torch.stack([h[1] for h in halves])
    out, lse = run_combine(po, pl, dtype)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, "prefix + suffix merged", ulps=ULPS + 1)
    check_lse(lse, exact_lse, dtype, "prefix + suffix merged lse")


# ------------------------------------------------------------------ decode + combine
@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_combine(dtype, head_dim, page, seed):
    """Plain decode (one query per sequence) through decode + combine."""
    need("decode", "combine")
    p = make_problem([1, page - 1, page, page + 1, 5 * page + 3], [1] * 5, 8, 2, head_dim, page, dtype=dtype,
                     device=DEV, seed=seed)
    po, pl = run_decode(p, True, 4)
    out, lse = run_combine(po, pl, dtype)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, "decode + combine")
    check_lse(lse, exact_lse, dtype, "decode + combine lse")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 7, 8, 16, 32])
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_decode_steps(n, group, causal, seed):
    """Steps of n queries per sequence (decode, speculative verify) for groups of
    every power of two up to 32 (up to 32 packed rows the 16-row tile, a
    block per 16 rows, as decode runs them with these 16 or 8 splits; more
    the 64-row tile), 3, 5 and 7 (Qwen2.5's 40/8 and
    28/4), causal within the step or not."""
    need("decode", "combine")
    p = make_problem([n, 70, 300], [n] * 3, 2 * group, 2, 128, 64, device=DEV, seed=seed)
    po, pl = run_decode(p, causal, 8 if n > 8 else 16)
    out, lse = run_combine(po, pl, torch.bfloat16)
    exact, exact_lse = exact_attention(p, causal)
    check_out(out, exact, torch.bfloat16, f"decode n={n} group={group}")
    check_lse(lse, exact_lse, torch.bfloat16, f"decode n={n} group={group} lse")


@pytest.mark.parametrize("max_q_len", [16, 12])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_mixed_query_counts(dtype, max_q_len, seed):
    """Different query counts per sequence in one step (one with none); max_q_len
    is a host upper bound, not necessarily reached."""
    need("decode", "combine")
    p = make_problem([5, 100, 16, 1000, 40, 9], [1, 3, 12, 7, 0, 9], 8, 2, 128, 32, dtype=dtype, device=DEV,
                     seed=seed)
    p = dataclasses.replace(p, max_q_len=max_q_len)
    po, pl = run_decode(p, True, 8)
    out, lse = run_combine(po, pl, dtype)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, "decode mixed n")
    check_lse(lse, exact_lse, dtype, "decode mixed n lse")


@pytest.mark.parametrize("splits", [1, 2, 3, 8, 32])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_split_counts(dtype, splits, seed):
    """A long context (4000) next to short ones, several split counts: more
    splits than pages leaves neutral splits; the result must not change."""
    need("decode", "combine")
    p = make_problem([4000, 1, 130, 64], [1, 1, 4, 1], 8, 2, 128, 64, dtype=dtype, device=DEV, seed=seed)
    po, pl = run_decode(p, True, splits)
    assert torch.isfinite(po).all() and not torch.isnan(pl).any(), "decode left partials unwritten (NaN)"
    out, lse = run_combine(po, pl, dtype)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, dtype, f"decode {splits} splits")
    check_lse(lse, exact_lse, dtype, f"decode {splits} splits lse")


def batch_for_splits(kv_heads, splits, at_least=1):
    """The smallest batch of at least `at_least` sequences to which the
    attention op's default rule gives `splits` splits on this card (None if
    none does)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return next((b for b in range(at_least, 4096) if ops.decode_num_splits(sms, b, kv_heads) == splits), None)


@pytest.mark.parametrize("misaligned_out", [False, True], ids=["out", "misaligned-out"])
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("int8", [False, True], ids=["cache", "int8-cache"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_single_split_writes_out(dtype, head_dim, int8, n, misaligned_out, seed):
    """A batch large enough for one decode split per (sequence, KV head): the
    attention op has the decode kernel write `out` itself (no partials, no
    combine). It must give the bits of decode with one split + combine, 0 on
    padding tokens and on empty batch slots, and write through a misaligned view."""
    need_path("attention")
    if int8 and dtype == torch.float32:
        pytest.skip("the int8 cache takes bf16 / fp16 queries")
    kv_heads, group = 4, 4
    seqs = batch_for_splits(kv_heads, 1)
    g = torch.Generator().manual_seed(seed)
    lens = [0, 1, 15, 16, 17, 63, 64, 65, n] + torch.randint(n, 700, (seqs - 9,), generator=g).tolist()
    q_lens = [min(n, L) for L in lens]
    p = make_problem(lens, q_lens, kv_heads * group, kv_heads, head_dim, 16, dtype=dtype, device=DEV, seed=seed,
                     int8=int8)
    p = dataclasses.replace(with_padding_tokens(p, 3), max_q_len=n)
    t, h, d = p.q.shape
    out = poison_(torch.empty_like(p.q))
    if misaligned_out:  # one element past a 16-byte boundary: the op goes through an aligned copy
        out = misaligned_copy(out)
    ops.attention(out, *p.args(), p.scale, True, **p.quant_kwargs())

    po = poison_(torch.empty(1, t, h, d, dtype=torch.float32, device=DEV))
    pl = poison_(torch.empty(1, t, h, dtype=torch.float32, device=DEV))
    ops.decode(po, pl, *p.args(), p.scale, True, **p.quant_kwargs())
    expected, _ = run_combine(po, pl, dtype)
    assert torch.equal(out, expected), "attention (single split) differs from decode + combine"
    assert torch.all(out[real_rows(p):] == 0), "padding tokens must get 0"
    if not int8:
        exact, _ = exact_attention(p, True)
        r = real_rows(p)
        check_out(out[:r], exact[:r], dtype, "attention, single split")


# (sequence lengths, query counts, query heads, KV heads, head dim, page,
# dtype, extra): steps of fewer than 8 (sequence, KV head) pairs, which get
# more than 32 splits (decode_num_splits), most of them without a page.
FEW_PAIR_CASES = {
    "mqa": ([1000], [1], 32, 1, 128, 16, torch.bfloat16, {}),
    "tp-shard": ([700], [1], 8, 1, 128, 64, torch.float16, {}),
    "4-kv-heads": ([100], [1], 32, 4, 128, 64, torch.bfloat16, {}),
    "odd-group-d64": ([5, 300, 1000], [1, 1, 1], 7, 1, 64, 16, torch.bfloat16, {}),  # a warp's rows span tokens
    "verify": ([40, 300, 17], [16, 4, 1], 16, 2, 128, 32, torch.bfloat16, {}),
    "window-sinks": ([2000, 50], [1, 1], 8, 1, 128, 16, torch.bfloat16, {"window_left": 100, "sinks": True}),
    "padding-d96": ([300, 0, 64], [2, 0, 1], 16, 2, 96, 32, torch.float16, {"pad": 3}),
    "d256": ([3000], [1], 16, 1, 256, 64, torch.bfloat16, {}),
    "fp32": ([500], [1], 8, 1, 64, 16, torch.float32, {}),
    "int8": ([900], [1], 8, 1, 128, 64, torch.bfloat16, {"int8": True}),
}


@pytest.mark.parametrize("case", list(FEW_PAIR_CASES))
def test_attention_few_pairs(case, seed):
    """Steps of a few (sequence, KV head) pairs (one MQA sequence, a
    tensor-parallel shard's KV head, verify steps, a window): the attention
    op gives them 33-128 splits, which combine shares among several warps.
    The result must be the bits of decode + combine with that split count,
    and float64's within tolerance."""
    need_path("attention")
    lens, q_lens, hq, hkv, d, page, dtype, extra = FEW_PAIR_CASES[case]
    p = make_problem(lens, q_lens, hq, hkv, d, page, dtype=dtype, device=DEV, seed=seed,
                     int8=extra.get("int8", False))
    if "pad" in extra:
        p = with_padding_tokens(p, extra["pad"])
    variants = {}
    if "window_left" in extra:
        variants["window_left"] = extra["window_left"]
    if extra.get("sinks"):
        variants["sinks"] = torch.randn(hq, device=DEV)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = ops.decode_num_splits(sms, len(lens), hkv)
    assert splits > 32, "the case needs more splits than a row's lanes"
    out = run_attention(p, True, **variants)

    expected, _ = run_combine(*run_decode(p, True, splits, **variants), dtype)
    assert torch.equal(out, expected), "attention differs from decode + combine"
    r = real_rows(p)
    assert torch.all(out[r:] == 0), "padding tokens must get 0"
    exact, _ = exact_attention(p, True, **variants)  # (int8: against the dequantized cache, as run_all)
    check_out(out[:r], exact[:r], dtype, f"attention, few pairs ({case})", ulps=6.0 if extra.get("int8") else 4.0)


# (sequence lengths, query counts, query heads, KV heads, head dim, page,
# dtype, extra): steps of more than 16 packed rows (group x queries): 17-32
# rows take the 16-row tile (a block per 16 rows) where its blocks fit two
# per SM, else the 64-row tile (so do "mqa" and "mqa-int8", of more than one
# sequence); 64 rows the 64-row tile.
ROW_TILE_CASES = {
    "mqa": ([1000, 37, 64], [1, 1, 1], 32, 1, 128, 16, torch.bfloat16, {}),
    "mqa-int8": ([900, 5], [1, 1], 32, 1, 128, 64, torch.bfloat16, {"int8": True}),
    "verify-d64": ([300, 40, 17], [8, 8, 1], 8, 2, 64, 32, torch.float16, {}),
    "verify-d256": ([500, 129], [16, 3], 16, 4, 256, 64, torch.bfloat16, {}),
}


@pytest.mark.parametrize("row_tile", [None, "16", "64"], ids=["rule", "16", "64"])
@pytest.mark.parametrize("case", list(ROW_TILE_CASES))
def test_attention_row_tile(case, row_tile, monkeypatch, seed):
    """Steps of more than 16 packed rows (MQA's 32 heads of a query, verify
    steps of a large group) on the tile the rule gives (decode.cu,
    decode_small_tile) and on each tile that TILEINFER_DECODE_ROW_TILE
    forces: the bits of decode + combine with the same tile and split count,
    0 on padding tokens, and float64's within tolerance. The variable's bad
    values are refused."""
    need_path("attention")
    lens, q_lens, hq, hkv, d, page, dtype, extra = ROW_TILE_CASES[case]
    p = make_problem(lens, q_lens, hq, hkv, d, page, dtype=dtype, device=DEV, seed=seed,
                     int8=extra.get("int8", False))
    p = with_padding_tokens(p, 2)
    assert p.max_q_len * hq // hkv > 16, "the case needs more rows than one 16-row tile"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = ops.decode_num_splits(sms, len(lens), hkv)
    if row_tile is None:
        monkeypatch.delenv("TILEINFER_DECODE_ROW_TILE", raising=False)
    else:
        monkeypatch.setenv("TILEINFER_DECODE_ROW_TILE", row_tile)
    out = run_attention(p, True)
    expected, _ = run_combine(*run_decode(p, True, splits), dtype)
    assert torch.equal(bits(out), bits(expected)), "attention differs from decode + combine"
    r = real_rows(p)
    assert torch.all(out[r:] == 0), "padding tokens must get 0"
    if not extra.get("int8"):
        exact, _ = exact_attention(p, True)
        check_out(out[:r], exact[:r], dtype, f"attention, row tile {row_tile or 'by the rule'} ({case})")
    monkeypatch.setenv("TILEINFER_DECODE_ROW_TILE", "32")
    with pytest.raises(RuntimeError, match="TILEINFER_DECODE_ROW_TILE must be 64 or 16"):
        run_attention(p, True)


# The decode tiles at d 128 as TileConfig's warps_m, warps_n, row tiles,
# keys, stages (tile_table.h): 16 rows a block, or 64.
DECODE_TILE_SHAPES = {"16": ", 1, 4, 1, 64, 3,", "64": ", 4, 1, 1, 64, 2,"}


@pytest.mark.parametrize("hq,hkv,seqs,n", [(32, 1, 1, 1), (32, 1, 2, 1), (32, 1, 32, 1), (8, 2, 1, 8),
                                           (32, 8, 3, 8)], ids=["mqa-1", "mqa-2", "mqa-32", "verify8-g4-1",
                                                                "verify8-g4-3"])
def test_attention_row_tile_rule(hq, hkv, seqs, n, seed, monkeypatch):
    """A step of 17-32 packed rows takes the 16-row decode tile only where
    its blocks on it (the dispatcher's splits x sequences x KV heads x 2
    row tiles) fit two per SM, which leaves one (sequence, KV head) pair;
    else the 64-row tile (decode.cu, decode_small_tile). The tile that ran,
    from the kernel's name, and float64's result."""
    need_path("attention")
    monkeypatch.delenv("TILEINFER_DECODE_ROW_TILE", raising=False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = ops.decode_num_splits(sms, seqs, hkv)
    expected = "16" if splits * seqs * hkv * 2 <= 2 * sms else "64"
    assert (expected == "16") == (seqs * hkv == 1 and sms >= 128), "the case's premise"
    lens = [300 + 517 * i for i in range(seqs)]
    p = make_problem(lens, [n] * seqs, hq, hkv, 128, 64, dtype=torch.bfloat16, device=DEV, seed=seed)
    names, out = kernels_run(lambda: run_attention(p, True))
    ran = sorted(rows for rows, shape in DECODE_TILE_SHAPES.items()
                 if any("attention_tile_kernel" in name and shape in name for name in names))
    assert ran == [expected], f"decode tiles {ran}, expected {expected}: {sorted(set(names))}"
    check_out(out, exact_attention(p, True)[0], torch.bfloat16, f"{seqs} x {n} queries, {hq} / {hkv} heads")


# (query heads, KV heads, head dim, page, dtype, queries a sequence, extra):
# batches sized for 2 (or 4) splits a (sequence, KV head), which the attention
# op runs as clusters of blocks that merge them (cluster_merge.cuh). "quant":
# make_problem's cache arguments; "bad_row": a query value inf (its row comes
# out 0, as combine makes of an all-NaN row); "row_tile": the decode tile
# forced (TILEINFER_DECODE_ROW_TILE: MQA's 32 rows on two 16-row tiles,
# which the rule leaves to a single (sequence, KV head) pair).
CLUSTER_CASES = {
    "28/4": (28, 4, 128, 16, torch.bfloat16, 1, {}),
    "fp16-d64": (32, 8, 64, 64, torch.float16, 1, {}),
    "verify-d256": (16, 4, 256, 32, torch.bfloat16, 4, {}),
    "d96-window-sinks": (16, 2, 96, 16, torch.bfloat16, 1, {"window_left": 300, "sinks": True}),
    "int8-bad-row": (32, 8, 128, 64, torch.bfloat16, 1, {"quant": {"int8": True}, "bad_row": True}),
    "fp8-per-tensor": (32, 8, 128, 16, torch.float16, 2,
                       {"quant": {"cache_dtype": torch.float8_e4m3fn, "scale_kind": "tensor"}}),
    "mqa-two-row-tiles": (32, 1, 128, 16, torch.float16, 1, {"row_tile": "16"}),
    "mqa": (32, 1, 128, 16, torch.bfloat16, 1, {}),
    "verify-64-row-tile": (16, 4, 128, 16, torch.bfloat16, 16, {}),
}


@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("case", list(CLUSTER_CASES))
def test_attention_cluster_merge(case, splits, monkeypatch, seed):
    """Steps of 89-132 (sequence, KV head) pairs (on 132 SMs), to which the
    default rule gives 2 splits: on compute capability 9.0 the attention op
    runs each pair's splits as one cluster whose blocks merge them (no
    partials, no combine launch); 4 splits (53-66 pairs) keep combine. The result must be the bits of
    decode + combine with that split count (the sign of a zero included), and
    of the op with TILEINFER_DECODE_CLUSTER_MERGE=0 (which launches combine);
    0 on padding tokens; float64's within tolerance. Lengths around page
    boundaries and shorter than the splits leave some splits without a key."""
    need_path("attention")
    hq, hkv, d, page, dtype, n, extra = CLUSTER_CASES[case]
    seqs = batch_for_splits(hkv, splits, at_least=8)
    if seqs is None:
        pytest.skip(f"no batch gets {splits} splits on this card")
    g = torch.Generator().manual_seed(seed)
    lens = [0, 1, n, page - 1, page, page + 1, 3 * page + 1, 2500]
    lens += torch.randint(n, 1200, (seqs - len(lens),), generator=g).tolist()
    q_lens = [min(n, L) for L in lens]
    quant = extra.get("quant", {})
    p = make_problem(lens, q_lens, hq, hkv, d, page, dtype=dtype, device=DEV, seed=seed, **quant)
    p = dataclasses.replace(with_padding_tokens(p, 3), max_q_len=n)
    if extra.get("bad_row"):
        p.q[int(p.cu_seqlens_q[1]), 3, 7] = float("inf")
    variants = {}
    if "window_left" in extra:
        variants["window_left"] = extra["window_left"]
    if extra.get("sinks"):
        variants["sinks"] = torch.randn(hq, device=DEV)
    if "row_tile" in extra:
        monkeypatch.setenv("TILEINFER_DECODE_ROW_TILE", extra["row_tile"])
    names, out = kernels_run(lambda: run_attention(p, True, **variants))
    if hopper():
        combined = any("combine" in name for name in names)
        assert combined == (splits != 2), f"combine {'ran' if combined else 'did not run'}: {names}"

    expected, _ = run_combine(*run_decode(p, True, splits, **variants), dtype)
    assert torch.equal(bits(out), bits(expected)), "attention (splits merged in clusters) differs from decode + combine"
    monkeypatch.setenv("TILEINFER_DECODE_CLUSTER_MERGE", "0")
    names_off, off = kernels_run(lambda: run_attention(p, True, **variants))
    assert any("combine" in name for name in names_off), f"combine did not run: {names_off}"
    assert torch.equal(bits(off), bits(out)), "the cluster merge's bits differ from partials + combine's"
    r = real_rows(p)
    assert torch.all(out[r:] == 0), "padding tokens must get 0"
    if extra.get("bad_row"):
        bad = int(p.cu_seqlens_q[1])
        assert torch.all(out[bad, 3] == 0) and torch.isfinite(out).all(), "a non-finite query row comes out 0"
    exact, _ = exact_attention(p, True, **variants)  # (quantized: against the dequantized cache, as run_all)
    if extra.get("bad_row"):
        exact[int(p.cu_seqlens_q[1]), 3] = 0  # the row of the inf query comes out 0 (checked above)
    check_out(out[:r], exact[:r], dtype, f"attention, splits merged in clusters ({case})",
              ulps=6.0 if quant else 4.0)


# ------------------------------------------------------------------ combine alone
def random_partials(splits, tokens, heads, head_dim, g):
    """Partials with a spread of lse values (weights from ~1 down to underflow),
    some neutral splits (out 0, lse -inf) and some rows with only neutral splits."""
    po = torch.randn(splits, tokens, heads, head_dim, generator=g)
    pl = torch.randn(splits, tokens, heads, generator=g) * 4 + 3
    pl[0, 0, 0] = 120.0  # other splits of this row underflow to weight 0
    neutral = torch.rand(splits, tokens, heads, generator=g) < 0.3
    neutral[:, -1, :] = True  # the last token: every split neutral
    pl[neutral] = float("-inf")
    po[neutral] = 0.0
    return po.to(DEV), pl.to(DEV)


@pytest.mark.parametrize("splits", [1, 2, 7, 32, 33, 100, 300])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_combine(dtype, head_dim, splits, seed):
    """combine against the float64 merge: only its own rounding is allowed (the
    output rounded once to the element type). Splits beyond one chunk of lanes
    (33, 100, 300) are shared by several warps, each with its running rescale
    over one or more chunks, merged at the end; rows of only neutral splits
    give out 0 and lse -inf."""
    need("combine")
    g = torch.Generator().manual_seed(seed)
    po, pl = random_partials(splits, 5, 6, head_dim, g)
    out, lse = run_combine(po, pl, dtype)
    exact, exact_lse = reference.merge_partials(po, pl)
    check_out(out, exact, dtype, "combine", ulps=1.0)
    check_lse(lse, exact_lse, torch.float32, "combine lse")
    assert torch.all(out[-1] == 0) and torch.all(lse[-1] == float("-inf")), "all-neutral rows must be 0 / -inf"
    # Without lse, the same bits; and the same bits on every run.
    out2, _ = run_combine(po, pl, dtype, with_lse=False)
    assert torch.equal(out, out2), "combine is not deterministic (or depends on lse being requested)"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_combine_strided_and_unaligned_out(dtype, seed):
    """out as a view with free token / head strides (writes stay inside it), and
    as a view at an odd element offset (no 16-byte vector stores possible)."""
    need("combine")
    g = torch.Generator().manual_seed(seed)
    po, pl = random_partials(5, 7, 4, 128, g)
    exact, _ = reference.merge_partials(po, pl)
    # A view of heads 2..5 of a [7, 9, 128] buffer: token stride 9 * 128.
    buf = poison_(torch.empty(7, 9, 128, dtype=dtype, device=DEV))
    ops.combine(buf[:, 2:6], None, po, pl)
    check_out(buf[:, 2:6], exact, dtype, "combine strided", ulps=1.0)
    assert torch.isnan(buf[:, :2]).all() and torch.isnan(buf[:, 6:]).all(), "combine wrote outside the out view"
    # One element past an aligned start: every row is misaligned for vector stores.
    flat = poison_(torch.empty(7 * 4 * 128 + 1, dtype=dtype, device=DEV))
    ops.combine(flat[1:].view(7, 4, 128), None, po, pl)
    check_out(flat[1:].view(7, 4, 128), exact, dtype, "combine unaligned", ulps=1.0)
    assert torch.isnan(flat[0]), "combine wrote before the out view"


def test_combine_many_rows(seed):
    """Enough rows for many blocks per SM (a prefill-sized cascade merge)."""
    need("combine")
    g = torch.Generator().manual_seed(seed)
    po, pl = random_partials(3, 2048, 32, 128, g)
    out, lse = run_combine(po, pl, torch.bfloat16)
    exact, exact_lse = reference.merge_partials(po, pl)
    check_out(out, exact, torch.bfloat16, "combine many rows", ulps=1.0)
    check_lse(lse, exact_lse, torch.float32, "combine many rows lse")


def combine_bad_calls():
    """(name, arguments of a combine call, what its error must say)."""
    f32 = dict(dtype=torch.float32, device=DEV)
    po, pl = torch.randn(3, 4, 2, 64, **f32), torch.randn(3, 4, 2, **f32)
    out = torch.empty(4, 2, 64, dtype=torch.bfloat16, device=DEV)
    return [
        ("partial_out fp16", (out, None, po.half(), pl), "partial_out must be float32"),
        ("head_dim 32", (out, None, po[..., :32].contiguous(), pl), "unsupported head_dim 32"),
        ("partial_out strided", (out, None, po.transpose(1, 2), pl), "partial_out must be contiguous"),
        ("partial_lse splits", (out, None, po, pl[:2]), "partial_lse must have shape"),
        ("partial_lse fp64", (out, None, po, pl.double()), "partial_lse must be float32"),
        ("out int32", (out.int(), None, po, pl), "out must be bfloat16, float16 or float32"),
        ("out tokens", (out[:3], None, po, pl), "out must have 4 tokens"),
        ("out on the cpu", (out.cpu(), None, po, pl), "out must be on"),
        ("lse shape", (out, torch.empty(4, 3, **f32), po, pl), "lse must have shape"),
        ("lse fp16", (out, torch.empty(4, 2, dtype=torch.float16, device=DEV), po, pl), "lse must be float32"),
    ]


def run_combine_bad_calls():
    """Child-process side of test_combine_rejects_bad_arguments: one line per call."""
    for name, args, _ in combine_bad_calls():
        print(f"start {name}", flush=True)
        try:
            ops.combine(*args)
            outcome = "no error"
        except RuntimeError as e:
            outcome = str(e).splitlines()[0]
        print(f"result {name}\t{outcome}", flush=True)


def test_combine_rejects_bad_arguments():
    """Each bad call raises a RuntimeError naming the argument. The calls run in
    a child process: a call that crashes the process (a segfault instead of an
    error) then fails this test instead of ending the whole pytest run, and
    the child's output says which call it was."""
    need("combine")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "combine-bad-calls"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=300)
    started = [line[len("start "):] for line in child.stdout.splitlines() if line.startswith("start ")]
    assert child.returncode == 0, (f"the child process died (exit {child.returncode}) in the combine call "
                                   f"'{started[-1] if started else '(none started)'}':\n{child.stderr[-3000:]}")
    outcomes = dict(line[len("result "):].split("\t", 1) for line in child.stdout.splitlines()
                    if line.startswith("result "))
    wrong = {name: outcomes.get(name, "(no result)") for name, _, expected in combine_bad_calls()
             if not re.search("combine: .*" + re.escape(expected), outcomes.get(name, ""))}
    assert not wrong, f"calls that did not raise the expected RuntimeError: {wrong}"


# ------------------------------------------------------------------ attention dispatcher
@pytest.mark.parametrize("max_q_len", [1, 4, 16, 17, 64])
@pytest.mark.parametrize("group", [1, 3, 4, 6, 7, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_attention(dtype, group, max_q_len, seed):
    """The dispatcher: decode + combine for <= 16 queries (any group), prefill
    otherwise; same answer either way."""
    need_path("attention")
    n = max_q_len
    p = make_problem([n, n + 50, 64 + n, 900], [n, max(1, n // 2), n, 1], 2 * group, 2, 128, 64, dtype=dtype,
                     device=DEV, seed=seed)
    for causal in (True, False):
        out = run_attention(p, causal)
        check_out(out, exact_attention(p, causal)[0], dtype, f"attention causal={causal}")


@pytest.mark.parametrize("path", ["prefill", "decode", "attention"])
def test_padded_batch(path, seed):
    """Padded batch slots (seq_lens 0, no queries) and padding tokens past
    cu_seqlens_q[-1]: the real rows are right and finite."""
    need_path(path)
    p = make_problem([300, 0, 45, 0], [1, 0, 1, 0] if path != "prefill" else [20, 0, 45, 0], 8, 2, 128, 32,
                     device=DEV, seed=seed)
    p = with_padding_tokens(p, 3)
    if path == "prefill":
        out, lse = run_prefill(p, True)
    elif path == "decode":
        po, pl = run_decode(p, True, 8)
        out, lse = run_combine(po, pl, torch.bfloat16)
    else:
        out, lse = run_attention(p, True), None
    n = real_rows(p)
    exact, exact_lse = exact_attention(p, True)
    assert torch.isfinite(out[:n]).all(), "NaN / inf in real rows"
    check_out(out[:n], exact[:n], torch.bfloat16, f"{path} padded")
    if lse is not None:
        check_lse(lse[:n], exact_lse[:n], torch.bfloat16, f"{path} padded lse")


@pytest.mark.parametrize("path", ["prefill", "decode", "attention"])
def test_deterministic(path, seed):
    """Same inputs, same bits (fixed merge order; no atomics)."""
    need_path(path)
    q_lens = [600, 1, 77, 1000] if path == "prefill" else [1, 1, 4, 1]
    p = make_problem([2000, 3000, 77, 1000], q_lens, 16, 4, 128, 64, device=DEV, seed=seed)

    def once():
        if path == "prefill":
            return run_prefill(p, True)
        if path == "decode":
            return run_combine(*run_decode(p, True, 32), torch.bfloat16)
        return run_attention(p, True), torch.zeros(1)

    (a, a_lse), (b, b_lse) = once(), once()
    assert torch.isfinite(a).all()
    assert torch.equal(a, b) and torch.equal(a_lse, b_lse), f"{path}: two runs gave different bits"


# ------------------------------------------------------------------ CUDA graphs
@pytest.mark.parametrize("group,kv_heads,num_seqs", [(4, 2, 3), (3, 2, 3), (4, 8, 40), (4, 8, 16)],
                         ids=["decode_path", "prefill_path", "decode_path_single_split", "decode_path_cluster_merge"])
def test_cuda_graph_decode_steps(group, kv_heads, num_seqs, seed):
    """One decode step (cache_write + attention, or attention alone when this
    build has no CUDA cache_write) captured once with static block_tables /
    seq_lens / cu_seqlens_q buffers, replayed for 70 steps while sequences grow
    across page boundaries. The host only copies new contents into the static
    buffers (new page ids, lengths, this step's q / k / v). Every replay must
    equal an eager step bit for bit, and float64 attention every few steps.
    40 sequences x 8 KV heads: one split per (sequence, head), where the decode
    kernel writes `out` itself; 16 x 8: two splits (on 132 SMs), merged in
    clusters."""
    need_path("attention")
    use_cache_write = has_cuda_kernel("cache_write")
    g = torch.Generator().manual_seed(seed)
    dtype, page, d, steps = torch.bfloat16, 16, 128, 70
    if num_seqs > 3:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        splits = ops.decode_num_splits(sms, num_seqs, kv_heads)
        if num_seqs == 40:
            assert splits == 1
        elif splits != 2:
            pytest.skip(f"{num_seqs} x {kv_heads} pairs get {splits} splits on this card, not 2")
    start = [page - 3, 2 * page - 1, 5] + [1 + (7 * i) % 50 for i in range(num_seqs - 3)]
    b = GrowingDecodeBatch(g, num_seqs, kv_heads, group, start, steps, page, d, dtype, DEV)

    def step(k_pool, v_pool, o, qq, kk, vv, bt, sl):
        if use_cache_write:
            ops.cache_write(k_pool, v_pool, kk, vv, bt, sl, b.cu_seqlens_q)
        ops.attention(o, qq, k_pool, v_pool, bt, sl, b.cu_seqlens_q, 1, b.scale, True)

    def next_step_inputs():
        b.grow()
        if not use_cache_write:  # the host writes the new keys / values itself
            for pool_k, pool_v in (b.pools, b.eager_pools):
                for s in range(num_seqs):
                    pos = b.lens[s] - 1
                    page_id = int(b.table[s, pos // page])
                    pool_k[page_id, :, pos % page] = b.k[s]
                    pool_v[page_id, :, pos % page] = b.v[s]

    next_step_inputs()
    graph = b.capture(step)
    for i in range(steps):
        if i > 0:
            next_step_inputs()
        poison_(b.out)
        graph.replay()
        assert torch.equal(b.out, b.eager(step)), f"step {i}: graph replay differs from eager"
        if i % 10 == 0 or i == steps - 1:
            assert all(torch.equal(x, y) for x, y in zip(b.pools, b.eager_pools)), f"step {i}: caches differ"
            exact = reference.paged_attention(b.q, *b.pools, b.block_tables, b.seq_lens, b.cu_seqlens_q, 1, b.scale,
                                              True, exact=True)
            check_out(b.out, exact, dtype, f"graph step {i} (lengths {b.lens})")


# ------------------------------------------------------------------ bad device data (keep last)
def corrupt(p):
    """Out-of-range and negative page ids among used pages, a seq_len beyond
    what the table holds, a negative seq_len. Returns the bad entries."""
    num_pages = p.k_cache.shape[0]
    page = p.k_cache.shape[2]
    bt, sl = p.block_tables, p.seq_lens
    bt[0, 1] = num_pages + 5
    bt[1, 0] = -3
    bt[0, 2] = 2**31 - 1
    sl[2] = bt.shape[1] * page + 1000
    sl[3] = -7
    return ["block_tables[0, 1]", "block_tables[1, 0]", "block_tables[0, 2]", "seq_lens[2]", "seq_lens[3]"]


def check_context_alive(seed):
    """After bad metadata the CUDA context must still work: a normal case runs and is right."""
    torch.cuda.synchronize()
    p = make_problem([100, 33], [1, 1], 8, 2, 128, 16, device=DEV, seed=seed + 1)
    po, pl = run_decode(p, True, 4)
    out, _ = run_combine(po, pl, torch.bfloat16)
    check_out(out, exact_attention(p, True)[0], torch.bfloat16, "normal case after bad metadata")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", ["prefill", "decode", "attention", "attention-clusters"])
def test_adversarial_metadata(path, dtype, seed):
    """Bad device metadata: out-of-range and negative page ids among used
    pages, seq_lens beyond what the table holds (by a little and by far) and
    negative, a sequence whose every page id is bad. No fault, no NaN, every
    row as the reference reads the metadata (bad pages skipped, lengths
    clamped; rows that see nothing: 0, lse -inf), decode's partials right
    before combine too, the context survives, and validate_metadata names
    every bad entry. attention-clusters: more sequences after those, for 2
    splits merged in clusters."""
    need_path("attention" if path.startswith("attention") else path)
    need("decode", "combine")  # check_context_alive
    q_lens = [5, 3, 20, 1, 4, 6] if path == "prefill" else [1, 2, 1, 1, 3, 1]
    lens = [70, 40, 33, 20, 50, 45]
    if path == "attention-clusters":
        seqs = batch_for_splits(2, 2, at_least=len(lens))
        if seqs is None:
            pytest.skip("no batch gets 2 splits on this card")
        lens += [30] * (seqs - len(lens))
        q_lens += [1] * (seqs - len(q_lens))
    p = make_problem(lens, q_lens, 8, 2, 64, 16, dtype=dtype, device=DEV, seed=seed)
    bad = corrupt(p)  # sequences 0-3
    p.block_tables[4, :] = -1  # every page bad: its rows see nothing
    p.seq_lens[5] = 10**6  # far beyond what the table holds: clamped
    bad += ["block_tables[4, 0]", "seq_lens[5]"]
    exact, exact_lse = exact_attention(p, True)
    if path == "prefill":
        out, lse = run_prefill(p, True)
    elif path == "decode":
        po, pl = run_decode(p, True, 4)
        torch.cuda.synchronize()  # a fault would raise here
        assert not torch.isnan(po).any() and not torch.isnan(pl).any(), "NaN partials with bad metadata"
        merged, merged_lse = reference.merge_partials(po, pl)
        check_out(merged, exact, dtype, "decode partials (merged in float64) with bad metadata")
        check_lse(merged_lse, exact_lse, dtype, "decode partials (merged in float64) with bad metadata lse")
        out, lse = run_combine(po, pl, dtype)
    else:
        out, lse = run_attention(p, True), None
    torch.cuda.synchronize()  # a fault would raise here
    assert torch.isfinite(out).all(), "NaN / inf with bad metadata"
    rows = slice(int(p.cu_seqlens_q[4]), int(p.cu_seqlens_q[5]))
    assert torch.all(out[rows] == 0), "rows that see no position must be 0"
    check_out(out, exact, dtype, f"{path} with bad metadata")
    if lse is not None:
        check_lse(lse, exact_lse, dtype, f"{path} with bad metadata lse")
    check_context_alive(seed)

    args = (p.k_cache.shape[0], p.k_cache.shape[2], p.q.shape[0])
    problems = "\n".join(tileinfer_attn.validate_metadata(p.block_tables, p.seq_lens, p.cu_seqlens_q, *args))
    missing = [entry for entry in bad if entry not in problems]
    assert not missing, f"validate_metadata did not report {missing}; it said:\n{problems}"
    clean = make_problem([70, 40], [1, 1], 8, 2, 64, 16, device=DEV, seed=seed)
    assert tileinfer_attn.validate_metadata(clean.block_tables, clean.seq_lens, clean.cu_seqlens_q,
                                            clean.k_cache.shape[0], 16, 2) == []


@pytest.mark.parametrize("path", ["prefill", "decode", "attention"])
def test_garbage_query_offsets(path, seed):
    """cu_seqlens_q decreasing, past num_tokens and far beyond max_q_len: the
    kernels clamp and skip; nothing faults and the context survives (which rows
    get written is not defined, so only that is checked)."""
    need_path(path)
    need("decode", "combine")  # check_context_alive
    p = make_problem([70, 40, 33, 20], [1, 1, 1, 1], 8, 2, 64, 16, device=DEV, seed=seed)
    p.cu_seqlens_q.copy_(torch.tensor([0, 3, 1, 10**6, -5], dtype=torch.int32))
    corrupt(p)
    if path == "prefill":
        run_prefill(p, True)
    elif path == "decode":
        run_combine(*run_decode(p, True, 4), torch.bfloat16)
    else:
        run_attention(p, True)
    check_context_alive(seed)


if __name__ == "__main__" and sys.argv[1:] == ["combine-bad-calls"]:
    run_combine_bad_calls()
