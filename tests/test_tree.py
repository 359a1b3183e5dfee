"""Tree verify (docs/CONTRACT.md, "Tree verify"): a step of up to 16 drafted
tokens per sequence arranged as a tree, verified in one decode / attention
call with a tree mask, against per-path float64 attention (each token sees
its sequence's cached prefix, its ancestors and itself); the RoPE positions
of attention_inputs (tree depths, cache slots unchanged); the host helpers
that build and check the words; bad input. On the CPU, and on CUDA (marked
gpu; skipped without a device).

Outputs are poisoned with NaN first, and every cache slot that no result may
read holds NaN (op_helpers.poison_unowned_). The oracle is computed before
the poisoning."""
import dataclasses
import random

import pytest
import torch

from op_helpers import (DEVICES, check_lse, check_out, exact_attention, kernel_queries, need, need_path,
                        poison_unowned_, run_attention, run_combine, run_decode)
from tileinfer_attn import ops as ti
from tileinfer_attn import reference
from tileinfer_attn.layer import PagedAttention
from tileinfer_attn.metadata import AttentionMetadata, check_tree_mask, tree_mask_words, tree_positions
from tileinfer_attn.testing import make_problem

ops = torch.ops.tileinfer_attn

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (num_q_heads, num_kv_heads): groups 1, 4 and 8.
GROUPS = [(4, 4), (8, 2), (8, 1)]


def random_parents(n, rng):
    """A random tree of n tokens in topological order: token 0 the root, every
    other token's parent an earlier token."""
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def ancestors(parents, i):
    """Token i and its ancestors (step indices)."""
    out = []
    while i != -1:
        out.append(i)
        i = parents[i]
    return out


def path_attention(p, parents, scale):
    """float64 out [num_tokens, hq, d] and lse: each tree token of sequence s
    attends to the positions before the step and to its ancestors and itself,
    nothing else (per-path causal attention, written out independently of the
    reference's masks)."""
    t, hq, d = p.q.shape
    group = hq // p.k_cache.shape[1]
    out = torch.zeros(t, hq, d, dtype=torch.float64)
    lse = torch.full((t, hq), float("-inf"), dtype=torch.float64)
    cu = p.cu_seqlens_q.tolist()
    for s, ps in enumerate(parents):
        if not ps:
            continue
        k, v, valid = reference.gather_kv(p.k_cache, p.v_cache, p.block_tables, p.seq_lens, s, p.k_scale,
                                          p.v_scale, p.k_smooth)
        k = k.double().cpu().repeat_interleave(group, 1)
        v = v.double().cpu().repeat_interleave(group, 1)
        length, n = k.shape[0], len(ps)
        for i in range(n):
            keys = list(range(length - n)) + [length - n + j for j in sorted(ancestors(ps, i))]
            keys = [x for x in keys if bool(valid[x])]
            qi = p.q[cu[s] + i].double().cpu()  # [hq, d]
            sc = torch.einsum("hd,khd->hk", qi, k[keys]) * scale
            lse[cu[s] + i] = torch.logsumexp(sc, -1)
            out[cu[s] + i] = torch.einsum("hk,khd->hd", torch.softmax(sc, -1), v[keys])
    return out, lse


def tree_problem(tree_sizes, prefix_lens, heads, page, dtype, device, seed, int8=False, head_dim=64):
    """A batch of random trees of tree_sizes tokens after prefixes of
    prefix_lens cached positions, heads = (query heads, KV heads): the
    problem (scale twice head_dim ** -0.5), the parent lists and the mask
    words."""
    rng = random.Random(seed)
    parents = [random_parents(n, rng) for n in tree_sizes]
    lens = [pre + n for pre, n in zip(prefix_lens, tree_sizes)]
    p = make_problem(lens, tree_sizes, heads[0], heads[1], head_dim, page, dtype=dtype, device=device, seed=seed,
                     int8=int8)
    # Larger scores than head_dim ** -0.5 alone gives, so that masking a key shows.
    p = dataclasses.replace(p, scale=2.0 * p.scale)
    return p, parents, tree_mask_words(parents, device=device)


