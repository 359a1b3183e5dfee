"""GPU tests of the prefill and decode kernels themselves (csrc/ops/prefill.cu,
csrc/ops/decode.cu), against float64 attention (the bounds of the Numerics
section of docs/CONTRACT.md, in op_helpers).

Complements tests/test_attention_gpu.py (the ops end to end): here decode is
checked through its partials (merged in float64 by reference.merge_partials), so
it does not depend on the combine kernel, and each test targets one kernel
mechanism: masks on the causal diagonal, pages of several sizes per key tile,
empty splits, GQA packing, padded rows, determinism, CUDA-graph replay (bad
device metadata: test_attention_gpu.py's test_adversarial_metadata).
Outputs are poisoned with NaN first; inputs are fresh random data.
"""
import pytest
import torch

from op_helpers import (HEAD_DIMS, check_lse, check_neutral_splits, check_out, exact_attention, has_cuda_kernel,
                        hopper, kernels_run, need, run_decode, run_prefill, split_exact, split_pages)
from tileinfer_attn import reference, testing

pytestmark = pytest.mark.gpu

ops = torch.ops.tileinfer_attn
DEV = "cuda"


# ---------------------------------------------------------------- prefill sweep
# The kernel is the one prefill dispatches to for the shapes: the
# warp-specialized kernel on a Hopper build for bf16 / fp16 (every head dim),
# the tile kernel elsewhere (64-row tiles below 2048 queries; fp32: a
# CUDA-core kernel). KERNELS runs the bf16 / fp16 cases once more with
# TILEINFER_PREFILL_KERNEL=tile, which sends them to the tile kernel on
# Hopper too, so that the kernel other GPUs run is tested there.
KERNELS = ["auto", "tile"]


