"""PagedKVCache (allocator, fork, free, errors, device metadata) and
validate_metadata."""
import pytest
import torch

import tileinfer_attn as ti
from tileinfer_attn import reference as R
from tileinfer_attn.cache import CacheFullError, PagedKVCache
from tileinfer_attn.testing import make_problem, ulp_error
from op_helpers import DEVICES, need


def check_device_rows(cache: PagedKVCache):
    """The device block_tables / seq_lens rows match the host bookkeeping."""
    tables = cache.block_tables.cpu()
    lens = cache.seq_lens.cpu()
    for s in range(cache.max_seqs):
        if s in cache.seqs:
            pages = cache.pages(s)
            assert tables[s, : len(pages)].tolist() == pages
            assert int(lens[s]) == cache.seq_len(s)
        else:
            assert int(lens[s]) == 0


def test_add_append_reserve_free():
    c = PagedKVCache(2, 10, 2, 64, page_size=16, max_seqs=4)
    a = c.add(20)
    assert c.seq_len(a) == 20 and len(c.pages(a)) == 2 and c.num_free_pages == 8
    assert c.append(a, 12) == 32 and len(c.pages(a)) == 2  # fills page 2 exactly
    assert c.append(a) == 33 and len(c.pages(a)) == 3
    b = c.add()
    c.reserve(b, 40)  # 3 pages, length unchanged
    assert c.seq_len(b) == 0 and len(c.pages(b)) == 3
    assert c.append(b, 40) == 40 and len(c.pages(b)) == 3
    assert set(c.pages(a)).isdisjoint(c.pages(b))
    check_device_rows(c)
    c.free(a)
    assert c.num_free_pages == 7 and a not in c.seqs
    check_device_rows(c)
    d = c.add(1)  # the slot and pages are reused
    assert d == a and c.num_free_pages == 6
    check_device_rows(c)


def test_out_of_pages_changes_nothing():
    c = PagedKVCache(1, 4, 1, 64, page_size=16, max_seqs=4, max_pages_per_seq=8)
    a = c.add(40)  # 3 pages
    before = (c.pages(a), c.seq_len(a), c.num_free_pages, c.block_tables.clone(), c.seq_lens.clone())
    with pytest.raises(CacheFullError, match="out of pages"):
        c.append(a, 30)
    with pytest.raises(CacheFullError, match="out of pages"):
        c.add(17)
    b = c.add(16)
    with pytest.raises(CacheFullError, match="out of pages"):
        c.prepare_step([a, b], [8, 1])  # 1 page each needed, 0 free
    assert c.num_free_pages == 0 and c.seq_len(a) == 40 and c.seq_len(b) == 16
    c.free(b)
    assert (c.pages(a), c.seq_len(a), c.num_free_pages) == before[:3]
    assert torch.equal(c.block_tables, before[3]) and torch.equal(c.seq_lens, before[4])


def test_out_of_slots_and_table_width():
    c = PagedKVCache(1, 64, 1, 64, page_size=16, max_seqs=2, max_pages_per_seq=3)
    c.add()
    c.add()
    with pytest.raises(CacheFullError, match="sequence slots"):
        c.add()
    s = c.seqs[0]
    with pytest.raises(CacheFullError, match="max_pages_per_seq"):
        c.append(s, 49)
    with pytest.raises(CacheFullError, match="sequence slots"):
        c.fork(s)


def test_bad_arguments():
    with pytest.raises(ValueError, match="page_size"):
        PagedKVCache(1, 4, 1, 64, page_size=24)
    with pytest.raises(ValueError, match="head_dim"):
        PagedKVCache(1, 4, 1, 72)
    with pytest.raises(ValueError, match="dtype"):
        PagedKVCache(1, 4, 1, 64, dtype=torch.float64)
    c = PagedKVCache(1, 4, 1, 64, page_size=16)
    with pytest.raises(ValueError, match="not live"):
        c.append(3)
    a = c.add()
    with pytest.raises(ValueError):
        c.append(a, -1)
    c.free(a)
    with pytest.raises(ValueError, match="not live"):
        c.free(a)


# (dtype, scale) of the caches the tests build: unquantized, int8, fp8 per vector and per tensor.
CACHES = [(torch.bfloat16, "vector"), (torch.int8, "vector"), (torch.float8_e4m3fn, "vector"),
          (torch.float8_e4m3fn, "tensor")]
CACHE_IDS = ["bf16", "int8", "fp8-vector", "fp8-tensor"]


