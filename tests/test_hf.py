"""transformers' Qwen3 (small random config) with our attention vs its own sdpa attention."""
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (it is on the H200)")

import tileinfer_attn  # noqa: E402,F401
import tileinfer_attn.hf  # noqa: E402
from op_helpers import DEVICES  # noqa: E402


def _has_kernel(op, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"tileinfer_attn::{op}", key)


def _use(model, impl):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl


@pytest.mark.parametrize("device", DEVICES)
def test_qwen3_logits_match_sdpa(device):
    if device == "cuda" and not (_has_kernel("prefill", "CUDA") and _has_kernel("decode", "CUDA")):
        pytest.skip("this build has no CUDA attention kernels")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    name = tileinfer_attn.hf.register()
    cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)
    torch.manual_seed(0)
    dtype = torch.bfloat16
    ours = Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    _use(ours, name)
    theirs = Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    theirs.load_state_dict(ours.state_dict())
    _use(theirs, "sdpa")

    ids = torch.randint(0, cfg.vocab_size, (2, 70), device=device)  # 70: crosses a 64-position page
    with torch.no_grad():
        a = ours(ids).logits.float()
        b = theirs(ids).logits.float()
        # Greedy generation exercises the decode path (1 query per step, growing cache).
        ga = ours.generate(ids, max_new_tokens=6, do_sample=False)
        gb = theirs.generate(ids, max_new_tokens=6, do_sample=False)
    err = (a - b).abs().max() / b.abs().max()
    assert torch.isfinite(a).all()
    assert err < 3e-2, f"logits differ by {err:.3g} of their magnitude"
    # bf16 rounding can flip a near-tie; most greedy tokens must agree.
    agree = (ga[:, ids.shape[1]:] == gb[:, ids.shape[1]:]).float().mean()
    assert agree >= 0.75, f"greedy tokens agree on only {agree:.0%}"
