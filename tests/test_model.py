"""A small Qwen3-style model on our ops vs the same weights on the eager reference:
prefill of ragged prompts, greedy decode (eager and CUDA-graph replay), a
speculative verify step, a non-causal drafting step, and torch.compile."""
import copy

import pytest
import torch

import tileinfer_attn  # noqa: F401
from tileinfer_attn.models.qwen3 import Qwen3Config, Qwen3Model
from tileinfer_attn.models.runner import PagedRunner
from op_helpers import DEVICES


def _has_cuda_kernels():
    return all(torch._C._dispatch_has_kernel_for_dispatch_key(f"tileinfer_attn::{op}", "CUDA")
               for op in ("prefill", "decode", "combine", "attention_inputs"))


CFG = Qwen3Config(vocab_size=512, hidden_size=256, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                  intermediate_size=512, max_position=512)


def _pair(device, page_size=16, max_seqs=3, max_len=200, kv_dtype=None, kv_scale="vector"):
    """Our runner and the reference's, on the same weights and the same kind of cache."""
    if device == "cuda" and not _has_cuda_kernels():
        pytest.skip("this build lacks the CUDA kernels the model needs")
    torch.manual_seed(0)
    ours = Qwen3Model(CFG).randomize_(0).to(device=device, dtype=torch.bfloat16).eval()
    ref = copy.deepcopy(ours).set_backend("reference")
    return tuple(PagedRunner(m, max_seqs, max_len, page_size, kv_dtype=kv_dtype, kv_scale=kv_scale)
                 for m in (ours, ref))


# The caches a model can run on: the model's dtype, and the quantized kinds
# (int8 per vector; fp8 e4m3 per vector, or per tensor with the scales of 1
# new_kv_caches starts with).
KV_KINDS = [
    pytest.param(None, "vector", id="bf16"),
    pytest.param(torch.int8, "vector", id="int8"),
    pytest.param(torch.float8_e4m3fn, "vector", id="fp8-vector"),
    pytest.param(torch.float8_e4m3fn, "tensor", id="fp8-tensor"),
]


def _close(a, b, what, tol=3e-2):
    err = float((a.float() - b.float()).abs().max() / b.float().abs().max())
    assert torch.isfinite(a).all(), f"{what}: non-finite logits"
    assert err < tol, f"{what}: logits differ by {err:.3g} of their magnitude"


@pytest.mark.parametrize("kv_dtype,kv_scale", KV_KINDS)
@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_prefill_decode_verify_draft(device, kv_dtype, kv_scale):
    ours, ref = _pair(device, kv_dtype=kv_dtype, kv_scale=kv_scale)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in (37, 16, 70)]
    prefill = ours.step(prompts)
    for a, b in zip(prefill, ref.step(prompts)):
        _close(a, b, "prefill")
    if kv_dtype is not None:
        # The quantized cache against the reference on the model's own dtype:
        # the quantization's error, not that of a scale applied twice or never.
        _, exact = _pair(device)
        for a, b in zip(prefill, exact.step(prompts)):
            _close(a, b, f"{kv_dtype} {kv_scale} cache against the unquantized model, prefill", tol=0.1)
    nxt = [int(x[-1].argmax()) for x in ref.step([[p[-1]] for p in prompts], commit=False)]
    # Greedy decode: teacher-force the reference's tokens so both walk the same path;
    # 20 steps cross page boundaries (page_size 16).
    for step in range(20):
        la, lb = ours.step([[t] for t in nxt]), ref.step([[t] for t in nxt])
        for a, b in zip(la, lb):
            _close(a, b, f"decode step {step}")
        nxt = [int(x[-1].argmax()) for x in lb]
    drafts = [torch.randint(0, CFG.vocab_size, (4,), generator=g).tolist() for _ in prompts]
    for a, b in zip(ours.step(drafts, commit=False), ref.step(drafts, commit=False)):
        _close(a, b, "verify (4 causal queries)")
    block = [torch.randint(0, CFG.vocab_size, (16,), generator=g).tolist() for _ in prompts]
    for a, b in zip(ours.step(block, causal=False, commit=False), ref.step(block, causal=False, commit=False)):
        _close(a, b, "non-causal drafting (16 queries)")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@torch.no_grad()
