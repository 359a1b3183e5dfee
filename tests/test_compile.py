"""torch.compile(fullgraph=True) over a small model step that calls the ops:
no graph breaks, one graph, same results as eager (the fakes and the declared
mutations make the custom ops traceable and functionalizable)."""
import pytest
import torch

import tileinfer_attn as ti
from op_helpers import QUANT_KINDS, need
from tileinfer_attn.testing import make_problem


def step(q, k, v, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, cos_sin, qw, kw, max_q_len: int):
    """Two "layers" on one cache: separate ops (rms_norm, rope, cache_write) then
    attention; the fused attention_inputs then attention."""
    pos = ti.token_positions(seq_lens, cu_seqlens_q, q.shape[0])
    q1 = ti.rope(ti.rms_norm(q, qw), pos, cos_sin)
    k1 = ti.rope(ti.rms_norm(k, kw), pos, cos_sin)
    ti.cache_write(k_cache[0], v_cache[0], k1, v, block_tables, seq_lens, cu_seqlens_q)
    o1 = ti.attention(q1, k_cache[0], v_cache[0], block_tables, seq_lens, cu_seqlens_q, max_q_len)
    q2 = ti.attention_inputs(o1, k, v, k_cache[1], v_cache[1], block_tables, seq_lens, cu_seqlens_q, cos_sin,
                             q_norm_weight=qw, k_norm_weight=kw)
    return ti.attention(q2, k_cache[1], v_cache[1], block_tables, seq_lens, cu_seqlens_q, max_q_len) * 0.5


def inputs(device, q_lens, seed=0):
    p = make_problem([30, 17, 64], q_lens, 8, 2, 64, 16, dtype=torch.bfloat16, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed)
    t = p.q.shape[0]
    k = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    v = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    # One pool per layer, as a model holds them (views of one stacked tensor,
    # mutated in place, made inductor fail under mark_static_address on the H200).
    k_cache = (p.k_cache, p.k_cache.roll(1, 0))
    v_cache = (p.v_cache, p.v_cache.roll(1, 0))
    cos_sin = ti.rope_cos_sin_cache(64, 128, device=device)
    w = (torch.rand(64, generator=g) + 0.5).bfloat16().to(device)
    return (p.q, k, v, k_cache, v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, cos_sin, w, w, p.max_q_len)


def clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor)
                 else tuple(t.clone() for t in a) if isinstance(a, tuple) else a for a in args)


