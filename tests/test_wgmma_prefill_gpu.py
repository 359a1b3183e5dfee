"""GPU tests of the Hopper wgmma prefill kernel (csrc/include/tileinfer/attention_wgmma.cuh),
which `prefill` picks for bf16 / fp16, head dim 64 or 128, a cache of q's dtype,
on a compute-capability 9.0 device (TILEINFER_PREFILL_WGMMA=0 turns it off).

Same oracle and bounds as tests/test_attention_gpu.py: float64 attention on the
same inputs, within 4 ulps of each row's magnitude (SPEC section 4), lse within
1e-4 relative; outputs poisoned with NaN first, so unwritten rows fail, and rows
of no sequence must stay untouched. Both head dims run every test.

The first test checks (with the torch profiler) that the wgmma kernel is the
one that runs, so that a build or a device without it cannot pass the rest on
the tile kernel.
"""
import zlib

import pytest
import torch

import op_helpers
from op_helpers import exact_attention, has_cuda_kernel
from tileinfer_attn.testing import make_problem, poison_, ulp_error

pytestmark = pytest.mark.gpu

ops = torch.ops.tileinfer_attn
DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float16]
ULPS = 4.0
LSE_REL = 1e-4
KERNEL_NAME = "attention_wgmma_kernel"


def hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.fixture(params=[128, 64, 256], ids=["d128", "d64", "d256"])
def D(request, monkeypatch):
    """The head dim; the wgmma path on (the default); skips where it cannot run."""
    if not has_cuda_kernel("prefill"):
        pytest.skip("this build has no CUDA kernel for tileinfer_attn::prefill")
    if not hopper():
        pytest.skip("the wgmma prefill kernel needs a compute-capability 9.0 (Hopper) device")
    monkeypatch.delenv("TILEINFER_PREFILL_WGMMA", raising=False)
    return request.param


@pytest.fixture
def seed(request):
    return zlib.crc32(request.node.nodeid.encode())


def run_prefill(p, causal, with_lse=True, scale=None, guard=0):
    """out / lse poisoned with NaN; with guard > 0 they are views into buffers
    with `guard` NaN tokens on either side (returned too, to check them)."""
    t, h, d = p.q.shape
    big = poison_(torch.empty(t + 2 * guard, h, d, dtype=p.q.dtype, device=DEV))
    big_lse = poison_(torch.empty(t + 2 * guard, h, dtype=torch.float32, device=DEV))
    out = big[guard:guard + t]
    lse = big_lse[guard:guard + t] if with_lse else None
    ops.prefill(out, lse, *p.args(), p.scale if scale is None else scale, causal)
    if guard:
        return out, lse, big, big_lse
    return out, lse


def check_out(out, exact, dtype, what):
    assert torch.isfinite(out).all(), f"{what}: NaN / inf (unwritten or invalid) in rows that must be written"
    err = ulp_error(out, exact, dtype)
    assert err <= ULPS, f"{what}: {err:.2f} ulps > {ULPS}"


def check_lse(lse, exact_lse, what):
    op_helpers.check_lse(lse, exact_lse, what, LSE_REL)


def check_all(p, causal, dtype, what, with_lse=True):
    out, lse = run_prefill(p, causal, with_lse=with_lse)
    exact, exact_lse = exact_attention(p, causal)
    check_out(out, exact, dtype, what)
    if with_lse:
        check_lse(lse, exact_lse, what + " lse")
    return out, lse


def test_wgmma_kernel_is_used(D, seed):
    p = make_problem([300], [300], 8, 2, D, 64, device=DEV, seed=seed)
    run_prefill(p, True)  # warm-up (and the shared-memory opt-in) outside the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_prefill(p, True)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert any(KERNEL_NAME in n for n in names), (
        f"{KERNEL_NAME} did not run (a build without sm_90a code? setup.py's default "
        f"TORCH_CUDA_ARCH_LIST is 9.0a); kernels seen: {sorted(set(names))}")