def test_cuda_graph_decode_matches_eager():
    graphed, eager = _pair("cuda", max_seqs=4)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in (30, 15, 50)]
    graphed.step(prompts)
    eager.step(prompts)
    before = [k.clone() for k, _ in graphed.kv_caches]
    graphed.capture_decode()  # 4 slots captured, 3 used: slot 3 is a padded slot
    assert all(torch.equal(k, b) for (k, _), b in zip(graphed.kv_caches, before)), "capture wrote the cache"
    nxt = [1, 2, 3]
    for step in range(40):
        a = graphed.decode_graph(nxt)
        b = torch.cat(eager.step([[t] for t in nxt]))
        # Same kernels and split counts; the projections' GEMMs may pick other
        # algorithms for 4 rows than for 3, so bits can differ slightly.
        _close(a, b, f"graph replay vs eager, step {step}")
        nxt = [int(t) for t in b.argmax(-1)]


@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_captured_step_serves_every_mix(device):
    """One step captured at a token budget (a CUDA graph on a GPU; the same
    static buffers run eagerly on a CPU), replayed over prompts, mixed steps
    (chunks beside decodes and verifies), decodes, a step with an idle slot and
    one that fills the budget: each against the same step on an eager runner."""
    replayed, eager = _pair(device, max_seqs=4, max_len=300)
    before = [k.clone() for k, *_ in replayed.kv_caches]
    captured = replayed.capture(token_budget=96, max_q_len=64)
    assert all(torch.equal(k, b) for (k, *_), b in zip(replayed.kv_caches, before)), "capture wrote the cache"
    g = torch.Generator().manual_seed(4)

    def toks(*n):
        return [torch.randint(0, CFG.vocab_size, (k,), generator=g).tolist() for k in n]
    steps = [toks(40, 7, 33), toks(1, 1, 1), toks(1, 50, 16, 3), toks(2, 0, 1, 1), toks(64, 1, 30, 1),
             toks(1, 1, 1, 1), toks(5, 17, 1, 9)]
    for i, tokens in enumerate(steps):
        a, b = captured.replay(tokens), eager.step(tokens)
        assert replayed.lens == eager.lens, f"step {i}: lengths {replayed.lens} vs {eager.lens}"
        for j, (x, y) in enumerate(zip(a, b)):
            assert x.shape == y.shape, f"step {i} slot {j}: {tuple(x.shape)} vs {tuple(y.shape)}"
            if x.numel():
                _close(x, y, f"captured step {i} q_lens {[len(t) for t in tokens]} slot {j}")
    with pytest.raises(ValueError, match="does not fit"):
        captured.replay(toks(64, 33))  # past the budget
    with pytest.raises(ValueError, match="does not fit"):
        captured.replay(toks(65))  # past max_q_len


@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_compile_fullgraph_no_breaks(device):
    ours, _ = _pair(device)
    model = ours.model
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in (20, 9)]
    ours.step(prompts)
    from tileinfer_attn.metadata import AttentionMetadata

    meta = AttentionMetadata.build(ours.block_tables[:2], [21, 10], [1, 1], device)
    ids = torch.tensor([5, 6], device=device)
    explained = torch._dynamo.explain(model)(ids, ours.kv_caches, meta)
    assert explained.graph_break_count == 0, explained.break_reasons
    eager = model(ids, ours.kv_caches, meta)
    backend = "aot_eager" if device == "cpu" else "inductor"
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    out = compiled(ids, ours.kv_caches, meta)
    assert torch.equal(out, eager) or float((out - eager).abs().max()) < 1e-2 * float(eager.abs().max())
    if device == "cuda":
        torch._dynamo.reset()
        graphs = torch.compile(model, fullgraph=True, mode="reduce-overhead")
        for _ in range(3):  # the first calls warm up and record, later ones replay
            out = graphs(ids, ours.kv_caches, meta)
        assert float((out - eager).abs().max()) < 1e-2 * float(eager.abs().max())


@pytest.mark.parametrize("backend", ["tileinfer", "reference"])
def test_attention_layer_step_without_tokens(backend):
    """A step with no token (every slot idle) gives an empty [0, heads * head_dim] output."""
    from tileinfer_attn.layer import PagedAttention
    from tileinfer_attn.metadata import AttentionMetadata
    layer = PagedAttention(4, 2, 64, backend=backend)
    k_cache = torch.zeros(3, 2, 16, 64)
    v_cache = torch.zeros_like(k_cache)
    md = AttentionMetadata.build([[0], [1]], [5, 3], [0, 0], "cpu")
    q = torch.empty(0, 4 * 64)
    kv = torch.empty(0, 2 * 64)
    out = layer(q, kv, kv, (k_cache, v_cache), md)
    assert out.shape == (0, 4 * 64)
