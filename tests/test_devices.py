"""Ops respect the inputs' device and the current stream: a step on a side
stream, and a step on a second GPU while another is current, give the same
results as on the default stream of the current device."""
import pytest
import torch

import tileinfer_attn  # noqa: F401
from op_helpers import has_cuda_kernel
from tileinfer_attn.testing import make_problem

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
OPS = ("cache_write", "attention_inputs", "prefill", "decode", "combine")


def step(p, k, v, cos_sin):
    """attention_inputs + attention (decode path for 1-query steps, prefill otherwise)."""
    ops = torch.ops.tileinfer_attn
    q = torch.empty_like(p.q)
    ops.attention_inputs(q, p.k_cache, p.v_cache, p.q, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q, cos_sin,
                         64, None, None, 1e-6)
    out = torch.empty_like(q)
    ops.attention(out, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len,
                  p.scale, True)
    return out


def problem(device, q_lens):
    p = make_problem([40, 65, 130], q_lens, 8, 2, 64, 16, torch.bfloat16, device, seed=len(q_lens) + sum(q_lens))
    g = torch.Generator().manual_seed(1)
    t = p.q.shape[0]
    k = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    v = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    return p, k, v, tileinfer_attn.rope_cos_sin_cache(64, 256, device=device)


@pytest.mark.parametrize("q_lens", [(1, 1, 1), (20, 3, 40)])
def test_side_stream_matches_default_stream(q_lens):
    if not all(has_cuda_kernel(op) for op in OPS):
        pytest.skip("this build lacks some CUDA kernels")
    expect = step(*problem("cuda", q_lens))
    args = problem("cuda", q_lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Work queued on the side stream only: a kernel on the default stream
        # would race with it (and, in a CUDA graph, not be captured).
        torch.cuda._sleep(1_000_000)
        got = step(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got, expect)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
@pytest.mark.parametrize("q_lens", [(1, 1, 1), (20, 3, 40)])
def test_second_device_while_first_is_current(q_lens):
    if not all(has_cuda_kernel(op) for op in OPS):
        pytest.skip("this build lacks some CUDA kernels")
    expect = step(*problem("cuda:0", q_lens))
    with torch.cuda.device(0):
        got = step(*problem("cuda:1", q_lens))
    assert got.device == torch.device("cuda:1")
    assert torch.equal(got.cpu(), expect.cpu())
