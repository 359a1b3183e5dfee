"""tileinfer_attn.vllm against the real vLLM package (pinned: 0.33.0).

Skipped where vLLM is not importable (the main test environment); CI runs
this module a second time in a virtual environment that has vLLM (.ci/run).

The batches are built as vLLM's ``CommonAttentionMetadata`` (decode, prefill,
chunked prefill mixed with decodes, speculative-decoding verify steps, a
batch padded for a CUDA graph), the layer's KV cache is allocated through
vLLM's own attn_spec / layout / view code, and our builder and impl run on it. The
results are compared with

(a) a plain paged-attention formula written here over vLLM's cache and block
    table, with the step's keys and values written through vLLM's
    ``slot_mapping`` (vLLM 0.33.0 ships no reference attention usable on the
    CPU: its references live in its test suite, not in the wheel), and
(b) our float64 reference (tileinfer_attn.reference.paged_attention,
    exact=True) over the pools our backend sees.
"""
import dataclasses
import importlib.metadata
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

if os.environ.get("TILEINFER_REQUIRE_VLLM") == "1":
    import vllm  # CI's vLLM environment: an import error fails the run instead of skipping it
else:
    vllm = pytest.importorskip(
        "vllm", reason="vLLM is not installed here; CI runs this module in its vLLM virtual environment (.ci/run)")

from op_helpers import DEVICES, bits, check_out  # noqa: E402

from tileinfer_attn import reference  # noqa: E402
from tileinfer_attn.vllm import BACKEND_CLASS_PATH  # noqa: E402
from tileinfer_attn.vllm.backend import (  # noqa: E402
    TileinferAttentionBackend as Backend,
    TileinferAttentionImpl as Impl,
    TileinferAttentionMetadataBuilder as Builder,
    kv_cache_pools,
)
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backend import (  # noqa: E402
    AttentionCGSupport,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheLayout,
    KVCacheTensor,
)
from vllm.v1.worker.utils import allocate_kv_cache, customize_attention_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VLLM_VERSION = "0.33.0"
MAX_NUM_SEQS = 16


def test_vllm_version():
    assert vllm.__version__ == VLLM_VERSION, f"these tests are written against vLLM {VLLM_VERSION}"


# ------------------------------------------------------------------ vLLM-side setup
def layer_caches(num_blocks, num_kv_heads, block_size, head_size, dtype, device, num_layers=1,
                 layout=KVCacheLayout.LBHNC, kernel_block_size=None):
    """Layer caches allocated by vLLM's worker code: the layer's
    FullAttentionSpec through customize_attention_spec (what the model runners
    apply to our backend), a KVCacheTensor placing the layers as the engine
    does for the layout (layer-outermost: each layer a contiguous region;
    block-outermost: a block holds every layer's page), then allocate_kv_cache
    (one int8 backing buffer, create_kv_cache_views per layer; kernel blocks
    when kernel_block_size is given). Returns (attn_spec, raw buffer, views)."""
    attn_spec = customize_attention_spec(Backend, FullAttentionSpec(
        block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype))
    page = attn_spec.page_size_bytes
    if layout.is_layer_compact:
        layer_stride, block_stride = page * num_blocks, page
    else:
        layer_stride, block_stride = page, page * num_layers
    names = [f"layer.{i}" for i in range(num_layers)]
    tensor = KVCacheTensor(size=page * num_blocks * num_layers, layers=names, layer_stride=layer_stride,
                           block_stride=block_stride)
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                           kv_cache_groups=[KVCacheGroupSpec(layer_names=names, kv_cache_spec=attn_spec)])
    caches = allocate_kv_cache(config, torch.device(device), layout,
                               None if kernel_block_size is None else [kernel_block_size])
    views = [caches[n] for n in names]
    return attn_spec, views[0].untyped_storage(), views


def vllm_config(max_num_seqs=MAX_NUM_SEQS):
    # The builder reads scheduler_config.max_num_seqs only; a full VllmConfig
    # needs a model and a device platform.
    return SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))