@pytest.mark.parametrize("dtype,scale", CACHES, ids=CACHE_IDS)
def test_fork_shares_full_pages_and_copies_the_partial_one(dtype, scale):
    c = PagedKVCache(2, 16, 2, 64, page_size=16, dtype=dtype, max_seqs=4, scale=scale)
    a = c.add(37)  # 2 full pages + 5 positions
    pa = c.pages(a)
    c.k_pools.view(torch.uint8).random_(0, 0x7f) if c.quantized else c.k_pools.normal_()
    if c.quantized:
        c.k_scales.uniform_(0.01, 0.02)
    b = c.fork(a)
    pb = c.pages(b)
    assert pb[:2] == pa[:2] and pb[2] != pa[2]
    assert [c.refcount(p) for p in pa] == [2, 2, 1] and c.refcount(pb[2]) == 1
    assert torch.equal(c.k_pools[:, pb[2]], c.k_pools[:, pa[2]])  # every layer
    if scale == "vector" and c.quantized:
        assert torch.equal(c.k_scales[:, pb[2]], c.k_scales[:, pa[2]])
    assert c.seq_len(b) == 37
    check_device_rows(c)
    # Both grow independently; freeing the parent keeps the shared pages alive.
    c.append(a, 20)
    c.append(b, 1)
    assert set(c.pages(a)[2:]).isdisjoint(c.pages(b)[2:])
    free = c.num_free_pages
    c.free(a)
    assert c.num_free_pages == free + 2 and [c.refcount(p) for p in pa[:2]] == [1, 1]
    c.free(b)
    assert c.num_free_pages == 16


def c_quantized(dtype):
    return dtype in (torch.int8, torch.float8_e4m3fn)


def test_quantized_cache_arguments():
    c = PagedKVCache(1, 4, 2, 64, page_size=16, dtype=torch.float8_e4m3fn, scale="tensor")
    assert c.k_scales.shape == (1, 1) and c.quant_kwargs(0)["k_scale"].shape == (1,)
    assert PagedKVCache(1, 4, 2, 64, page_size=16, dtype=torch.float8_e4m3fn).k_scales.shape == (1, 4, 2, 16)
    with pytest.raises(ValueError, match="dtype torch.float8_e5m2"):
        PagedKVCache(1, 4, 2, 64, page_size=16, dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="scale='tensor'"):
        PagedKVCache(1, 4, 2, 64, page_size=16, dtype=torch.int8, scale="tensor")
    with pytest.raises(ValueError, match="scale must be"):
        PagedKVCache(1, 4, 2, 64, page_size=16, dtype=torch.float8_e4m3fn, scale="channel")


def test_fork_at_page_boundary_allocates_nothing():
    c = PagedKVCache(1, 4, 1, 64, page_size=16)
    a = c.add(32)
    b = c.fork(a)
    assert c.pages(b) == c.pages(a) and c.num_free_pages == 2


