"""GPU tests of the prefill and decode kernels themselves (csrc/ops/prefill.cu,
csrc/ops/decode.cu), against float64 attention (SPEC section 4).

Complements tests/test_attention_gpu.py (the ops end to end): here decode is
checked through its partials (merged in float64 by reference.merge_partials), so
it does not depend on the combine kernel, and each test targets one kernel
mechanism: masks on the causal diagonal, pages of several sizes per key tile,
empty splits, GQA packing, padded rows, adversarial metadata, determinism.
Outputs are poisoned with NaN first; inputs are fresh random data.
"""
import pytest
import torch

from tileinfer_attn import reference, testing
from op_helpers import check_neutral_splits, has_cuda_kernel, split_exact, split_pages

pytestmark = pytest.mark.gpu

ops = torch.ops.tileinfer_attn
DEV = "cuda"
ULPS = 4.0  # SPEC section 4: bf16 / fp16 within about 4 ulps of the output magnitude


def _need(*names):
    for n in names:
        if not has_cuda_kernel(n):
            pytest.skip(f"this build has no CUDA kernel for tileinfer_attn::{n}")


def _check_out(out, exact, dtype, what):
    if dtype == torch.float32:
        err = testing.rel_error(out, exact)
        assert err <= 1e-5, f"{what}: relative error {err:.3g} > 1e-5"
    else:
        err = testing.ulp_error(out, exact, dtype)
        assert err <= ULPS, f"{what}: {err:.2f} ulps > {ULPS}"
    return err


def _check_lse(lse, exact_lse, dtype, what):
    lse = lse.double()
    seen = torch.isfinite(exact_lse)
    assert torch.equal(torch.isfinite(lse), seen), f"{what}: lse finite where exact is not (or the reverse)"
    assert not torch.isnan(lse).any(), f"{what}: NaN in lse"
    if seen.any():
        tol = 1e-5 if dtype == torch.float32 else 1e-4
        err = ((lse[seen] - exact_lse[seen]).abs() / exact_lse[seen].abs().clamp_min(1.0)).max().item()
        assert err <= tol, f"{what}: lse error {err:.3g} > {tol}"


def _rows_of_sequences(prob):
    """Bool [num_tokens]: tokens that belong to a sequence."""
    cu = prob.cu_seqlens_q.tolist()
    mask = torch.zeros(prob.q.shape[0], dtype=torch.bool, device=prob.q.device)
    for b, e in zip(cu[:-1], cu[1:]):
        mask[b:e] = True
    return mask


def exact_attention(prob, causal, seq_lens=None, block_tables=None):
    """float64 attention (out, lse). The reference cannot take a sequence with
    queries but no position (seq_lens <= 0); such a sequence is given one
    position on no page instead, which is the same: its rows see nothing."""
    seq_lens = (prob.seq_lens if seq_lens is None else seq_lens).clone()
    tables = (prob.block_tables if block_tables is None else block_tables).clone()
    empty = seq_lens <= 0
    seq_lens[empty] = 1
    tables[empty] = -1
    return reference.paged_attention(prob.q, prob.k_cache, prob.v_cache, tables, seq_lens, prob.cu_seqlens_q,
                                     prob.scale, causal, exact=True, return_lse=True)


def run_prefill(prob, causal, with_lse=True):
    out = testing.poison_(torch.empty_like(prob.q))
    lse = testing.poison_(torch.empty(prob.q.shape[:2], dtype=torch.float32, device=DEV)) if with_lse else None
    ops.prefill(out, lse, *prob.args(), prob.scale, causal)
    return out, lse


def run_decode(prob, causal, splits):
    t, h, d = prob.q.shape
    po = testing.poison_(torch.empty(splits, t, h, d, dtype=torch.float32, device=DEV))
    pl = testing.poison_(torch.empty(splits, t, h, dtype=torch.float32, device=DEV))
    ops.decode(po, pl, *prob.args(), prob.scale, causal)
    return po, pl


# ---------------------------------------------------------------- prefill sweep
# rows: the kernel. "64" / "128": the mma.sync tile kernel with that tile,
# forced through TILEINFER_PREFILL_ROWS (64-row tiles by default for short
# prompts, 128-row tiles for long ones at d <= 128) and TILEINFER_PREFILL_WGMMA=0;
# "wgmma": the default on a Hopper build for bf16 / fp16 (every head dim).
PREFILL_CASES = []
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for d in (64, 128, 256):
        for page in (16, 32, 64, 128):
            for causal in (True, False):
                for rows in ("64", "128", "wgmma"):
                    if rows != "64" and dtype == torch.float32 or rows == "128" and d == 256:
                        continue
                    PREFILL_CASES.append((dtype, d, page, causal, rows))


def force_prefill_kernel(monkeypatch, rows):
    if rows == "wgmma":
        monkeypatch.delenv("TILEINFER_PREFILL_ROWS", raising=False)
        monkeypatch.delenv("TILEINFER_PREFILL_WGMMA", raising=False)
    else:
        monkeypatch.setenv("TILEINFER_PREFILL_ROWS", rows)
        monkeypatch.setenv("TILEINFER_PREFILL_WGMMA", "0")