class Batch:
    """One step of a vLLM batch: requests with (context_len, query_len), their
    blocks scattered over the pool (block 0, vLLM's null block, unused), the
    step's q / k / v, the context already in the cache, and vLLM's
    CommonAttentionMetadata (pad: padding tokens past the last request, slot -1)."""

    def __init__(self, reqs, kv_cache, num_heads, num_kv_heads, head_size, block_size, dtype, device, gen,
                 pad=0, width=0):
        self.reqs = reqs
        num_blocks = kv_cache.shape[0]
        q_lens = [q for _, q in reqs]
        seq_lens = [c + q for c, q in reqs]
        blocks_per = [math.ceil(s / block_size) for s in seq_lens]
        width = max(max(blocks_per) + 1, width)  # a spare column, as vLLM's tables are wider than needed
        perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        assert sum(blocks_per) <= len(perm), "pool too small for the batch"
        table = torch.zeros(len(reqs), width, dtype=torch.int32)
        at = 0
        for s, n in enumerate(blocks_per):
            table[s, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
            at += n
        qsl = [0]
        for q in q_lens:
            qsl.append(qsl[-1] + q)
        num_tokens = qsl[-1] + pad
        slots = []
        for s, (c, q) in enumerate(reqs):
            for t in range(q):
                p = c + t
                slots.append(int(table[s, p // block_size]) * block_size + p % block_size)
        slots += [-1] * pad
        self.num_tokens, self.num_real = num_tokens, qsl[-1]
        g = dict(generator=gen, dtype=torch.float32)
        self.q = torch.randn(num_tokens, num_heads, head_size, **g).to(dtype).to(device)
        self.k = torch.randn(num_tokens, num_kv_heads, head_size, **g).to(dtype).to(device)
        self.v = torch.randn(num_tokens, num_kv_heads, head_size, **g).to(dtype).to(device)
        # The context (positions before this step) of every request, written as
        # vLLM addresses the cache: key of KV head h at head slot h, value at
        # num_kv_heads + h.
        for s, (c, _) in enumerate(reqs):
            for p in range(c):
                b, off = int(table[s, p // block_size]), p % block_size
                kv_cache[b, :num_kv_heads, off] = torch.randn(num_kv_heads, head_size, **g).to(dtype).to(device)
                kv_cache[b, num_kv_heads:, off] = torch.randn(num_kv_heads, head_size, **g).to(dtype).to(device)
        qsl_t = torch.tensor(qsl, dtype=torch.int32)
        self.cm = CommonAttentionMetadata(
            query_start_loc=qsl_t.to(device),
            query_start_loc_cpu=qsl_t,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            num_reqs=len(reqs),
            num_actual_tokens=num_tokens,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            block_table_tensor=table.to(device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            causal=True,
        )


def write_through_slot_mapping(kv_cache, k, v, slot_mapping, num_kv_heads):
    """The step's keys and values written as vLLM's reshape_and_cache does:
    token i to slot slot_mapping[i] (block slot // block_size, offset
    slot % block_size); slot -1 is not written."""
    block_size = kv_cache.shape[2]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        b, off = divmod(slot, block_size)
        kv_cache[b, :num_kv_heads, off] = k[i]
        kv_cache[b, num_kv_heads:, off] = v[i]


def paged_attention_formula(q, kv_cache, cm, num_kv_heads, scale):
    """Causal paged attention in float64, straight from vLLM's metadata: the keys
    of request s are its seq_lens[s] positions, position p at block
    block_table[s, p // block_size], offset p % block_size; its query t sits at
    position seq_lens[s] - n_s + t and sees positions <= its own."""
    block_size = kv_cache.shape[2]
    num_heads = q.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    qsl = cm.query_start_loc_cpu.tolist()
    for s in range(cm.num_reqs):
        length = int(cm.seq_lens[s])
        pos = torch.arange(length)
        blocks = cm.block_table_tensor[s].cpu().long()[pos // block_size]
        keys = kv_cache[blocks, :num_kv_heads, pos % block_size].double().cpu()  # [L, kvh, d]
        vals = kv_cache[blocks, num_kv_heads:, pos % block_size].double().cpu()
        keys = keys.repeat_interleave(group, dim=1)
        vals = vals.repeat_interleave(group, dim=1)
        n = qsl[s + 1] - qsl[s]
        qs = q[qsl[s]:qsl[s + 1]].double().cpu()  # [n, h, d]
        scores = torch.einsum("thd,lhd->htl", qs, keys) * scale
        qpos = length - n + torch.arange(n)
        scores = scores.masked_fill(pos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[qsl[s]:qsl[s + 1]] = torch.einsum("htl,lhd->thd", scores.softmax(-1), vals)
    return out


# ------------------------------------------------------------------ forward: (a) and (b)
BATCHES = {
    # (context_len, query_len) per request
    "decode": [(37, 1), (0, 1), (130, 1), (64, 1), (5, 1)],
    "prefill": [(0, 17), (0, 40), (0, 5)],
    "chunked_prefill_mixed": [(50, 1), (19, 1), (64, 33), (0, 21), (200, 1)],
    "spec_verify": [(29, 4), (64, 4), (3, 4), (100, 4)],
    # a decode batch padded for a CUDA graph: padding requests with no query
    # and no position, then padding tokens (slot -1) past the last request
    "decode_padded": [(12, 1), (70, 1), (33, 1), (0, 0), (0, 0)],
}
PADS = {"decode_padded": 3}
SHAPES = [  # (num_heads, num_kv_heads, head_size, block_size)
    (8, 2, 64, 16),
    (4, 4, 128, 64),
    (6, 2, 256, 32),  # a group of 3 (the decode path packs 3 of a tile's 16 rows)
]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def run_step(batch_name, shape, dtype, device, seed, num_layers=1, **impl_kwargs):
    num_heads, num_kv_heads, head_size, block_size = shape
    gen = torch.Generator().manual_seed(seed)
    attn_spec, raw, views = layer_caches(64, num_kv_heads, block_size, head_size, dtype, device, num_layers=num_layers)
    kv_cache = views[-1]
    batch = Batch(BATCHES[batch_name], kv_cache, num_heads, num_kv_heads, head_size, block_size, dtype, device,
                  gen, pad=PADS.get(batch_name, 0))
    before = kv_cache.clone()
    builder = Builder(attn_spec, ["layer.0"], vllm_config(), torch.device(device), block_table_width=64)
    md = builder.build(0, batch.cm)
    scale = head_size ** -0.5
    # Positional, as vLLM's Attention layer builds its impl.
    impl = Impl(num_heads, head_size, scale, num_kv_heads, None, impl_kwargs.get("sliding_window"), "auto",
                impl_kwargs.get("logits_soft_cap"), AttentionType.DECODER, None, impl_kwargs.get("sinks"))
    out = torch.full((batch.num_tokens, num_heads, head_size), float("nan"), dtype=dtype, device=device)
    ret = impl.forward(None, batch.q, batch.k, batch.v, kv_cache, md, output=out)
    assert ret is out
    return SimpleNamespace(batch=batch, kv_cache=kv_cache, before=before, md=md, out=out, scale=scale,
                           num_kv_heads=num_kv_heads, views=views, raw=raw, impl=impl)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}kv{}d{}bs{}".format(*s))
@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_forward(batch_name, shape, dtype, device, seed):
    r = run_step(batch_name, shape, dtype, device, seed)
    b = r.batch
    # The cache update agrees with vLLM's slot_mapping, bit for bit, and
    # padding tokens (slot -1) are not written.
    expected_cache = r.before.clone()
    write_through_slot_mapping(expected_cache, b.k, b.v, b.cm.slot_mapping, r.num_kv_heads)
    assert torch.equal(r.kv_cache, expected_cache), "the cache write differs from a write through slot_mapping"
    rows = slice(0, b.num_real)
    # (a) the paged-attention formula over vLLM's cache and block table
    exact_a = paged_attention_formula(b.q, expected_cache, b.cm, r.num_kv_heads, r.scale)
    check_out(r.out[rows].cpu(), exact_a[rows], dtype, f"{batch_name} vs the vLLM-metadata formula")
    # (b) our float64 reference over the pools the backend sees
    k_cache, v_cache = kv_cache_pools(r.kv_cache, r.num_kv_heads)
    exact_b = reference.paged_attention(b.q, k_cache, v_cache, r.md.page_table, r.md.seq_lens,
                                        r.md.query_start_loc, r.md.max_query_len, r.scale, True, exact=True)
    check_out(r.out[rows], exact_b[rows], dtype, f"{batch_name} vs reference.paged_attention(exact=True)")
    assert torch.allclose(exact_a[rows], exact_b[rows].double().cpu(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_name", ["decode", "chunked_prefill_mixed", "spec_verify"])
def test_forward_variants(batch_name, device, seed):
    """A gpt-oss-like layer (sliding window of 16 + learned sinks, the sinks
    in bf16 as the model holds them) and a Gemma-2-like one (window + logits
    soft-cap): vLLM's sliding_window w is our window_left = w - 1."""
    shape = (8, 2, 64, 16)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(device)
    for kw in (dict(sliding_window=16, sinks=sinks), dict(sliding_window=16, logits_soft_cap=30.0)):
        r = run_step(batch_name, shape, torch.bfloat16, device, seed, **kw)
        b = r.batch
        rows = slice(0, b.num_real)
        k_cache, v_cache = kv_cache_pools(r.kv_cache, r.num_kv_heads)
        exact = reference.paged_attention(
            b.q, k_cache, v_cache, r.md.page_table, r.md.seq_lens, r.md.query_start_loc, r.md.max_query_len,
            r.scale, True, window_left=15, logits_soft_cap=kw.get("logits_soft_cap", 0.0),
            sinks=None if "sinks" not in kw else kw["sinks"].float(), exact=True)
        check_out(r.out[rows], exact[rows], torch.bfloat16, f"{batch_name} with {sorted(kw)}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flag", ["1", "0"])
def test_forward_batch_invariant(flag, device, seed, monkeypatch):
    """VLLM_BATCH_INVARIANT=1 (vLLM's batch-invariant mode): the impl calls
    attention with batch_invariant=True; its output is that call's, bit for bit."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", flag)
    r = run_step("chunked_prefill_mixed", (8, 2, 64, 16), torch.bfloat16, device, seed)
    assert r.impl.batch_invariant == (flag == "1")
    b, md = r.batch, r.md
    k_cache, v_cache = kv_cache_pools(r.kv_cache, r.num_kv_heads)
    out = torch.empty_like(r.out)
    torch.ops.tileinfer_attn.attention(out, b.q, k_cache, v_cache, md.page_table, md.seq_lens, md.query_start_loc,
                                       md.max_query_len, r.scale, True, batch_invariant=flag == "1")
    rows = slice(0, b.num_real)
    assert torch.equal(bits(out[rows]), bits(r.out[rows]))


@pytest.mark.parametrize("device", DEVICES)
def test_forward_fp8_kv_cache(device, seed):
    """kv_cache_dtype 'fp8': vLLM hands the layer's cache as bytes and its
    per-tensor scales as layer._k_scale / _v_scale. The step's keys and values
    land in the cache divided by the scales and rounded to e4m3; the output is
    float64 attention over the dequantized cache."""
    r = run_step("chunked_prefill_mixed", (8, 2, 64, 16), torch.bfloat16, device, seed)
    b, kvh = r.batch, r.num_kv_heads
    k_scale = torch.tensor([0.02], device=device)
    v_scale = torch.tensor([0.03], device=device)
    layer = SimpleNamespace(_k_scale=k_scale, _v_scale=v_scale)
    before = r.before.float()  # the context positions, quantized as a previous step would have written them
    cache = torch.cat([before[:, :kvh] / k_scale, before[:, kvh:] / v_scale], 1).clamp(-448, 448)
    cache = cache.to(torch.float8_e4m3fn).view(torch.uint8)
    impl = Impl(8, 64, r.scale, kvh, None, None, "fp8", None, AttentionType.DECODER, None)
    out = torch.full_like(r.out, float("nan"))
    impl.forward(layer, b.q, b.k, b.v, cache, r.md, output=out)
    e4m3 = cache.view(torch.float8_e4m3fn)
    slots = b.cm.slot_mapping.tolist()
    block_size = cache.shape[2]
    for i, slot in enumerate(slots[:b.num_real]):
        blk, off = divmod(slot, block_size)
        want_k = (b.k[i].float() / k_scale).to(torch.float8_e4m3fn).float()
        assert torch.equal(e4m3[blk, :kvh, off].float(), want_k), f"token {i}: key not written as e4m3 of k / k_scale"
    k_cache, v_cache = kv_cache_pools(e4m3, kvh)
    exact = reference.paged_attention(b.q, k_cache, v_cache, r.md.page_table, r.md.seq_lens, r.md.query_start_loc,
                                      r.md.max_query_len, r.scale, True, k_scale=k_scale, v_scale=v_scale, exact=True)
    rows = slice(0, b.num_real)
    check_out(out[rows], exact[rows], torch.bfloat16, "fp8 cache vs float64 on the dequantized cache")


def test_impl_refuses_sinks_of_the_wrong_shape():
    with pytest.raises(ValueError, match="one logit per query head"):
        Impl(num_heads=8, head_size=64, scale=0.125, num_kv_heads=2, sinks=torch.zeros(4))


@pytest.mark.parametrize("device", DEVICES)
def test_forward_second_layer_of_a_shared_allocation(device, seed):
    """Two layers in one backing allocation (vLLM's KVCacheTensor with a layer
    stride): the second layer's step touches its own region only."""
    r = run_step("chunked_prefill_mixed", SHAPES[0], torch.bfloat16, device, seed, num_layers=2)
    assert torch.all(r.views[0] == 0), "layer 0's cache was written by layer 1's step"
    exact = paged_attention_formula(r.batch.q, r.kv_cache, r.batch.cm, r.num_kv_heads, r.scale)
    check_out(r.out[:r.batch.num_real].cpu(), exact[:r.batch.num_real], torch.bfloat16, "second layer")


def test_kv_sharing_layer_does_not_write(seed):
    """A layer that reads an earlier layer's cache (kv_sharing_target_layer_name)
    writes nothing; it attends to what is there."""
    num_heads, num_kv_heads, head_size, block_size = SHAPES[0]
    gen = torch.Generator().manual_seed(seed)
    attn_spec, _, (kv_cache,) = layer_caches(64, num_kv_heads, block_size, head_size, torch.float32, "cpu")
    batch = Batch(BATCHES["decode"], kv_cache, num_heads, num_kv_heads, head_size, block_size, torch.float32,
                  "cpu", gen)
    write_through_slot_mapping(kv_cache, batch.k, batch.v, batch.cm.slot_mapping, num_kv_heads)
    before = kv_cache.clone()
    md = Builder(attn_spec, ["l"], vllm_config(), torch.device("cpu"), block_table_width=64).build(0, batch.cm)
    impl = Impl(num_heads, head_size, head_size ** -0.5, num_kv_heads, None, None, "auto", None,
                AttentionType.DECODER, "model.layers.0.self_attn.attn")
    out = torch.empty(batch.num_tokens, num_heads, head_size)
    impl.forward(None, batch.q, batch.k * 0 + 7, batch.v * 0 + 7, kv_cache, md, output=out)
    assert torch.equal(kv_cache, before)
    exact = paged_attention_formula(batch.q, kv_cache, batch.cm, num_kv_heads, head_size ** -0.5)
    check_out(out, exact, torch.float32, "kv-sharing layer")


def test_profiling_run_without_metadata():
    impl = Impl(8, 64, 0.125, 2, None, None, "auto", None, AttentionType.DECODER, None)
    out = torch.full((3, 8, 64), float("nan"))
    impl.forward(None, torch.randn(3, 8, 64), None, None, torch.zeros(4, 4, 16, 64), None, output=out)
    assert torch.all(out == 0)


# ------------------------------------------------------------------ the KV-cache contract
@pytest.mark.parametrize("num_kv_heads,block_size,head_size,dtype",
                         [(2, 16, 64, torch.bfloat16), (1, 64, 128, torch.float16), (8, 128, 256, torch.float32)])
def test_kv_cache_layout_is_our_pools(num_kv_heads, block_size, head_size, dtype):
    """The attn_spec we publish keeps vLLM's page size; vLLM resolves the layout we ask
    for; the layer's cache is a dense [num_blocks, 2 * num_kv_heads, block_size,
    head_size] tensor and our k_cache / v_cache are contiguous views of its
    storage (no copy), page 2b = block b's keys / values."""
    default = FullAttentionSpec(block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype)
    attn_spec = customize_attention_spec(Backend, default)
    assert attn_spec.num_head_slots == 2 * num_kv_heads and attn_spec.num_heads == 2 * num_kv_heads
    assert attn_spec.state_content_bytes == head_size * dtype.itemsize
    assert attn_spec.page_size_bytes == default.page_size_bytes
    assert Backend.customize_spec(attn_spec) == attn_spec  # idempotent
    assert attn_spec.block_stride_alignment == MultipleOf(max(torch.ops.tileinfer_attn.supported("page_sizes")))
    assert get_supported_kv_cache_layouts([Backend]) == [KVCacheLayout.LBHNC]

    num_blocks = 5
    _, raw, (kv_cache,) = layer_caches(num_blocks, num_kv_heads, block_size, head_size, dtype, "cpu")
    assert kv_cache.dtype == dtype
    assert kv_cache.shape == (num_blocks, 2 * num_kv_heads, block_size, head_size)
    assert kv_cache.is_contiguous()
    k_cache, v_cache = kv_cache_pools(kv_cache, num_kv_heads)
    pool_shape = (2 * num_blocks - 1, num_kv_heads, block_size, head_size)
    assert k_cache.shape == pool_shape and v_cache.shape == pool_shape
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    storage = raw.data_ptr()
    assert k_cache.untyped_storage().data_ptr() == storage and v_cache.untyped_storage().data_ptr() == storage
    assert k_cache.data_ptr() == kv_cache.data_ptr() == storage
    assert v_cache.data_ptr() == kv_cache.data_ptr() + num_kv_heads * block_size * head_size * dtype.itemsize
    for b in range(num_blocks):
        k_cache[2 * b].fill_(b + 1)
        v_cache[2 * b].fill_(-(b + 1))
    for b in range(num_blocks):
        assert torch.all(kv_cache[b, :num_kv_heads] == b + 1) and torch.all(kv_cache[b, num_kv_heads:] == -(b + 1))


def test_kernel_blocks_of_a_larger_vllm_block(seed):
    """A vLLM block of 256 tokens (a multiple of our largest page, 128) is split
    by vLLM into kernel blocks of 128: the layer cache is then in kernel blocks,
    still one dense tensor, and a step over a kernel-block table is correct."""
    assert Backend.supports_block_size(256) and not Backend.supports_block_size(8)
    attn_spec, _, (kv_cache,) = layer_caches(8, 2, 256, 64, torch.bfloat16, "cpu", kernel_block_size=128)
    assert kv_cache.shape == (16, 4, 128, 64) and kv_cache.is_contiguous()
    gen = torch.Generator().manual_seed(seed)
    batch = Batch([(300, 1), (17, 20), (129, 4)], kv_cache, 8, 2, 64, 128, torch.bfloat16, "cpu", gen)
    kernel_spec = attn_spec.copy_with_new_block_size(128)  # what vLLM hands the builder then
    md = Builder(kernel_spec, ["l"], vllm_config(), torch.device("cpu"), block_table_width=16).build(0, batch.cm)
    out = torch.empty(batch.num_tokens, 8, 64, dtype=torch.bfloat16)
    Impl(8, 64, 0.125, 2).forward(None, batch.q, batch.k, batch.v, kv_cache, md, output=out)
    exact = paged_attention_formula(batch.q, kv_cache, batch.cm, 2, 0.125)
    check_out(out, exact, torch.bfloat16, "kernel blocks of 128 in vLLM blocks of 256")


def test_other_layouts_are_refused_by_name():
    """Under a layout that interleaves layers per block the cache is no dense
    tensor; forward refuses it, naming the layout it needs."""
    _, _, views = layer_caches(4, 2, 16, 64, torch.bfloat16, "cpu", num_layers=2, layout=KVCacheLayout.BLHNC)
    assert not views[0].is_contiguous()
    with pytest.raises(RuntimeError, match="LBHNC"):
        kv_cache_pools(views[0], 2)
    with pytest.raises(RuntimeError, match="2 \\* num_kv_heads"):
        kv_cache_pools(torch.zeros(4, 2, 16, 64), 2)


def test_builder_page_table_is_persistent(seed):
    """The doubled block table is written in place into one buffer (a captured
    CUDA graph reads the current step's); the support level is ALWAYS."""
    assert Builder.get_cudagraph_support(None, None) == AttentionCGSupport.ALWAYS
    assert Builder.reorder_batch_threshold is None and Builder.requires_block_table_width
    gen = torch.Generator().manual_seed(seed)
    attn_spec, _, (kv_cache,) = layer_caches(64, 2, 16, 64, torch.bfloat16, "cpu")
    builder = Builder(attn_spec, ["l"], vllm_config(), torch.device("cpu"), block_table_width=8)
    ptrs = set()
    for reqs in ([(3, 1), (20, 1)], [(40, 1), (1, 1)]):
        batch = Batch(reqs, kv_cache, 8, 2, 64, 16, torch.bfloat16, "cpu", gen)
        md = builder.build(0, batch.cm)
        assert torch.equal(md.page_table, batch.cm.block_table_tensor * 2)
        assert md.page_table.dtype == torch.int32 and md.page_table.is_contiguous()
        assert md.query_start_loc is batch.cm.query_start_loc and md.seq_lens is batch.cm.seq_lens
        ptrs.add(md.page_table.data_ptr())
    assert len(ptrs) == 1


# Steps replayed through one full CUDA graph of 48 tokens and 6 requests
# (cudagraph_mode=FULL): (context_len, query_len) per request, padded with
# requests of no query and no position.
GRAPH_TOKENS, GRAPH_REQS, GRAPH_WIDTH = 48, 6, 12
GRAPH_STEPS = {
    "decodes": [(37, 1), (0, 1), (130, 1), (64, 1), (5, 1), (9, 1)],
    "a chunk and decodes": [(50, 1), (64, 30), (19, 1), (0, 0), (0, 0), (0, 0)],
    "one prompt of the graph's size": [(0, 48), (0, 0), (0, 0), (0, 0), (0, 0), (0, 0)],
    "verify steps and a prompt": [(29, 4), (64, 4), (0, 20), (3, 4), (0, 0), (0, 0)],
    "two decodes": [(12, 1), (100, 1), (0, 0), (0, 0), (0, 0), (0, 0)],
}


@pytest.mark.parametrize("device", DEVICES)
def test_full_cudagraph_replays_every_mix(device, seed):
    """ALWAYS: with cudagraph_mode=FULL vLLM captures a mixed batch's graph for
    N padded tokens and a fixed number of requests with max_query_len = N
    (its dummy batch: N tokens spread over the requests, zeroed block
    tables), and replays it for every step padded to them after building the
    step's metadata in place. The graph's attention launch keeps the host
    values of its capture, so each step here runs the impl with the step's
    metadata and max_query_len = N: outputs against the paged-attention
    formula, the cache write against vLLM's slot_mapping, and the doubled
    block table in the buffer the capture read. (The captured replay itself,
    on the GPU: tests/test_model.py, PagedRunner.capture.)"""
    shape = (8, 2, 64, 16)
    num_heads, num_kv_heads, head_size, block_size = shape
    gen = torch.Generator().manual_seed(seed)
    attn_spec, _, (kv_cache,) = layer_caches(64, num_kv_heads, block_size, head_size, torch.bfloat16, device)
    builder = Builder(attn_spec, ["layer.0"], vllm_config(), torch.device(device), block_table_width=GRAPH_WIDTH)
    impl = Impl(num_heads, head_size, head_size ** -0.5, num_kv_heads, None, None, "auto", None,
                AttentionType.DECODER, None, None)
    n = GRAPH_TOKENS // GRAPH_REQS
    dummy = Batch([(0, n)] * GRAPH_REQS, kv_cache, *shape[:3], block_size, torch.bfloat16, device, gen,
                  width=GRAPH_WIDTH)
    cm = dataclasses.replace(dummy.cm, max_query_len=GRAPH_TOKENS,
                             block_table_tensor=torch.zeros_like(dummy.cm.block_table_tensor))
    captured = builder.build_for_cudagraph_capture(cm)
    assert captured.max_query_len == GRAPH_TOKENS
    out = torch.full((GRAPH_TOKENS, num_heads, head_size), float("nan"), dtype=torch.bfloat16, device=device)
    impl.forward(None, dummy.q, dummy.k, dummy.v, kv_cache, captured, output=out)
    assert torch.isfinite(out).all(), "the capture's dummy step"
    for name, reqs in GRAPH_STEPS.items():
        pad = GRAPH_TOKENS - sum(q for _, q in reqs)
        b = Batch(reqs, kv_cache, *shape[:3], block_size, torch.bfloat16, device, gen, pad=pad, width=GRAPH_WIDTH)
        assert b.num_tokens == GRAPH_TOKENS and b.cm.block_table_tensor.shape == (GRAPH_REQS, GRAPH_WIDTH)
        before = kv_cache.clone()
        md = dataclasses.replace(builder.build(0, b.cm), max_query_len=GRAPH_TOKENS)
        assert md.page_table.data_ptr() == captured.page_table.data_ptr(), f"{name}: the page table moved"
        out = torch.full((GRAPH_TOKENS, num_heads, head_size), float("nan"), dtype=torch.bfloat16, device=device)
        impl.forward(None, b.q, b.k, b.v, kv_cache, md, output=out)
        expected_cache = before
        write_through_slot_mapping(expected_cache, b.k, b.v, b.cm.slot_mapping, num_kv_heads)
        assert torch.equal(kv_cache, expected_cache), f"{name}: the cache write differs from slot_mapping's"
        rows = slice(0, b.num_real)
        exact = paged_attention_formula(b.q, expected_cache, b.cm, num_kv_heads, head_size ** -0.5)
        check_out(out[rows].cpu(), exact[rows], torch.bfloat16, f"{name} through the graph's launch")


# ------------------------------------------------------------------ capabilities and refusals
def validate(**kw):
    args = dict(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=False,
                has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=DeviceCapability(9, 0), attn_type=AttentionType.DECODER)
    args.update(kw)
    return Backend.validate_configuration(**args)


def test_capabilities_through_vllm_validation():
    """vLLM's own selection check (validate_configuration) on our flags."""
    for head_size in (64, 80, 96, 128, 256):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for block_size in (16, 32, 64, 128, 256):
                assert validate(head_size=head_size, dtype=dtype, block_size=block_size) == []
    assert validate(kv_cache_dtype="fp8") == [] and validate(kv_cache_dtype="fp8_e4m3") == []
    assert any("needs a bfloat16 or float16 model" in r
               for r in validate(kv_cache_dtype="fp8", dtype=torch.float32)), "fp32 queries over an fp8 cache"
    assert validate(kv_cache_dtype="fp8", dtype=torch.float16) == []
    assert validate(device_capability=DeviceCapability(8, 0)) == []
    assert validate(has_sink=True) == [] and validate(has_sliding_window=True) == []
    assert validate(use_batch_invariant=True) == []
    refused = {
        "head_size not supported": dict(head_size=72),
        "dtype not supported": dict(dtype=torch.float64),
        "kv_cache_dtype not supported": dict(kv_cache_dtype="fp8_e5m2"),
        "block_size not supported": dict(block_size=8),
        "MLA not supported": dict(use_mla=True),
        "compute capability not supported": dict(device_capability=DeviceCapability(7, 5)),
        "non-causal attention not supported": dict(use_non_causal=True),
        "KV connector not supported": dict(use_kv_connector=True),
        "DCP not supported": dict(use_dcp=True),
        "PCP not supported": dict(use_pcp=True),
        "device-cpu query lens mismatch not supported, this is needed for adaptive verification":
            dict(use_adaptive_verification=True),
    }
    for reason, kw in refused.items():
        assert reason in validate(**kw), (reason, validate(**kw))
    for attn_type in (AttentionType.ENCODER, AttentionType.ENCODER_ONLY, AttentionType.ENCODER_DECODER):
        assert f"attention type {attn_type} not supported" in validate(attn_type=attn_type)
    assert Backend.get_name() == "CUSTOM"
    assert Backend.forward_includes_kv_cache_update
    assert Backend.get_supported_head_sizes() == list(torch.ops.tileinfer_attn.supported("head_dims"))
    assert Backend.get_supported_kernel_block_sizes() == list(torch.ops.tileinfer_attn.supported("page_sizes"))


@pytest.mark.parametrize("kwargs,feature", [
    (dict(alibi_slopes=[1.0] * 8), "ALiBi"),
    (dict(use_alibi_sqrt=True), "ALiBi"),
    (dict(attn_type=AttentionType.ENCODER), "encoder attention"),
    (dict(attn_type=AttentionType.ENCODER_ONLY), "encoder-only attention"),
    (dict(attn_type=AttentionType.ENCODER_DECODER), "encoder-decoder \\(cross\\) attention"),
    (dict(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype='fp8_e5m2'"),
    (dict(kv_cache_dtype="int8_per_token_head"), "kv_cache_dtype='int8_per_token_head'"),
    (dict(kv_lora_rank=512, qk_rope_head_dim=64), "MLA"),
    (dict(head_size=72), "head size 72"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_impl_refuses_by_name(kwargs, feature):
    args = dict(num_heads=8, head_size=64, scale=0.125, num_kv_heads=2)
    args.update(kwargs)
    with pytest.raises(NotImplementedError, match=f"tileinfer_attn vLLM backend: .*{feature}.* not supported"):
        Impl(**args)


def test_builder_refuses_non_causal_and_fused_output_quant(seed):
    gen = torch.Generator().manual_seed(seed)
    attn_spec, _, (kv_cache,) = layer_caches(16, 2, 16, 64, torch.bfloat16, "cpu")
    batch = Batch([(3, 2)], kv_cache, 8, 2, 64, 16, torch.bfloat16, "cpu", gen)
    builder = Builder(attn_spec, ["l"], vllm_config(), torch.device("cpu"), block_table_width=8)
    for causal in (False, torch.tensor([True])):
        with pytest.raises(NotImplementedError, match="non-causal"):
            builder.build(0, batch.cm.replace(causal=causal))
    md = builder.build(0, batch.cm)
    impl = Impl(8, 64, 0.125, 2)
    with pytest.raises(NotImplementedError, match="fused output quantization"):
        impl.forward(None, batch.q, batch.k, batch.v, kv_cache, md, output=torch.empty_like(batch.q),
                     output_scale=torch.ones(1))


# ------------------------------------------------------------------ plugin registration
def test_pyproject_declares_the_entry_point():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"tileinfer_attn": "tileinfer_attn.vllm:register"}


def test_entry_point_registers_the_custom_backend():
    """vLLM's own plugin loader finds our entry point in the installed
    package's metadata and the CUSTOM backend resolves to our class."""
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
           if ep.dist is not None and ep.dist.name == "tileinfer_attn"}
    assert eps == {"tileinfer_attn": "tileinfer_attn.vllm:register"}, (
        f"the installed tileinfer_attn declares no vllm.general_plugins entry point (found {eps}); "
        f"reinstall it: pip install --no-build-isolation -e .")
    import vllm.plugins
    from vllm.v1.attention.backends import registry

    AttentionBackendEnum.CUSTOM.clear_override()
    vllm.plugins.plugins_loaded = False
    try:
        vllm.plugins.load_general_plugins()
        assert AttentionBackendEnum.CUSTOM.is_overridden()
        assert AttentionBackendEnum.CUSTOM.get_path() == BACKEND_CLASS_PATH
        assert AttentionBackendEnum.CUSTOM.get_class() is Backend
        assert AttentionBackendEnum[Backend.get_name()] is AttentionBackendEnum.CUSTOM
        assert registry._ATTN_OVERRIDES[AttentionBackendEnum.CUSTOM] == BACKEND_CLASS_PATH
    finally:
        AttentionBackendEnum.CUSTOM.clear_override()


def test_tileinfer_attn_does_not_import_vllm():
    code = ("import sys, tileinfer_attn, tileinfer_attn.vllm; "
            "assert 'vllm' not in sys.modules, 'importing tileinfer_attn(.vllm) imported vllm'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