def test_prepare_step_metadata_and_static_buffers():
    c = PagedKVCache(1, 32, 2, 64, page_size=16, max_seqs=8)
    a, b, d = c.add(10), c.add(40), c.add()
    md = c.prepare_step([b, d, a], [1, 5, 2])
    assert md.seq_lens.tolist() == [41, 5, 12]
    assert md.cu_seqlens_q.tolist() == [0, 1, 6, 8]
    assert md.max_q_len == 5 and md.num_tokens == 8
    for i, s in enumerate([b, d, a]):
        pages = c.pages(s)
        assert md.block_tables[i, : len(pages)].tolist() == pages
    assert md.positions().tolist() == [40, 0, 1, 2, 3, 4, 10, 11]
    assert ti.validate_metadata(md.block_tables, md.seq_lens, md.cu_seqlens_q, 32, 16, md.num_tokens) == []
    ptrs = (md.block_tables.data_ptr(), md.seq_lens.data_ptr(), md.cu_seqlens_q.data_ptr())
    md2 = c.prepare_step([b, d, a], [1, 1, 1])
    assert (md2.block_tables.data_ptr(), md2.seq_lens.data_ptr(), md2.cu_seqlens_q.data_ptr()) == ptrs
    assert md2.seq_lens.tolist() == [42, 6, 13]
    md3 = c.prepare_step([a], [3], append=False)
    assert md3.seq_lens.tolist() == [13] and c.seq_len(a) == 13
    with pytest.raises(ValueError, match="twice"):
        c.prepare_step([a, a], [1, 1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,scale", CACHES, ids=CACHE_IDS)
def test_cache_with_ops_matches_reference(device, dtype, scale):
    """Prefill, then decode steps, then a fork whose branches diverge: every step
    through cache_write + attention on the cache's pools matches exact attention."""
    if device == "cuda":
        need("cache_write", "attention", "prefill", "decode", "combine")
    qdt = torch.bfloat16
    # ulps of bf16 against float64 (op_helpers.ULPS); the CUDA int8 kernels also
    # round q * k_smooth and p * v_scale to bf16: 6 (tests/test_int8_gpu.py says why).
    tol = 6 if c_quantized(dtype) and device == "cuda" else 4
    c = PagedKVCache(2, 40, 2, 64, page_size=16, dtype=dtype, device=device, max_seqs=4, scale=scale)
    if c.quantized:
        c.k_smooth.uniform_(0.5, 2.0)
    if scale == "tensor":  # the caller's scales (vLLM's k_scale / v_scale): keys up to ~10 in units of 448
        c.k_scales.fill_(0.025)
        c.v_scales.fill_(0.01)
    g = torch.Generator().manual_seed(0)
    seqs = [c.add(), c.add()]
    schedule = [(seqs, [23, 9]), (seqs, [1, 1]), (seqs, [3, 1])]

    def run(seqs, q_lens):
        md = c.prepare_step(seqs, q_lens)
        for layer in range(2):
            k_cache, v_cache = c.layer_cache(layer)[:2]
            kw = c.quant_kwargs(layer)
            q = torch.randn(md.num_tokens, 8, 64, generator=g).to(device, qdt)
            k = torch.randn(md.num_tokens, 2, 64, generator=g).to(device, qdt)
            v = torch.randn(md.num_tokens, 2, 64, generator=g).to(device, qdt)
            ti.cache_write(k_cache, v_cache, k, v, md.block_tables, md.seq_lens, md.cu_seqlens_q, **kw)
            out = ti.attention(q, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q, md.max_q_len,
                               **kw)
            ref = R.paged_attention(q, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q,
                                    md.max_q_len, 0.125, exact=True, **kw)
            assert ulp_error(out, ref, qdt) <= tol
            if not c.quantized:
                # the keys just written sit at the end of each sequence
                last = md.cu_seqlens_q[1:].long() - 1
                for i, s in enumerate(seqs):
                    L = c.seq_len(s) - 1
                    page = c.pages(s)[L // 16]
                    assert torch.equal(k_cache[page, :, L % 16], k[last[i]])

    for step in schedule:
        run(*step)
    child = c.fork(seqs[0])
    run([seqs[0], child, seqs[1]], [2, 16, 1])
    run([child, seqs[0]], [1, 1])
    c.free(seqs[0])
    run([child], [4])


def test_validate_metadata_reports_each_problem():
    p = make_problem([40, 17, 5], [3, 1, 5], 4, 2, 64, 16, seed=0)
    bt, lens, cu = p.block_tables, p.seq_lens, p.cu_seqlens_q
    num_pages = p.k_cache.shape[0]
    assert ti.validate_metadata(bt, lens, cu, num_pages, 16, num_tokens=9) == []

    def report(**change):
        args = dict(block_tables=bt.clone(), seq_lens=lens.clone(), cu_seqlens_q=cu.clone())
        for name, (idx, value) in change.items():
            args[name][idx] = value
        return ti.validate_metadata(**args, num_pages=num_pages, page_size=16, num_tokens=9)

    (msg,) = report(block_tables=((0, 2), num_pages))
    assert "sequence 0" in msg and "block_tables[0, 2]" in msg and "outside the pool" in msg
    (msg,) = report(block_tables=((1, 1), -1))
    assert "sequence 1" in msg and "block_tables[1, 1] = -1" in msg
    assert report(block_tables=((1, 2), -1)) == []  # past sequence 1's pages: unused
    (msg,) = report(seq_lens=(2, -3))[:1]
    assert "seq_lens[2] = -3" in msg and "negative" in msg
    msgs = report(seq_lens=(1, 10_000))
    assert any("seq_lens[1] = 10000" in m and "exceeds" in m for m in msgs)
    (msg,) = report(cu_seqlens_q=(0, 1))[:1]
    assert "cu_seqlens_q[0] = 1" in msg
    msgs = report(cu_seqlens_q=(2, 2))
    assert any("sequence 1" in m and "decreases" in m for m in msgs)
    msgs = report(cu_seqlens_q=(3, 12))
    assert any("cu_seqlens_q[3] = 12" in m and "num_tokens" in m for m in msgs)
    msgs = report(seq_lens=(0, 2))
    assert any("sequence 0" in m and "3 queries" in m and "seq_lens[0] = 2" in m for m in msgs)
    assert ti.validate_metadata(bt[0], lens, cu, num_pages, 16)  # shape problems are reported, not raised