def use_kernel(kernel, monkeypatch):
    """Sets TILEINFER_PREFILL_KERNEL for the test; returns the name part of
    the prefill kernel that must run for bf16 / fp16 (None: the dispatch's choice)."""
    monkeypatch.setenv("TILEINFER_PREFILL_KERNEL", kernel)
    return "attention_tile_kernel" if kernel == "tile" else None


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_prefill_matches_exact(dtype, head_dim, page, causal, kernel, monkeypatch):
    need("prefill")
    if dtype == torch.float32 and kernel == "tile":
        pytest.skip("fp32 runs its CUDA-core kernel either way")
    expected_kernel = use_kernel(kernel, monkeypatch)
    heads = [(4, 1), (6, 2), (2, 2)][(head_dim // 64 + page // 16) % 3]  # GQA 4, group 3, MHA
    # one position, page +- 1, a chunked prefill (fewer queries than positions), a long prompt
    seq_lens = [1, page - 1, page + 1, 3 * page + 5, 200]
    q_lens = [1, page - 1, 7, 3 * page + 5, 130]
    prob = testing.make_problem(seq_lens, q_lens, heads[0], heads[1], head_dim, page, dtype=dtype, device=DEV,
                                seed=head_dim + page + int(causal))
    names, (out, lse) = kernels_run(lambda: run_prefill(prob, causal))
    if expected_kernel is not None:
        assert any(expected_kernel in n for n in names), f"{expected_kernel} did not run: {sorted(set(names))}"
    exact, exact_lse = exact_attention(prob, causal)
    check_out(out, exact, dtype, f"prefill out ({kernel})")
    check_lse(lse, exact_lse, dtype, f"prefill lse ({kernel})")


def test_prefill_kernel_variable_checked(monkeypatch):
    """TILEINFER_PREFILL_KERNEL takes auto or tile; anything else is an error naming it."""
    need("prefill")
    prob = testing.make_problem([40], [40], 4, 2, 128, 16, device=DEV, seed=1)
    monkeypatch.setenv("TILEINFER_PREFILL_KERNEL", "wgmma")
    with pytest.raises(RuntimeError, match="TILEINFER_PREFILL_KERNEL must be auto or tile"):
        run_prefill(prob, True)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("prompt", [1500, 2500])
def test_prefill_long_causal_bf16(prompt, kernel, monkeypatch):
    """Many key tiles, several query tiles per sequence, the diagonal in the
    middle of tiles. Where the tile kernel runs (not Hopper, or
    TILEINFER_PREFILL_KERNEL=tile), a 1500-query prompt takes its 64-row tile
    and a 2500-query one its 128-row tile (TileConfig's 4 warps over rows, one
    or two row tiles each)."""
    need("prefill")
    use_kernel(kernel, monkeypatch)
    prob = testing.make_problem([prompt, 777], [prompt, 300], 8, 2, 128, 64, device=DEV, seed=7)
    names, (out, lse) = kernels_run(lambda: run_prefill(prob, True))
    if kernel == "tile" or not hopper():
        shape, rows = ("4, 1, 2, ", 128) if prompt >= 2048 else ("4, 1, 1, ", 64)
        assert any("attention_tile_kernel" in n and shape in n and "PrefillWork" in n for n in names), \
            f"the {rows}-row tile did not run: {sorted(set(names))}"
    exact, exact_lse = exact_attention(prob, True)
    err = check_out(out, exact, torch.bfloat16, "prefill long")
    check_lse(lse, exact_lse, torch.bfloat16, "prefill long lse")
    print(f"prefill long causal bf16, a {prompt}-query prompt: {err:.2f} ulps")


def test_prefill_tokens_outside_sequences_untouched_and_deterministic():
    need("prefill")
    prob = testing.make_problem([50, 90], [20, 33], 4, 2, 64, 16, device=DEV, seed=3)
    # two padding tokens past cu_seqlens_q[-1]
    prob.q = torch.cat([prob.q, torch.randn(2, 4, 64, device=DEV).to(prob.q.dtype)])
    out1, lse1 = run_prefill(prob, True)
    out2, lse2 = run_prefill(prob, True)
    assert torch.isnan(out1[-2:]).all() and torch.isnan(lse1[-2:]).all(), "rows of no sequence were written"
    assert torch.equal(out1[:-2], out2[:-2]) and torch.equal(lse1[:-2], lse2[:-2]), "not bit-reproducible"


def test_prefill_strided_views():
    """q and out as views of wider buffers (token stride != heads * head_dim)."""
    need("prefill")
    prob = testing.make_problem([100, 40], [100, 3], 4, 2, 128, 32, device=DEV, seed=11)
    wide = torch.randn(prob.q.shape[0], 10, 128, device=DEV).to(prob.q.dtype)
    wide[:, 3:7] = prob.q
    q = wide[:, 3:7]
    out_buf = testing.poison_(torch.empty(prob.q.shape[0], 9, 128, dtype=prob.q.dtype, device=DEV))
    out = out_buf[:, 2:6]
    ops.prefill(out, None, q, prob.k_cache, prob.v_cache, prob.block_tables, prob.seq_lens, prob.cu_seqlens_q,
                prob.max_q_len, prob.scale, True)
    exact, _ = exact_attention(prob, True)
    check_out(out, exact, torch.bfloat16, "prefill strided")
    assert torch.isnan(out_buf[:, :2]).all() and torch.isnan(out_buf[:, 6:]).all(), "wrote outside the view"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_lse_merges_two_halves(dtype):
    """Cascade use: prefill over two disjoint page ranges, merged with the lse,
    equals one pass over all pages (non-causal: the shared-prefix case)."""
    need("prefill")
    page = 32
    prob = testing.make_problem([10 * page], [37], 8, 2, 128, page, dtype=dtype, device=DEV, seed=5)
    full, full_lse = run_prefill(prob, False)
    halves = []
    for cols, length in ((slice(0, 4), 4 * page), (slice(4, 10), 6 * page)):
        tables = prob.block_tables[:, cols].contiguous()
        lens = torch.tensor([length], dtype=torch.int32, device=DEV)
        out = testing.poison_(torch.empty_like(prob.q))
        lse = testing.poison_(torch.empty(prob.q.shape[:2], dtype=torch.float32, device=DEV))
        ops.prefill(out, lse, prob.q, prob.k_cache, prob.v_cache, tables, lens, prob.cu_seqlens_q, prob.max_q_len,
                    prob.scale, False)
        halves.append((out, lse))
    merged, merged_lse = reference.merge_partials(torch.stack([h[0].float() for h in halves]),
                                                  torch.stack([h[1] for h in halves]))
    exact, exact_lse = exact_attention(prob, False)
    check_out(merged, exact, dtype, "merged halves")
    check_lse(merged_lse.float(), exact_lse, dtype, "merged halves lse")
    if has_cuda_kernel("combine"):
        out = testing.poison_(torch.empty_like(prob.q))
        lse = testing.poison_(torch.empty(prob.q.shape[:2], dtype=torch.float32, device=DEV))
        ops.combine(out, lse, torch.stack([h[0].float() for h in halves]).contiguous(),
                    torch.stack([h[1] for h in halves]).contiguous())
        check_out(out, exact, dtype, "combine of halves")


# ---------------------------------------------------------------- decode sweep
DECODE_CASES = []
_i = 0
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for d in HEAD_DIMS:
        for page in (16, 64, 128):
            for group, n in ((1, 1), (4, 1), (16, 1), (2, 3), (4, 4), (8, 16), (3, 2)):
                if dtype != torch.bfloat16 and (group, n) not in ((4, 1), (4, 4), (8, 16)):
                    continue
                splits = (1, 5, 32)[_i % 3]
                causal = _i % 4 != 3
                DECODE_CASES.append((dtype, d, page, group, n, splits, causal))
                _i += 1


@pytest.mark.parametrize("dtype,head_dim,page,group,n,splits,causal", DECODE_CASES)
def test_decode_partials_match_exact(dtype, head_dim, page, group, n, splits, causal):
    need("decode")
    kv_heads = 2
    seq_lens = [n, page - 1 if page - 1 >= n else page, page + 1, 700]
    prob = testing.make_problem(seq_lens, [n] * len(seq_lens), group * kv_heads, kv_heads, head_dim, page,
                                dtype=dtype, device=DEV, seed=group * 100 + n + head_dim + page)
    po, pl = run_decode(prob, causal, splits)
    assert not torch.isnan(po).any() and not torch.isnan(pl).any(), "unwritten or NaN partials"
    merged, merged_lse = reference.merge_partials(po, pl)
    exact, exact_lse = exact_attention(prob, causal)
    check_out(merged, exact, dtype, "decode merged")
    check_lse(merged_lse.float(), exact_lse, dtype, "decode lse")
    check_neutral_splits(po, pl, prob, splits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("splits", [5, 32])
def test_decode_split_rule(dtype, splits):
    """Each split's partial is attention over its own pages of the sequence
    alone, [i * ceil(P / S), (i + 1) * ceil(P / S)) (the decode op's docs):
    several pages, one, a last short one, none."""
    need("decode")
    page = 16
    lens = [16 * 7 + 5, 3, 40, 1000, 16 * 32 * 2 + 1]
    prob = testing.make_problem(lens, [2, 1, 4, 1, 3], 8, 2, 128, page, dtype=dtype, device=DEV, seed=splits)
    po, pl = run_decode(prob, True, splits)
    cu = prob.cu_seqlens_q.tolist()
    for s, length in enumerate(lens):
        for i in range(splits):
            lo, hi = split_pages(length, page, i, splits)
            ref, ref_lse = split_exact(prob, s, lo, hi, True)
            rows = slice(cu[s], cu[s + 1])
            what = f"sequence {s} (L = {length}) split {i} [{lo}, {hi})"
            check_out(po[i, rows], ref, dtype, what)
            check_lse(pl[i, rows], ref_lse, dtype, what + " lse")


def test_decode_deterministic_and_padded_slots():
    """Padded batch slots (seq_lens 0, no queries) cost nothing and write nothing;
    a slot with a query but no positions writes out 0, lse -inf; same bits twice."""
    need("decode")
    prob = testing.make_problem([300, 5, 64], [1, 1, 1], 32, 8, 128, 64, device=DEV, seed=21)
    prob.seq_lens[1] = 0  # a query that sees nothing
    po1, pl1 = run_decode(prob, True, 8)
    po2, pl2 = run_decode(prob, True, 8)
    assert torch.equal(po1, po2) and torch.equal(pl1, pl2)
    assert torch.all(po1[:, 1] == 0) and torch.all(pl1[:, 1] == float("-inf"))
    merged, _ = reference.merge_partials(po1, pl1)
    exact, _ = exact_attention(prob, True)
    check_out(merged, exact, torch.bfloat16, "decode with an empty slot")


# ---------------------------------------------------------------- CUDA graphs
def test_decode_cuda_graph_replay_as_sequences_grow():
    """One decode step captured once, replayed while the sequences grow across
    page boundaries (the host only rewrites the static seq_lens buffer); every
    replay equals an eager call on the same inputs."""
    need("decode")
    page, kv_heads, group, d = 16, 2, 4, 128
    start = [15, 30, 1]
    grow = 20
    prob = testing.make_problem([s + grow for s in start], [1, 1, 1], group * kv_heads, kv_heads, d, page,
                                device=DEV, seed=13)
    seq_lens = torch.tensor(start, dtype=torch.int32, device=DEV)
    splits = 6
    po = torch.empty(splits, 3, group * kv_heads, d, dtype=torch.float32, device=DEV)
    pl = torch.empty(splits, 3, group * kv_heads, dtype=torch.float32, device=DEV)

    def step():
        ops.decode(po, pl, prob.q, prob.k_cache, prob.v_cache, prob.block_tables, seq_lens, prob.cu_seqlens_q, 1,
                   prob.scale, True)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for k in range(grow + 1):
        seq_lens.copy_(torch.tensor([x + k for x in start], dtype=torch.int32))
        po.fill_(float("nan"))
        g.replay()
        got = (po.clone(), pl.clone())
        po.fill_(float("nan"))
        step()
        assert torch.equal(got[0], po) and torch.equal(got[1], pl), f"replay {k} differs from eager"
        merged, _ = reference.merge_partials(po, pl)
        exact = reference.paged_attention(prob.q, prob.k_cache, prob.v_cache, prob.block_tables, seq_lens,
                                          prob.cu_seqlens_q, 1, prob.scale, True, exact=True)
        check_out(merged, exact, torch.bfloat16, f"graph step {k}")