# ------------------------------------------------------------------ the tree against per-path attention
def check_trees(batches, heads, page, dtype, device, seed, head_dim=64):
    """Each batch of (tree sizes, prefix lengths): decode (3 splits) +
    combine and the attention op against per-path float64 attention, the
    cache poisoned past each sequence's end after the oracle."""
    for sizes, prefixes in batches:
        p, parents, mask = tree_problem(sizes, prefixes, heads, page, dtype, device, seed, head_dim=head_dim)
        exact, exact_lse = path_attention(p, parents, p.scale)
        exact, exact_lse = exact.to(device), exact_lse.to(device)
        poison_unowned_(p)
        what = f"tree {sizes} {dtype} heads={heads} page={page} d={head_dim}"
        po, pl = run_decode(p, True, 3, tree_mask=mask)
        out, lse = run_combine(po, pl, dtype)
        check_out(out, exact, dtype, f"decode + combine {what}")
        check_lse(lse, exact_lse, dtype, f"decode + combine {what} lse")
        out = run_attention(p, True, tree_mask=mask)
        check_out(out, exact, dtype, f"attention {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("heads", GROUPS, ids=["group1", "group4", "group8"])
def test_tree_matches_path_attention(heads, dtype, page, device, seed):
    """One sequence with a random tree of 16 drafts, then a batch of sequences
    of different lengths with trees of 1 to 16 tokens: decode (3 splits) +
    combine and the attention op against per-path float64 attention."""
    if device == "cuda":
        need_path("attention")
    rng = random.Random(seed)
    check_trees([([16], [2 * page + 7]),
                 ([1, 16, rng.randint(2, 15), 5, 3], [0, page - 16 + 1 if page > 16 else 1, 3 * page + 1, 40, page])],
                heads, page, dtype, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_tree_head_dims(head_dim, dtype, device, seed):
    """Trees at head dims 128 and 256 (on CUDA the tensor-core decode tiles
    of those dims; d 256's large tile takes 32 keys a tile), group 4 (8
    query / 2 KV heads), pages of 64: a sequence with a tree of 16 drafts, a
    batch of trees of 1 to 16 tokens (64 packed rows: the large decode tile),
    one of at most 8 tokens (32 rows: on CUDA the 64-row tile, the step having
    more than one (sequence, KV head) pair) and one of at most 4 (16 rows),
    some across a page boundary."""
    if device == "cuda":
        need_path("attention")
    page = 64
    rng = random.Random(seed)
    check_trees([([16], [2 * page + 7]),
                 ([1, 16, rng.randint(2, 15), 5, 3], [0, page - 16 + 1, 3 * page + 1, 40, page]),
                 ([8, 5, 1, rng.randint(2, 8)], [page - 3, 0, 2 * page, 17]),
                 ([4, 3, 1, 4], [page + 5, 0, 2 * page, page - 2])],
                (8, 2), page, dtype, device, seed, head_dim=head_dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [16, 64])
def test_tree_int8_cache(page, device, seed):
    """The int8 cache (with smoothing factors) under a tree: against per-path
    float64 attention of the dequantized cache (on CUDA the lse against the
    queries as the int8 kernels round them)."""
    if device == "cuda":
        need_path("attention")
    p, parents, mask = tree_problem([16, 7, 1, 12], [page + 3, 2, 2 * page, 0], (8, 2), page, torch.bfloat16,
                                    device, seed, int8=True)
    exact, exact_lse = path_attention(p, parents, p.scale)
    if device == "cuda":
        _, exact_lse = path_attention(dataclasses.replace(p, q=kernel_queries(p), k_smooth=None), parents, p.scale)
    exact, exact_lse = exact.to(device), exact_lse.to(device)
    poison_unowned_(p)
    po, pl = run_decode(p, True, 2, tree_mask=mask)
    out, lse = run_combine(po, pl, torch.bfloat16)
    check_out(out, exact, torch.bfloat16, "int8 decode + combine", ulps=6)
    check_lse(lse, exact_lse, torch.bfloat16, "int8 decode + combine lse", rel=1e-3)
    out = run_attention(p, True, tree_mask=mask)
    check_out(out, exact, torch.bfloat16, "int8 attention", ulps=6)


# ------------------------------------------------------------------ with the per-layer variants
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_tree_with_window_and_sinks(causal, dtype, device, seed):
    """A tree with a sliding window (slot positions: the window counts the
    step's tokens as they sit in the cache) and sinks, and with a soft-cap:
    against the float64 reference with the same tree mask, in fp32 (on CUDA
    the CUDA-core kernel) and bf16 (the tensor-core decode tiles: group 4
    and trees of up to 16 tokens, the large tile). Non-causal: the bits
    alone decide which step tokens a token sees. The cache holds NaN past
    each sequence's end (the oracles computed first)."""
    if device == "cuda":
        need_path("attention")
    page = 16
    p, parents, mask = tree_problem([16, 9, 4], [50, 3, 20], (8, 2), page, dtype, device, seed)
    if not causal:  # some bits at later tokens too, which non-causal attention honors
        mask = mask | torch.tensor([1 << (15 - i % 16) for i in range(mask.shape[0])], dtype=torch.int32,
                                   device=device) & ((1 << 16) - 1)
        mask = mask.to(torch.int32)
    g = torch.Generator().manual_seed(seed)
    sinks = (torch.randn(8, generator=g) * 2).to(device)
    cases = (dict(window_left=20, sinks=sinks), dict(window_left=5), dict(logits_soft_cap=2.5, sinks=sinks))
    oracles = [exact_attention(p, causal, tree_mask=mask, **kw) for kw in cases]
    poison_unowned_(p)
    for kw, (exact, exact_lse) in zip(cases, oracles):
        po, pl = run_decode(p, causal, 3, tree_mask=mask, **kw)
        out, lse = run_combine(po, pl, dtype)
        check_out(out, exact, dtype, f"decode + combine {dtype} {kw}")
        check_lse(lse, exact_lse, dtype, f"decode + combine {dtype} {kw} lse")
        check_out(run_attention(p, causal, tree_mask=mask, **kw), exact, dtype, f"attention {dtype} {kw}")


def test_reference_tree_mask_is_path_attention(seed):
    """The reference's tree mask (exact and eager) is per-path attention."""
    p, parents, mask = tree_problem([16, 5, 1], [10, 0, 33], (8, 2), 16, torch.float32, "cpu", seed)
    exact, exact_lse = path_attention(p, parents, p.scale)
    out, lse = reference.paged_attention(*p.args(), p.scale, True, tree_mask=mask, exact=True, return_lse=True)
    assert (out - exact).abs().max() < 1e-12 and (lse - exact_lse).abs().max() < 1e-12
    eager = reference.paged_attention(*p.args(), p.scale, True, tree_mask=mask)
    check_out(eager, exact, torch.float32, "eager reference with a tree")


# ------------------------------------------------------------------ any bits, no fault
@pytest.mark.parametrize("device", DEVICES)
def test_any_bits_are_safe(device, seed):
    """Random words (bit 31, bits past the step, bits at later tokens, all
    zeros) never fault: under causal the kernels use bit j for j <= i only and
    the keys past the step do not exist, so the result is that of the words
    cut to those bits; a row that sees nothing gives 0."""
    if device == "cuda":
        need_path("attention")
    g = torch.Generator().manual_seed(seed)
    p = make_problem([40, 16, 9], [16, 16, 9], 8, 2, 64, 16, dtype=torch.float32, device=device, seed=seed)
    words = torch.randint(-2**31, 2**31, (p.q.shape[0],), generator=g, dtype=torch.int64)
    words[3] = 0       # sees only the prefix
    words[16] = 0      # the second sequence has no prefix: sees nothing
    words[20] = -1     # every bit
    raw = words.to(torch.int32).to(device)
    cut = words.clone()
    cu = p.cu_seqlens_q.tolist()
    for s in range(3):
        for i in range(cu[s + 1] - cu[s]):
            cut[cu[s] + i] &= (1 << (i + 1)) - 1
    exact, exact_lse = exact_attention(p, True, tree_mask=cut.to(torch.int32).to(device))
    poison_unowned_(p)
    po, pl = run_decode(p, True, 2, tree_mask=raw)
    out, lse = run_combine(po, pl, torch.float32)
    check_out(out, exact, torch.float32, "decode with random words")
    check_lse(lse, exact_lse, torch.float32, "decode with random words lse")
    assert torch.all(out[16] == 0) and torch.all(lse[16] == float("-inf"))
    check_out(run_attention(p, True, tree_mask=raw), exact, torch.float32, "attention with random words")


# ------------------------------------------------------------------ RoPE positions
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_inputs_positions(qk_norm, pos_dtype, device, seed):
    """attention_inputs with explicit positions (tree depths) rotates by them,
    bit-identical to rms_norm + rope(positions) + cache_write, and writes the
    keys at the slots of the metadata (consecutive), not at the positions."""
    if device == "cuda":
        need("attention_inputs", "rope", "rms_norm", "cache_write")
    rng = random.Random(seed)
    sizes, prefixes = [16, 3, 1], [20, 0, 7]
    parents = [random_parents(n, rng) for n in sizes]
    p = make_problem([a + b for a, b in zip(prefixes, sizes)], sizes, 8, 2, 64, 16, dtype=torch.bfloat16,
                     device=device, seed=seed)
    positions = tree_positions(parents, p.seq_lens.tolist(), device=device).to(pos_dtype)
    g = torch.Generator().manual_seed(seed)
    t = p.q.shape[0]
    k = torch.randn(t, 2, 64, generator=g).to(device, torch.bfloat16)
    v = torch.randn(t, 2, 64, generator=g).to(device, torch.bfloat16)
    cos_sin = ti.rope_cos_sin_cache(64, 256, device=device)
    qw = kw = None
    if qk_norm:
        qw = (torch.rand(64, generator=g) + 0.5).to(device, torch.bfloat16)
        kw = (torch.rand(64, generator=g) + 0.5).to(device, torch.bfloat16)
    # Separate ops.
    k_sep, v_sep = p.k_cache.clone(), p.v_cache.clone()
    q_in, k_in = p.q, k
    if qk_norm:
        q_in, k_in = ti.rms_norm(q_in, qw), ti.rms_norm(k_in, kw)
    q_sep = ti.rope(q_in, positions, cos_sin)
    ti.cache_write(k_sep, v_sep, ti.rope(k_in, positions, cos_sin), v, p.block_tables, p.seq_lens, p.cu_seqlens_q)
    # Fused.
    k_fused, v_fused = p.k_cache.clone(), p.v_cache.clone()
    q_fused = ti.attention_inputs(p.q, k, v, k_fused, v_fused, p.block_tables, p.seq_lens, p.cu_seqlens_q, cos_sin,
                                  q_norm_weight=qw, k_norm_weight=kw, positions=positions)
    assert torch.equal(q_fused, q_sep)
    assert torch.equal(k_fused, k_sep) and torch.equal(v_fused, v_sep)
    # The eager reference: rope at the positions, cache slots from the metadata.
    q_ref, k_ref = p.q, k
    if qk_norm:
        q_ref, k_ref = reference.rms_norm(q_ref, qw, 1e-6), reference.rms_norm(k_ref, kw, 1e-6)
    assert (q_fused.float() - reference.rope(q_ref, positions, cos_sin, 64).float()).abs().max() <= \
        2 * q_fused.float().abs().max() * 2**-8
    k_ref_cache, v_ref_cache = p.k_cache.clone(), p.v_cache.clone()
    reference.cache_write(k_ref_cache, v_ref_cache, reference.rope(k_ref, positions, cos_sin, 64), v,
                          p.block_tables, p.seq_lens, p.cu_seqlens_q)
    assert torch.equal(v_fused, v_ref_cache)
    diff = (k_fused.float() - k_ref_cache.float()).abs().max()
    assert diff <= 2 * k_fused.float().abs().max() * 2**-8
    # Without positions: the slot positions, which differ from the depths here.
    q_slots = ti.attention_inputs(p.q, k, v, p.k_cache.clone(), p.v_cache.clone(), p.block_tables, p.seq_lens,
                                  p.cu_seqlens_q, cos_sin, q_norm_weight=qw, k_norm_weight=kw)
    assert not torch.equal(q_slots, q_fused)


# ------------------------------------------------------------------ host helpers
def test_tree_mask_words_and_positions():
    parents = [[-1, 0, 0, 1, 3], [-1], []]
    words = tree_mask_words(parents)
    assert words.dtype == torch.int32
    assert words.tolist() == [0b1, 0b11, 0b101, 0b1011, 0b11011, 0b1]
    assert tree_positions(parents, [10, 4, 0]).tolist() == [5, 6, 6, 7, 8, 3]
    chain = tree_mask_words([[-1] + list(range(15))])
    assert chain.tolist() == [(1 << (i + 1)) - 1 for i in range(16)]


def test_tree_helpers_reject_bad_trees():
    with pytest.raises(RuntimeError, match="tree_mask.*more than 16"):
        tree_mask_words([[-1] + [0] * 16])
    with pytest.raises(RuntimeError, match="tree_mask.*outside"):
        tree_mask_words([[-1, 5]])
    with pytest.raises(RuntimeError, match="tree_mask.*cycle"):
        tree_mask_words([[1, 0]], causal=False)
    with pytest.raises(RuntimeError, match=r"tree_mask\[1\].*later tokens"):
        tree_mask_words([[-1, 2, 0]])
    assert tree_mask_words([[-1, 2, 0]], causal=False).tolist() == [0b1, 0b111, 0b101]
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"tree_mask\[0\].*past the step"):
        check_tree_mask(torch.tensor([0b100, 0b11], dtype=torch.int32), cu)
    with pytest.raises(RuntimeError, match=r"tree_mask\[0\].*later tokens"):
        check_tree_mask(torch.tensor([0b11, 0b11], dtype=torch.int32), cu)
    check_tree_mask(torch.tensor([0b11, 0b11], dtype=torch.int32), cu, causal=False)


# ------------------------------------------------------------------ bad input
def _bad_call_args(device):
    p = make_problem([20, 5], [4, 2], 8, 2, 64, 16, dtype=torch.float32, device=device, seed=0)
    return p, tree_mask_words([[-1, 0, 1, 1], [-1, 0]], device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["decode", "attention"])
def test_bad_tree_mask(path, device):
    if device == "cuda":
        need_path(path)
    p, mask = _bad_call_args(device)

    def call(tree_mask, max_q_len=p.max_q_len):
        args = (p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, max_q_len, p.scale, True)
        if path == "decode":
            po = torch.empty(2, *p.q.shape, device=device)
            pl = torch.empty(2, *p.q.shape[:2], device=device)
            ops.decode(po, pl, *args, tree_mask=tree_mask)
        else:
            ops.attention(torch.empty_like(p.q), *args, tree_mask=tree_mask)

    with pytest.raises(RuntimeError, match=f"{path}: tree_mask must be int32"):
        call(mask.long())
    with pytest.raises(RuntimeError, match=f"{path}: tree_mask must have shape \\[6\\]"):
        call(mask[:5])
    with pytest.raises(RuntimeError, match=f"{path}: tree_mask must have shape"):
        call(mask[None])
    with pytest.raises(RuntimeError, match=f"{path}: tree_mask must be contiguous"):
        call(torch.stack([mask, mask], 1)[:, 0])
    if device == "cuda":
        with pytest.raises(RuntimeError, match=f"{path}: tree_mask must be on cuda"):
            call(mask.cpu())
    bound = "max_q_len must be at most 16" if path == "decode" else "tree_mask is for steps of at most 16"
    with pytest.raises(RuntimeError, match=f"{path}: .*{bound}"):
        call(mask, max_q_len=17)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_rejects_a_tree_mask(device):
    if device == "cuda":
        need_path("prefill")
    p, mask = _bad_call_args(device)
    with pytest.raises(RuntimeError, match="prefill: tree_mask is not supported"):
        ops.prefill(torch.empty_like(p.q), None, *p.args(), p.scale, True, tree_mask=mask)
    with pytest.raises(RuntimeError, match="prefill: tree_mask is not supported"):
        ti.prefill(*p.args(), tree_mask=mask)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_positions(device):
    if device == "cuda":
        need("attention_inputs")
    p, _ = _bad_call_args(device)
    t = p.q.shape[0]
    k = torch.zeros(t, 2, 64, device=device)
    cos_sin = ti.rope_cos_sin_cache(64, 64, device=device)

    def call(positions):
        ti.attention_inputs(p.q, k, k, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, cos_sin,
                            positions=positions)

    with pytest.raises(RuntimeError, match="attention_inputs: positions must be int32 or int64"):
        call(torch.zeros(t, device=device))
    with pytest.raises(RuntimeError, match=r"attention_inputs: positions must have shape \[6\]"):
        call(torch.zeros(t + 1, dtype=torch.int64, device=device))
    if device == "cuda":
        with pytest.raises(RuntimeError, match="attention_inputs: positions must be on"):
            call(torch.zeros(t, dtype=torch.int64))
    else:
        with pytest.raises(RuntimeError, match="attention_inputs: .*beyond cos_sin_cache"):
            call(torch.full((t,), 64, dtype=torch.int64))


# ------------------------------------------------------------------ the module, opcheck, compile
@pytest.mark.parametrize("device", DEVICES)
def test_module_tree_step(device, seed):
    """PagedAttention with RoPE on a tree verify step (metadata built from
    parent lists) against its eager reference backend."""
    if device == "cuda":
        need_path("attention")
        need("attention_inputs")
    rng = random.Random(seed)
    sizes, prefixes = [16, 5], [30, 2]
    parents = [random_parents(n, rng) for n in sizes]
    page, hq, hkv, d = 16, 8, 2, 64
    lens = [a + b for a, b in zip(prefixes, sizes)]
    p = make_problem(lens, sizes, hq, hkv, d, page, dtype=torch.float32, device=device, seed=seed)
    md = AttentionMetadata.build(p.block_tables, lens, sizes, device, tree_parents=parents)
    assert torch.equal(md.tree_mask.cpu(), tree_mask_words(parents))
    cos_sin = ti.rope_cos_sin_cache(d, 256, device=device)
    g = torch.Generator().manual_seed(seed)
    t = sum(sizes)
    q = torch.randn(t, hq * d, generator=g).to(device)
    k = torch.randn(t, hkv * d, generator=g).to(device)
    v = torch.randn(t, hkv * d, generator=g).to(device)
    outs = []
    for backend in ("tileinfer", "reference"):
        attn = PagedAttention(hq, hkv, d, cos_sin_cache=cos_sin, backend=backend)
        outs.append(attn(q, k, v, (p.k_cache.clone(), p.v_cache.clone()), md))
    assert (outs[0] - outs[1]).abs().max() <= 1e-5 * outs[1].abs().max().clamp_min(1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["decode", "attention", "attention_inputs"])
def test_opcheck_with_tree(op, device):
    if device == "cuda":
        need(op if op != "attention" else "decode")
    p, mask = _bad_call_args(device)
    if op == "decode":
        args = (torch.empty(2, *p.q.shape, device=device), torch.empty(2, *p.q.shape[:2], device=device),
                *p.args(), p.scale, True)
        kwargs = dict(tree_mask=mask)
    elif op == "attention":
        args = (torch.empty_like(p.q), *p.args(), p.scale, True)
        kwargs = dict(tree_mask=mask, window_left=7)
    else:
        t = p.q.shape[0]
        k = torch.randn(t, 2, 64, device=device)
        cos_sin = ti.rope_cos_sin_cache(64, 64, device=device)
        args = (torch.empty_like(p.q), p.k_cache, p.v_cache, p.q, k, k.clone(), p.block_tables, p.seq_lens,
                p.cu_seqlens_q, cos_sin, 64, None, None, 1e-6)
        kwargs = dict(positions=torch.tensor([3, 4, 4, 5, 3, 4], device=device))
    torch.library.opcheck(getattr(ops, op).default, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_with_tree(device):
    if device == "cuda":
        need_path("attention")
        need("attention_inputs")
    p, mask = _bad_call_args(device)
    t = p.q.shape[0]
    k = torch.randn(t, 2, 64, device=device)
    cos_sin = ti.rope_cos_sin_cache(64, 64, device=device)
    positions = torch.tensor([3, 4, 4, 5, 3, 4], device=device)

    def step(q, k, v, k_cache, v_cache, tree_mask, positions):
        q = ti.attention_inputs(q, k, v, k_cache, v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, cos_sin,
                                positions=positions)
        return ti.attention(q, k_cache, v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len,
                            tree_mask=tree_mask)

    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    eager = step(p.q, k, k, kc, vc, mask, positions)
    kc2, vc2 = p.k_cache.clone(), p.v_cache.clone()
    compiled = torch.compile(step, fullgraph=True)(p.q, k, k, kc2, vc2, mask, positions)
    assert torch.equal(eager, compiled)


# ------------------------------------------------------------------ CUDA graphs
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_cuda_graph_replays_different_trees(int8, seed):
    """One captured attention call replayed with different trees written into
    its static tree-mask buffer: each replay matches per-path float64
    attention."""
    need_path("attention")
    rng = random.Random(seed)
    sizes, prefixes = [16, 16, 16], [70, 5, 33]
    p, _, _ = tree_problem(sizes, prefixes, (8, 2), 16, torch.bfloat16, "cuda", seed, int8=int8)
    tree_buf = torch.zeros(p.q.shape[0], dtype=torch.int32, device="cuda")
    out = torch.empty_like(p.q)
    kw = p.quant_kwargs()

    def run():
        ops.attention(out, *p.args(), p.scale, True, tree_mask=tree_buf, **kw)

    run()  # the kernels' one-time setup (shared-memory opt-ins) before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for step in range(4):
        parents = [random_parents(n, rng) for n in sizes]
        tree_buf.copy_(tree_mask_words(parents))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        exact, _ = path_attention(p, parents, p.scale)
        check_out(out, exact.cuda(), torch.bfloat16, f"replay {step}", ulps=6 if int8 else 4)