def tensors(args):
    """Every tensor of the arguments, the per-layer pools included."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, tuple):
            yield from a


def test_no_graph_breaks():
    args = inputs("cpu", [3, 1, 2])
    explain = torch._dynamo.explain(step)(*clone(args))
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1


@pytest.mark.parametrize("backend,q_lens", [("aot_eager", [3, 1, 2]), ("aot_eager", [1, 1, 1]),
                                            ("aot_eager", [30, 17, 20]), ("inductor", [3, 1, 2])])
def test_compiled_matches_eager_cpu(backend, q_lens):
    torch._dynamo.reset()
    args = inputs("cpu", q_lens)
    eager_args, comp_args = clone(args), clone(args)
    expect = step(*eager_args)
    got = torch.compile(step, fullgraph=True, backend=backend)(*comp_args)
    assert torch.equal(got, expect)
    assert all(torch.equal(a, b) for a, b in zip(tensors(comp_args[3:5]), tensors(eager_args[3:5])))  # caches


@pytest.mark.gpu
def test_reduce_overhead_cuda_graphs():
    """mode="reduce-overhead" (CUDA graphs) replays correctly as the sequences grow:
    the same captured graph serves new lengths and new cache contents."""
    need("rms_norm", "rope", "cache_write", "attention_inputs", "attention", "prefill",
                            "decode", "combine")
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    replay_as_sequences_grow(step, lambda seed: inputs("cuda", [1, 1, 1], seed=seed), 6, slice(3, 5))
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


def replay_as_sequences_grow(fn, make_inputs, lens_at, written):
    """fn compiled with mode="reduce-overhead" on static inputs, replayed for 4
    steps whose seq_lens (argument lens_at) grow and whose contents are fresh:
    eager's bits, and eager's contents in the arguments `written` (the caches)."""
    compiled = torch.compile(fn, fullgraph=True, mode="reduce-overhead")
    static = clone(make_inputs(0))
    for t in tensors(static):
        # Buffers that live across steps, like a model's cache and metadata:
        # static addresses let the graph mutate the caches in place.
        torch._dynamo.mark_static_address(t)
    for seed in range(4):
        fresh = make_inputs(seed)
        fresh[lens_at].add_(seed)  # seq_lens grow step by step (the tables have spare pages)
        for dst, src in zip(tensors(static), tensors(fresh)):
            dst.copy_(src)
        eager_args = clone(static)
        expect = fn(*eager_args)
        got = compiled(*static)
        torch.testing.assert_close(got, expect, rtol=0, atol=0)
        for a, b in zip(tensors(static[written]), tensors(eager_args[written])):
            assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                               b.view(torch.uint8) if b.element_size() == 1 else b)


def variant_step(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, sinks, max_q_len: int):
    """A gpt-oss-style local layer (window + sinks, batch-invariant) and a
    Gemma 2-style one (window + soft-cap) on one cache, plus prefill's lse
    with all three."""
    a = ti.attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, window_left=7,
                     sinks=sinks, batch_invariant=True)
    b = ti.attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, window_left=7,
                     logits_soft_cap=5.0)
    _, lse = ti.prefill(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, window_left=20,
                        logits_soft_cap=5.0, sinks=sinks, return_lse=True)
    return a + b, lse


@pytest.mark.parametrize("backend,q_lens", [("aot_eager", [3, 1, 2]), ("aot_eager", [30, 17, 20]),
                                            ("inductor", [1, 1, 1])])
def test_variants_compile_without_graph_breaks_cpu(backend, q_lens):
    """The per-layer variants are plain op arguments: no graph break, and the
    compiled step gives eager's bits."""
    torch._dynamo.reset()
    p = make_problem([30, 17, 64], q_lens, 8, 2, 64, 16, dtype=torch.bfloat16, seed=1)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(2))
    args = (*p.args()[:6], sinks, p.max_q_len)
    explain = torch._dynamo.explain(variant_step)(*args)
    assert explain.graph_break_count == 0, explain.break_reasons
    expect = variant_step(*args)
    got = torch.compile(variant_step, fullgraph=True, backend=backend)(*args)
    assert all(torch.equal(g, e) for g, e in zip(got, expect))


def quant_step(q, k, v, k_cache, v_cache, k_scale, v_scale, k_smooth, block_tables, seq_lens, cu_seqlens_q,
               max_q_len: int):
    """A step on a quantized cache: the quantizing cache_write, then attention."""
    kw = dict(k_scale=k_scale, v_scale=v_scale, k_smooth=k_smooth)
    ti.cache_write(k_cache, v_cache, k, v, block_tables, seq_lens, cu_seqlens_q, **kw)
    return ti.attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, **kw)


def quant_inputs(kind, device, q_lens, seed=0):
    p = make_problem([30, 17, 64], q_lens, 8, 2, 64, 16, device=device, seed=seed, **QUANT_KINDS[kind])
    g = torch.Generator().manual_seed(seed)
    t = p.q.shape[0]
    k = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    v = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    return (p.q, k, v, p.k_cache, p.v_cache, p.k_scale, p.v_scale, p.k_smooth, p.block_tables, p.seq_lens,
            p.cu_seqlens_q, p.max_q_len)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kind", list(QUANT_KINDS))
def test_quantized_cache_compiles_cpu(kind, backend):
    """int8 / fp8 (per-vector and per-tensor scales): no graph break, eager's
    bits, and the same pools and scales written."""
    torch._dynamo.reset()
    args = quant_inputs(kind, "cpu", [3, 1, 2])
    explain = torch._dynamo.explain(quant_step)(*clone(args))
    assert explain.graph_break_count == 0, explain.break_reasons
    eager_args, comp_args = clone(args), clone(args)
    expect = quant_step(*eager_args)
    got = torch.compile(quant_step, fullgraph=True, backend=backend)(*comp_args)
    assert torch.equal(got, expect)
    assert all(torch.equal(a, b) for a, b in zip(comp_args[3:7], eager_args[3:7]))  # pools and scales


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(QUANT_KINDS))
def test_quantized_cache_reduce_overhead_cuda_graphs(kind):
    """mode="reduce-overhead" over a quantized cache's step, replayed as the
    sequences grow: eager's bits, pools and scales."""
    need("cache_write", "attention", "decode", "combine")
    torch._dynamo.reset()
    replay_as_sequences_grow(quant_step, lambda seed: quant_inputs(kind, "cuda", [1, 1, 1], seed=seed), 9,
                             slice(3, 7))
