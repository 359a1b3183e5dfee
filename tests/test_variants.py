"""The per-layer attention variants (docs/CONTRACT.md, "Per-layer variants"): a
sliding window (window_left), a logits soft-cap and learned sinks, alone and
combined as models use them (gpt-oss: window + sinks; Gemma 2: window +
soft-cap), through prefill, decode + combine and attention, against float64
attention with the same variants. On the CPU, and on CUDA (marked gpu; the
kernel-by-kernel sweeps are in test_variants_gpu.py).

Every output is poisoned with NaN first, and the cache holds NaN in every slot
that no result may read (op_helpers.poison_unowned_): past each sequence's
end, spare pages, and the pages wholly before the window of a sequence's first
query of the step, which the kernels must never read. The oracle is computed
before the poisoning."""
import dataclasses

import pytest
import torch

from op_helpers import (DEVICES, QUANT_KINDS, ULPS, check_lse, check_neutral_splits, check_out, exact_attention, kernel_queries,
                        need_path, poison_unowned_, run_attention, run_combine, run_decode, run_prefill,
                        split_exact, split_pages, window_first_page)
from tileinfer_attn import reference
from tileinfer_attn.hf import window_left_of
from tileinfer_attn.layer import PagedAttention
from tileinfer_attn.metadata import AttentionMetadata
from tileinfer_attn.testing import make_problem

ops = torch.ops.tileinfer_attn

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (num_q_heads, num_kv_heads): MHA, GQA 4, GQA 3 (prefill path only), MQA 8.
GROUPS = [(4, 4), (8, 2), (6, 2), (8, 1)]
VARIANTS = ["window", "softcap", "sinks", "gpt-oss", "gemma2"]


