"""Key smoothing on an int8 cache: with outlier key channels (as real models have),
per-vector int8 quantization loses the small channels unless keys are smoothed;
with key_smoothing_factors the attention error against the unquantized keys
must drop far below the unsmoothed one."""
import math

import pytest
import torch

import tileinfer_attn as ti
from tileinfer_attn.testing import rel_error
from op_helpers import DEVICES


def int8_attention_error(device, smooth: bool) -> float:
    g = torch.Generator().manual_seed(0)
    hq, hkv, d, page, length = 8, 2, 128, 64, 300
    keys = torch.randn(length, hkv, d, generator=g)
    outliers = [5, 77, 100]
    keys[..., outliers] *= 40.0  # outlier key channels, as trained models have...
    values = torch.randn(length, hkv, d, generator=g)
    q = torch.randn(1, hq, d, generator=g)
    q[..., outliers] /= 40.0  # ...that queries barely weigh: the scores live in the other channels
    k, v, q = (t.bfloat16().to(device) for t in (keys, values, q))
    pages = math.ceil(length / page)
    shape = (pages, hkv, page, d)
    k_cache = torch.zeros(shape, dtype=torch.int8, device=device)
    v_cache = torch.zeros(shape, dtype=torch.int8, device=device)
    k_scale = torch.ones(shape[:3], device=device)
    v_scale = torch.ones(shape[:3], device=device)
    k_smooth = ti.key_smoothing_factors(k).to(device) if smooth else None
    tables = torch.arange(pages, dtype=torch.int32, device=device)[None]
    lens = torch.tensor([length], dtype=torch.int32, device=device)
    ops = torch.ops.tileinfer_attn
    # Write all positions as one step's tokens, then attend with one query.
    ops.cache_write(k_cache, v_cache, k, v, tables, lens, torch.tensor([0, length], dtype=torch.int32,
                                                                         device=device), k_scale, v_scale, k_smooth)
    out = torch.empty_like(q)
    cu1 = torch.tensor([0, 1], dtype=torch.int32, device=device)
    ops.attention(out, q, k_cache, v_cache, tables, lens, cu1, 1, d ** -0.5, True, k_scale, v_scale, k_smooth)
    # Exact attention on the original (unquantized, bf16) keys and values.
    scores = torch.einsum("hd,lhd->hl", q[0].double(), k.double().repeat_interleave(hq // hkv, 1)) * d ** -0.5
    exact = torch.einsum("hl,lhd->hd", scores.softmax(-1), v.double().repeat_interleave(hq // hkv, 1))
    return rel_error(out[0], exact)


@pytest.mark.parametrize("device", DEVICES)
def test_smoothing_beats_plain_int8_on_outlier_keys(device):
    plain = int8_attention_error(device, smooth=False)
    smoothed = int8_attention_error(device, smooth=True)
    print(f"int8 attention error vs unquantized keys: plain {plain:.2e}, smoothed {smoothed:.2e}")
    assert smoothed < 0.25 * plain, (plain, smoothed)
    assert smoothed < 2e-2


def test_smoothing_factors_shape_and_scale():
    keys = torch.randn(50, 2, 64)
    keys[..., 3] *= 100
    s = ti.key_smoothing_factors(keys)
    assert s.shape == (2, 64) and s.dtype == torch.float32
    assert torch.allclose(s.log().mean(-1), torch.zeros(2), atol=1e-5)
    assert bool((s[:, 3] > 10 * s[:, 4]).all())
    with pytest.raises(RuntimeError, match="keys must be 3-D"):
        ti.key_smoothing_factors(keys[0])
