"""Padding tokens: a batch captured (CUDA graph) for more tokens than it runs has
tokens past cu_seqlens_q[-1] that belong to no sequence. Through decode + combine
their rows come out 0 (never stale workspace or NaN), on both devices; the real
rows are unaffected."""
import pytest
import torch

import tileinfer_attn  # noqa: F401
from op_helpers import DEVICES, exact_attention, has_cuda_kernel
from tileinfer_attn.testing import make_problem, poison_, ulp_error


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_lens", [(1, 1, 1), (4, 2, 3)])
def test_decode_padding_rows_are_zero(device, q_lens):
    if device == "cuda" and not all(has_cuda_kernel(op) for op in ("decode", "combine")):
        pytest.skip("this build has no CUDA decode/combine kernels")
    p = make_problem([70, 4, 129], q_lens, 8, 2, 64, 64, torch.bfloat16, device, seed=sum(q_lens))
    pad = 5
    q = torch.cat([p.q, torch.randn(pad, *p.q.shape[1:], device=device).to(p.q.dtype)])
    splits = 4
    po = poison_(torch.empty(splits, q.shape[0], 8, 64, device=device))
    pl = poison_(torch.empty(splits, q.shape[0], 8, device=device))
    ops = torch.ops.tileinfer_attn
    ops.decode(po, pl, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len,
               p.scale, True)
    out = poison_(torch.empty_like(q))
    ops.combine(out, None, po, pl)
    n = p.q.shape[0]
    assert torch.equal(out[n:], torch.zeros_like(out[n:])), "padding rows must be 0"
    exact, _ = exact_attention(p, True)
    assert ulp_error(out[:n], exact, torch.bfloat16) <= 4

    # The attention op takes the same path for these shapes.
    out2 = poison_(torch.empty_like(q))
    ops.attention(out2, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len,
                  p.scale, True)
    assert torch.equal(out2[n:], torch.zeros_like(out2[n:])), "attention: padding rows must be 0"
    assert ulp_error(out2[:n], exact, torch.bfloat16) <= 4