@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wgmma_prefill(D, dtype, page, causal, group, seed):
    """Lengths 1, page-1, page, page+1, several pages and a few hundred; full
    prompts and chunked prefill (fewer queries than positions); 2 KV heads."""
    seq_lens = [1, page - 1, page, page + 1, 3 * page + 7, 517]
    q_lens = [1, page - 1, page // 2, 1, 2 * page + 3, 517]
    p = make_problem(seq_lens, q_lens, 2 * group, 2, D, page, dtype=dtype, device=DEV, seed=seed)
    check_all(p, causal, dtype, f"wgmma prefill page {page} group {group} causal={causal}")


@pytest.mark.parametrize("group", [3, 4])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wgmma_prefill_long(D, dtype, causal, group, seed):
    """A few thousand positions: a 3000-query prompt, a chunk of 333 queries at
    the end of 4000 positions, and a short one in the same launch."""
    p = make_problem([3000, 4000, 70], [3000, 333, 70], 2 * group, 2, D, 64, dtype=dtype, device=DEV, seed=seed)
    check_all(p, causal, dtype, f"wgmma prefill long group {group} causal={causal}")


@pytest.mark.parametrize("page", [16, 128])
def test_wgmma_prefill_long_pages(D, page, seed):
    p = make_problem([2500, 129], [2500, 129], 8, 2, D, page, device=DEV, seed=seed)
    check_all(p, True, torch.bfloat16, f"wgmma prefill long page {page}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wgmma_prefill_without_lse(D, dtype, seed):
    p = make_problem([300, 45], [120, 45], 8, 2, D, 32, dtype=dtype, device=DEV, seed=seed)
    check_all(p, True, dtype, "wgmma prefill without lse", with_lse=False)


def test_wgmma_prefill_negative_scale(D, seed):
    """scale <= 0: the scores are scaled before the softmax instead of in exp2."""
    p = make_problem([200, 64], [200, 10], 8, 2, D, 64, device=DEV, seed=seed)
    p.scale = -0.05
    check_all(p, True, torch.bfloat16, "wgmma prefill negative scale")


def test_wgmma_prefill_strided_q(D, seed):
    """q as the head slice of a fused qkv tensor (token stride != heads * d)."""
    p = make_problem([300, 77], [300, 5], 8, 2, D, 64, device=DEV, seed=seed)
    t, h, d = p.q.shape
    qkv = torch.randn(t, h + 4, d, device=DEV).to(p.q.dtype)
    qkv[:, :h] = p.q
    p.q = qkv[:, :h]
    assert not p.q.is_contiguous()
    check_all(p, True, torch.bfloat16, "wgmma prefill strided q")


def test_wgmma_prefill_padding_untouched(D, seed):
    """Padded batch slots (seq_lens 0, no queries), padding tokens past
    cu_seqlens_q[-1], and guard rows around out / lse: real rows right and
    finite, every other element still the poison."""
    p = make_problem([300, 0, 45, 0], [200, 0, 45, 0], 8, 2, D, 32, device=DEV, seed=seed)
    pad = torch.randn(5, *p.q.shape[1:], device=DEV).to(p.q.dtype)
    p.q = torch.cat([p.q, pad])
    guard = 3
    out, lse, big, big_lse = run_prefill(p, True, guard=guard)
    n = int(p.cu_seqlens_q[-1])
    exact, exact_lse = exact_attention(p, True)
    check_out(out[:n], exact[:n], torch.bfloat16, "wgmma prefill padded")
    check_lse(lse[:n], exact_lse[:n], "wgmma prefill padded lse")
    assert torch.isnan(out[n:]).all() and torch.isnan(lse[n:]).all(), "rows of no sequence were written"
    assert torch.isnan(big[:guard]).all() and torch.isnan(big[-guard:]).all(), "write outside out"
    assert torch.isnan(big_lse[:guard]).all() and torch.isnan(big_lse[-guard:]).all(), "write outside lse"


def test_wgmma_prefill_rows_that_see_nothing(D, seed):
    """A sequence whose every page id is bad: out 0, lse -inf, no NaN."""
    p = make_problem([100, 90], [100, 30], 8, 2, D, 16, device=DEV, seed=seed)
    p.block_tables[1] = -1
    out, lse = run_prefill(p, True)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, torch.bfloat16, "wgmma prefill all pages bad")
    check_lse(lse, exact_lse, "wgmma prefill all pages bad lse")
    assert torch.all(out[100:] == 0) and torch.all(lse[100:] == float("-inf"))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 64])