def sinks_for(hq, seed, device):
    """Sink logits of every size: some far below the scores (no effect), some
    near them, one far above (most of each row's probability goes to it)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(hq, generator=g) * 2
    s[0] = 6.0
    s[-1] = -30.0
    return s.to(device)


def variant_kwargs(name, window, hq, seed, device):
    kw = {}
    if name in ("window", "gpt-oss", "gemma2"):
        kw["window_left"] = window
    if name in ("softcap", "gemma2"):
        kw["logits_soft_cap"] = 2.5  # scores reach several times this: tanh far from linear
    if name in ("sinks", "gpt-oss"):
        kw["sinks"] = sinks_for(hq, seed, device)
    return kw


def windows_for(page):
    """Window sizes around page boundaries, 0 and 1, and one larger than any
    context (fewer at page 64, where the CPU takes longer)."""
    return [0, 1, page - 1, page + 3, 10**6] if page <= 16 else [0, page - 1, 10**6]


def lens_for(page, window):
    """Lengths around page and window boundaries, a one-position sequence."""
    w = min(window, 2 * page)
    return [1, w + 1, w + 2, page + 1, 2 * page + w + 5, 3 * page]


def problem(lens, q_lens, heads, page, dtype, device, seed, **cache):
    hq, hkv = heads
    p = make_problem(lens, q_lens, hq, hkv, 64, page, dtype=dtype, device=device, seed=seed, **cache)
    # Larger scores than head_dim ** -0.5 alone gives: the soft-cap's tanh and
    # the window's edge then change the result visibly.
    return dataclasses.replace(p, scale=3.0 * p.scale)


def check_all(out, lse, exact, exact_lse, dtype, what, ulps=ULPS):
    check_out(out, exact, dtype, what, ulps=ulps)
    if lse is not None:
        check_lse(lse, exact_lse, dtype, f"{what} lse")


# ------------------------------------------------------------------ every path, every variant
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_exact(variant, page, causal, device, seed):
    """prefill (out, lse), decode (3 splits) + combine and attention, for
    windows of 0, 1, around a page and larger than the context, over prompts,
    chunks and 1-16-query steps."""
    if device == "cuda":
        need_path("attention")
    i = VARIANTS.index(variant) + 2 * (page == 64) + 4 * causal
    dtype = DTYPES[i % 3]
    heads = GROUPS[i % len(GROUPS)]
    for j, window in enumerate(windows_for(page) if "window" in variant or variant in ("gpt-oss", "gemma2")
                               else [-1]):
        lens = lens_for(page, max(window, 0))
        kw = variant_kwargs(variant, window, heads[0], seed + j, device)
        what = f"{variant} window={window} {dtype} heads={heads}"
        # A prefill batch: a whole prompt, chunks of 17 and 5, decode steps, one position.
        pre = problem(lens, [1, min(17, lens[1]), 1, lens[3], 5, 2 * page], heads, page, dtype, device, seed + j)
        exact, exact_lse = exact_attention(pre, causal, **kw)
        poison_unowned_(pre, kw.get("window_left", -1))
        out, lse = run_prefill(pre, causal, **kw)
        check_all(out, lse, exact, exact_lse, dtype, f"prefill {what}")
        out = run_attention(pre, causal, **kw)
        check_out(out, exact, dtype, f"attention (prefill path) {what}")
        # A decode-shaped batch: 1-16 queries per sequence (decode path for power-of-two groups).
        dec = problem(lens, [1, 1, 2, 16, 5, 9], heads, page, dtype, device, seed + 7 + j)
        exact, exact_lse = exact_attention(dec, causal, **kw)
        poison_unowned_(dec, kw.get("window_left", -1))
        po, pl = run_decode(dec, causal, 3, **kw)
        out, lse = run_combine(po, pl, dtype)
        check_all(out, lse, exact, exact_lse, dtype, f"decode + combine {what}")
        out = run_attention(dec, causal, **kw)
        check_out(out, exact, dtype, f"attention {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["window", "gpt-oss", "gemma2"])
@pytest.mark.parametrize("quant", list(QUANT_KINDS))
def test_int8_cache_with_variants(quant, variant, device, seed):
    """The int8 and fp8 caches (smoothing factors included) with each model's variants:
    prefill and the attention op's decode path, against float64 attention on
    the dequantized cache. On CUDA the lse is checked against float64
    attention of the queries as the prefill kernel rounds them
    (kernel_queries(prefill=True): q * k_smooth per row to 15-bit integers,
    or to fp16 on the Hopper kernel, moves lse by up to ~1e-3); the CPU op
    does not round them."""
    if device == "cuda":
        need_path("attention")
    page, window = 16, 21
    lens = lens_for(page, window)
    kw = variant_kwargs(variant, window, 8, seed, device)
    for q_lens in ([1, 17, 1, 17, 5, 32], [1, 1, 2, 16, 5, 9]):
        p = problem(lens, q_lens, (8, 2), page, torch.bfloat16, device, seed, **QUANT_KINDS[quant])
        exact, exact_lse = exact_attention(p, True, **kw)
        if device == "cuda":
            queries = kernel_queries(p, prefill=True)
            _, exact_lse = exact_attention(dataclasses.replace(p, q=queries, k_smooth=None), True, **kw)
        poison_unowned_(p, window)
        out, lse = run_prefill(p, True, **kw)
        check_all(out, lse, exact, exact_lse, torch.bfloat16, f"{quant} prefill {variant} q_lens={q_lens}", ulps=6)
        out = run_attention(p, True, **kw)
        check_out(out, exact, torch.bfloat16, f"{quant} attention {variant} q_lens={q_lens}", ulps=6)


# ------------------------------------------------------------------ decode's splits
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_decode_splits_start_at_the_window(causal, device, seed):
    """Split i of a sequence attends pages F + [i ceil(P/S), (i+1) ceil(P/S))
    from F, the page of the first key its first query sees, exactly (the sink
    only in split 0); splits past its pages are neutral."""
    if device == "cuda":
        need_path("decode")
    page, splits, window = 16, 4, 40
    lens = [16 * 9 + 5, 3, 60, 41]
    q_lens = [2, 1, 4, 16]
    p = make_problem(lens, q_lens, 8, 2, 64, page, dtype=torch.float32, device=device, seed=seed)
    sinks = sinks_for(8, seed, device)
    po, pl = run_decode(p, causal, splits, window_left=window, sinks=sinks)
    cu = p.cu_seqlens_q.tolist()
    for s, length in enumerate(lens):
        first = window_first_page(length, q_lens[s], page, window)
        for i in range(splits):
            lo, hi = split_pages(length, page, i, splits, first)
            rows = slice(cu[s], cu[s + 1])
            exact, exact_lse = split_exact(p, s, lo, hi, causal, window_left=window,
                                           sinks=sinks if i == 0 else None)
            check_out(po[i, rows], exact, torch.float32, f"sequence {s} split {i}")
            check_lse(pl[i, rows], exact_lse, torch.float32, f"sequence {s} split {i} lse")
    check_neutral_splits(po, pl, p, splits, window_left=window, sinks=sinks)


# ------------------------------------------------------------------ what the variants must not change
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["prefill", "attention"])
def test_off_values_give_the_same_bits(path, device, seed):
    """A window larger than the context, sinks of -inf and a soft-cap of 0 are
    the plain attention, bit for bit: the variants change nothing else."""
    if device == "cuda":
        need_path(path)
    p = make_problem([70, 1, 33, 129], [70, 1, 4, 1] if path == "prefill" else [1, 1, 4, 1], 8, 2, 64, 16,
                     device=device, seed=seed)
    run = (lambda **kw: run_prefill(p, True, **kw)[0]) if path == "prefill" else (
        lambda **kw: run_attention(p, True, **kw))
    plain = run()
    same = run(window_left=129, logits_soft_cap=0.0, sinks=torch.full((8,), float("-inf"), device=device))
    assert torch.equal(plain, same)
    assert torch.equal(plain, run(window_left=10**9))


@pytest.mark.parametrize("device", DEVICES)
def test_sink_of_a_row_that_sees_nothing(device, seed):
    """A row that sees no position (an empty sequence, every page outside the
    pool) with a sink: out 0, lse = the sink (its whole probability)."""
    if device == "cuda":
        need_path("prefill")
    p = make_problem([0, 20, 33], [0, 2, 1], 4, 2, 64, 16, device=device, seed=seed)
    p.block_tables[1, :] = -1
    sinks = sinks_for(4, seed, device)
    out, lse = run_prefill(p, True, sinks=sinks)
    assert torch.all(out[:2] == 0)
    torch.testing.assert_close(lse[:2], sinks.expand(2, 4), rtol=1e-6, atol=1e-6)
    po, pl = run_decode(p, True, 2, sinks=sinks)
    out2, lse2 = run_combine(po, pl, torch.bfloat16)
    assert torch.all(out2[:2] == 0)
    torch.testing.assert_close(lse2[:2], sinks.expand(2, 4), rtol=1e-6, atol=1e-6)
    exact, exact_lse = exact_attention(p, True, sinks=sinks)
    check_all(out2, lse2, exact, exact_lse, torch.bfloat16, "decode with sinks")


@pytest.mark.parametrize("device", DEVICES)
def test_window_zero_sees_only_itself(device, seed):
    """window_left 0, causal: each query's output is its own position's value."""
    if device == "cuda":
        need_path("attention")
    p = make_problem([40, 17], [3, 17], 4, 4, 64, 16, dtype=torch.float32, device=device, seed=seed)
    out = run_attention(p, True, window_left=0)
    cu = p.cu_seqlens_q.tolist()
    for s, length in enumerate(p.seq_lens.tolist()):
        for t in range(cu[s], cu[s + 1]):
            pos = length - (cu[s + 1] - cu[s]) + (t - cu[s])
            page = int(p.block_tables[s, pos // 16])
            torch.testing.assert_close(out[t], p.v_cache[page, :, pos % 16].float(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ the module and the eager reference
@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_paged_attention_module_variants(device):
    """PagedAttention with gpt-oss's and Gemma 2's per-layer constants against
    the same module on the eager reference: a prompt past the window, then
    decode steps."""
    if device == "cuda":
        need_path("attention")
    torch.manual_seed(0)
    for kw in (dict(window_left=20, sinks=True), dict(window_left=20, logits_soft_cap=3.0)):
        ours = PagedAttention(8, 2, 64, **kw).to(device)
        if ours.sinks is not None:
            ours.sinks.copy_(torch.randn(8))
        ref = PagedAttention(8, 2, 64, backend="reference", **kw).to(device)
        ref.load_state_dict(ours.state_dict())
        pages = torch.arange(8, dtype=torch.int32).view(2, 4)
        caches = [[torch.zeros(8, 2, 16, 64, dtype=torch.bfloat16, device=device) for _ in range(2)]
                  for _ in range(2)]
        lens = [0, 0]
        for n in ([45, 30], [1, 1], [1, 1]):
            lens = [a + b for a, b in zip(lens, n)]
            m = AttentionMetadata.build(pages, lens, n, device)
            t = sum(n)
            q = torch.randn(t, 8 * 64, device=device).bfloat16()
            k = torch.randn(t, 2 * 64, device=device).bfloat16()
            v = torch.randn(t, 2 * 64, device=device).bfloat16()
            a = ours(q, k, v, caches[0], m)
            b = ref(q, k, v, caches[1], m)
            err = float((a.float() - b.float()).abs().max() / b.float().abs().max())
            assert err < 3e-2, f"{kw} step {n}: differs by {err:.3g} of its magnitude"


def test_eager_reference_variants_follow_exact():
    """The eager reference (bf16 scores, soft-cap in bf16 as Gemma 2's eager
    attention, sinks as an extra softmax column as gpt-oss's) stays near the
    float64 one."""
    p = make_problem([70, 33], [70, 5], 8, 2, 64, 16, seed=3)
    kw = dict(window_left=20, logits_soft_cap=1.5, sinks=sinks_for(8, 3, "cpu"))
    eager, eager_lse = reference.paged_attention(*p.args(), p.scale, True, **kw, return_lse=True)
    exact, exact_lse = exact_attention(p, True, **kw)
    assert float((eager.double() - exact).abs().max() / exact.abs().max()) < 3e-2
    torch.testing.assert_close(eager_lse.double(), exact_lse, rtol=2e-2, atol=2e-2)


def test_window_left_of_transformers_sliding_window():
    """transformers lets a query see sliding_window positions, its own included."""
    assert window_left_of(None) == -1
    assert window_left_of(4096) == 4095
    assert window_left_of(1) == 0
    with pytest.raises(ValueError, match="sliding_window"):
        window_left_of(0)


def test_hf_forward_maps_the_variants():
    """The transformers attention function with a sliding-window layer's mask,
    softcap and s_aux (as Gemma 2 / gpt-oss call it): the same as dense float64
    attention where key kv is visible to query q when q - sliding_window < kv <= q."""
    from tileinfer_attn.hf import tileinfer_attention_forward

    g = torch.Generator().manual_seed(0)
    b, hq, hkv, s, d, sw, cap = 2, 8, 2, 70, 64, 24, 20.0
    q, k, v = (torch.randn(b, h, s, d, generator=g) for h in (hq, hkv, hkv))
    sinks = torch.randn(hq, generator=g)
    qi, kj = torch.arange(s)[:, None], torch.arange(s)[None, :]
    visible = (kj <= qi) & (kj > qi - sw)
    mask = visible[None, None].expand(b, 1, s, s)
    out, _ = tileinfer_attention_forward(None, q, k, v, mask, scaling=0.125, sliding_window=sw, softcap=cap,
                                         s_aux=sinks.bfloat16())
    scores = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double().repeat_interleave(hq // hkv, 1)) * 0.125
    scores = (cap * torch.tanh(scores / cap)).masked_fill(~visible, float("-inf"))
    sink = sinks.bfloat16().double()[None, :, None, None].expand(b, hq, s, 1)
    probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    exact = torch.einsum("bhqk,bhkd->bqhd", probs, v.double().repeat_interleave(hq // hkv, 1))
    assert float((out.double() - exact).abs().max() / exact.abs().max()) < 1e-5
    with pytest.raises(ValueError, match="causal"):  # a plain causal mask is not this layer's
        tileinfer_attention_forward(None, q, k, v, torch.ones(s, s, dtype=torch.bool).tril()[None, None],
                                    sliding_window=sw)