@pytest.mark.parametrize("dtype,head_dim,page,causal,rows", PREFILL_CASES)
def test_prefill_matches_exact(dtype, head_dim, page, causal, rows, monkeypatch):
    _need("prefill")
    force_prefill_kernel(monkeypatch, rows)
    heads = [(4, 1), (6, 2), (2, 2)][(head_dim // 64 + page // 16) % 3]  # GQA 4, group 3, MHA
    # one position, page +- 1, a chunked prefill (fewer queries than positions), a long prompt
    seq_lens = [1, page - 1, page + 1, 3 * page + 5, 200]
    q_lens = [1, page - 1, 7, 3 * page + 5, 130]
    prob = testing.make_problem(seq_lens, q_lens, heads[0], heads[1], head_dim, page, dtype=dtype, device=DEV,
                                seed=head_dim + page + int(causal))
    out, lse = run_prefill(prob, causal)
    exact, exact_lse = reference.paged_attention(prob.q, prob.k_cache, prob.v_cache, prob.block_tables,
                                                 prob.seq_lens, prob.cu_seqlens_q, prob.scale, causal,
                                                 exact=True, return_lse=True)
    _check_out(out, exact, dtype, "prefill out")
    _check_lse(lse, exact_lse, dtype, "prefill lse")


@pytest.mark.parametrize("rows", ["64", "128", "wgmma"])
def test_prefill_long_causal_bf16(rows, monkeypatch):
    """Many key tiles, several query tiles per sequence, the diagonal in the middle of tiles."""
    _need("prefill")
    force_prefill_kernel(monkeypatch, rows)
    prob = testing.make_problem([1500, 777], [1500, 300], 8, 2, 128, 64, device=DEV, seed=7)
    out, lse = run_prefill(prob, True)
    exact, exact_lse = reference.paged_attention(prob.q, prob.k_cache, prob.v_cache, prob.block_tables,
                                                 prob.seq_lens, prob.cu_seqlens_q, prob.scale, True,
                                                 exact=True, return_lse=True)
    err = _check_out(out, exact, torch.bfloat16, "prefill long")
    _check_lse(lse, exact_lse, torch.bfloat16, "prefill long lse")
    print(f"prefill long causal bf16, {rows}-row tiles: {err:.2f} ulps")


def test_prefill_tokens_outside_sequences_untouched_and_deterministic():
    _need("prefill")
    prob = testing.make_problem([50, 90], [20, 33], 4, 2, 64, 16, device=DEV, seed=3)
    # two padding tokens past cu_seqlens_q[-1]
    prob.q = torch.cat([prob.q, torch.randn(2, 4, 64, device=DEV).to(prob.q.dtype)])
    out1, lse1 = run_prefill(prob, True)
    out2, lse2 = run_prefill(prob, True)
    assert torch.isnan(out1[-2:]).all() and torch.isnan(lse1[-2:]).all(), "rows of no sequence were written"
    assert torch.equal(out1[:-2], out2[:-2]) and torch.equal(lse1[:-2], lse2[:-2]), "not bit-reproducible"


def test_prefill_strided_views():
    """q and out as views of wider buffers (token stride != heads * head_dim)."""
    _need("prefill")
    prob = testing.make_problem([100, 40], [100, 3], 4, 2, 128, 32, device=DEV, seed=11)
    wide = torch.randn(prob.q.shape[0], 10, 128, device=DEV).to(prob.q.dtype)
    wide[:, 3:7] = prob.q
    q = wide[:, 3:7]
    out_buf = testing.poison_(torch.empty(prob.q.shape[0], 9, 128, dtype=prob.q.dtype, device=DEV))
    out = out_buf[:, 2:6]
    ops.prefill(out, None, q, prob.k_cache, prob.v_cache, prob.block_tables, prob.seq_lens, prob.cu_seqlens_q,
                prob.max_q_len, prob.scale, True)
    exact = reference.paged_attention(prob.q, prob.k_cache, prob.v_cache, prob.block_tables, prob.seq_lens,
                                      prob.cu_seqlens_q, prob.scale, True, exact=True)
    _check_out(out, exact, torch.bfloat16, "prefill strided")
    assert torch.isnan(out_buf[:, :2]).all() and torch.isnan(out_buf[:, 6:]).all(), "wrote outside the view"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_lse_merges_two_halves(dtype):
    """Cascade use: prefill over two disjoint page ranges, merged with the lse,
    equals one pass over all pages (non-causal: the shared-prefix case)."""
    _need("prefill")
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
    exact, exact_lse = reference.paged_attention(prob.q, prob.k_cache, prob.v_cache, prob.block_tables,
                                                 prob.seq_lens, prob.cu_seqlens_q, prob.scale, False,
                                                 exact=True, return_lse=True)
    _check_out(merged, exact, dtype, "merged halves")
    _check_lse(merged_lse.float(), exact_lse, dtype, "merged halves lse")
    if has_cuda_kernel("combine"):
        out = testing.poison_(torch.empty_like(prob.q))
        lse = testing.poison_(torch.empty(prob.q.shape[:2], dtype=torch.float32, device=DEV))
        ops.combine(out, lse, torch.stack([h[0].float() for h in halves]).contiguous(),
                    torch.stack([h[1] for h in halves]).contiguous())
        _check_out(out, exact, dtype, "combine of halves")


# ---------------------------------------------------------------- decode sweep
DECODE_CASES = []
_i = 0
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for d in (64, 128, 256):
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
    _need("decode")
    kv_heads = 2
    seq_lens = [n, page - 1 if page - 1 >= n else page, page + 1, 700]
    prob = testing.make_problem(seq_lens, [n] * len(seq_lens), group * kv_heads, kv_heads, head_dim, page,
                                dtype=dtype, device=DEV, seed=group * 100 + n + head_dim + page)
    po, pl = run_decode(prob, causal, splits)
    assert not torch.isnan(po).any() and not torch.isnan(pl).any(), "unwritten or NaN partials"
    merged, merged_lse = reference.merge_partials(po, pl)
    exact, exact_lse = reference.paged_attention(prob.q, prob.k_cache, prob.v_cache, prob.block_tables,
                                                 prob.seq_lens, prob.cu_seqlens_q, prob.scale, causal,
                                                 exact=True, return_lse=True)
    _check_out(merged, exact, dtype, "decode merged")
    _check_lse(merged_lse.float(), exact_lse, dtype, "decode lse")
    check_neutral_splits(po, pl, prob, splits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("splits", [5, 32])
def test_decode_split_rule(dtype, splits):
    """Each split's partial is attention over its own pages of the sequence
    alone, [i * ceil(P / S), (i + 1) * ceil(P / S)) (the decode op's docs):
    several pages, one, a last short one, none."""
    _need("decode")
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
            _check_out(po[i, rows], ref, dtype, what)
            _check_lse(pl[i, rows], ref_lse, dtype, what + " lse")


def test_decode_deterministic_and_padded_slots():
    """Padded batch slots (seq_lens 0, no queries) cost nothing and write nothing;
    a slot with a query but no positions writes out 0, lse -inf; same bits twice."""
    _need("decode")
    prob = testing.make_problem([300, 5, 64], [1, 1, 1], 32, 8, 128, 64, device=DEV, seed=21)
    prob.seq_lens[1] = 0  # a query that sees nothing
    po1, pl1 = run_decode(prob, True, 8)
    po2, pl2 = run_decode(prob, True, 8)
    assert torch.equal(po1, po2) and torch.equal(pl1, pl2)
    assert torch.all(po1[:, 1] == 0) and torch.all(pl1[:, 1] == float("-inf"))
    merged, _ = reference.merge_partials(po1, pl1)
    exact, _ = exact_attention(prob, True)
    _check_out(merged, exact, torch.bfloat16, "decode with an empty slot")


# ---------------------------------------------------------------- bad device data
@pytest.mark.parametrize("op", ["prefill", "decode"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_adversarial_metadata(op, dtype):
    """Out-of-range and negative page ids, seq_lens beyond the table and negative:
    no access outside the pools (the context survives), skipped positions
    contribute nothing, exactly as the reference treats them."""
    _need(op)
    page = 16
    prob = testing.make_problem([70, 40, 33, 20], [5, 3, 2, 1], 8, 2, 64, page, dtype=dtype, device=DEV, seed=9)
    bt = prob.block_tables
    num_pages = prob.k_cache.shape[0]
    bt[0, 1] = -5
    bt[0, 2] = num_pages + 7
    bt[1, 0] = 2**31 - 1
    bt[2, :] = -1  # all pages bad: its rows see nothing
    prob.seq_lens[1] = 10**6  # beyond what the table holds: clamped
    prob.seq_lens[3] = -4  # negative: no position
    if op == "prefill":
        out, lse = run_prefill(prob, True)
        got, got_lse = out, lse
    else:
        po, pl = run_decode(prob, True, 4)
        got, got_lse = reference.merge_partials(po, pl)
        got_lse = got_lse.float()
    torch.cuda.synchronize()
    exact, exact_lse = exact_attention(prob, True)
    assert not torch.isnan(got).any()
    _check_out(got, exact, dtype, f"{op} adversarial")
    _check_lse(got_lse, exact_lse, dtype, f"{op} adversarial lse")
    # The context is alive: a normal op still runs.
    torch.ones(4, device=DEV).sum().item()


# ---------------------------------------------------------------- CUDA graphs
def test_decode_cuda_graph_replay_as_sequences_grow():
    """One decode step captured once, replayed while the sequences grow across
    page boundaries (the host only rewrites the static seq_lens buffer); every
    replay equals an eager call on the same inputs."""
    _need("decode")
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
                                          prob.cu_seqlens_q, prob.scale, True, exact=True)
        _check_out(merged, exact, torch.bfloat16, f"graph step {k}")