def test_wgmma_prefill_bad_pages(D, page, causal, seed):
    """Out-of-range and negative page ids among used pages, a seq_len beyond
    what the table holds, a negative seq_len: no fault, finite rows, the
    reference's reading (bad pages skipped, lengths clamped), nothing written
    outside out / lse."""
    p = make_problem([700, 400, 3 * page + 1, 20], [300, 3, 20, 1], 8, 2, D, page, device=DEV, seed=seed)
    num_pages = p.k_cache.shape[0]
    bt, sl = p.block_tables, p.seq_lens
    bt[0, 1] = num_pages + 5
    bt[0, 4] = 2**31 - 1
    bt[1, 0] = -3
    bt[1, 5] = -(2**31)
    sl[2] = bt.shape[1] * page + 1000  # clamped to the table (whose extra entries point at other pages)
    sl[3] = -7
    guard = 2
    out, lse, big, big_lse = run_prefill(p, causal, guard=guard)
    torch.cuda.synchronize()  # a fault would raise here
    exact, exact_lse = exact_attention(p, causal)
    check_out(out, exact, torch.bfloat16, "wgmma prefill with bad metadata")
    check_lse(lse, exact_lse, "wgmma prefill with bad metadata lse")
    assert torch.isnan(big[:guard]).all() and torch.isnan(big[-guard:]).all(), "write outside out"
    assert torch.isnan(big_lse[:guard]).all() and torch.isnan(big_lse[-guard:]).all(), "write outside lse"
    # The context survives: a normal case is still right.
    q = make_problem([100, 33], [100, 33], 8, 2, D, 16, device=DEV, seed=seed + 1)
    check_all(q, True, torch.bfloat16, "normal case after bad metadata")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wgmma_prefill_deterministic(D, dtype, seed):
    """Same inputs, same bits, run to run."""
    p = make_problem([2000, 3000, 77, 1000], [600, 1, 77, 1000], 16, 4, D, 64, dtype=dtype, device=DEV, seed=seed)
    a, a_lse = run_prefill(p, True)
    b, b_lse = run_prefill(p, True)
    assert torch.isfinite(a).all()
    assert torch.equal(a, b) and torch.equal(a_lse, b_lse), "two runs gave different bits"


def test_wgmma_prefill_other_shapes_unchanged(D, seed):
    """Head dim 256, fp32 and an int8 cache take the other kernels (and stay
    right); so does every shape with TILEINFER_PREFILL_WGMMA=0."""
    for d, dtype in ((256, torch.float16), (D, torch.float32)):
        p = make_problem([130, 40], [130, 40], 8, 2, d, 64, dtype=dtype, device=DEV, seed=seed)
        out, lse = run_prefill(p, True)
        exact, exact_lse = exact_attention(p, True)
        if dtype == torch.float32:
            err = float((out.double() - exact).norm() / exact.norm())
            assert err <= 1e-5, f"d {d} fp32: relative error {err:.3g}"
        else:
            check_out(out, exact, dtype, f"d {d} {dtype}")


def test_wgmma_switch_off(D, seed, monkeypatch):
    """TILEINFER_PREFILL_WGMMA=0: the tile kernel runs instead, within the same
    bounds, and its output is within 1 ulp of the wgmma kernel's."""
    p = make_problem([300, 41], [300, 41], 8, 2, D, 64, device=DEV, seed=seed)
    with_wgmma, _ = check_all(p, True, torch.bfloat16, "wgmma on")
    monkeypatch.setenv("TILEINFER_PREFILL_WGMMA", "0")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        without, _ = check_all(p, True, torch.bfloat16, "wgmma off")
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert not any(KERNEL_NAME in n for n in names), "TILEINFER_PREFILL_WGMMA=0 still ran the wgmma kernel"
    assert ulp_error(without, with_wgmma.double(), torch.bfloat16) <= 1.0
