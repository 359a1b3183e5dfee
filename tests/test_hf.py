"""transformers' Qwen3 (small random config) with our attention vs its own sdpa attention; Gemma 2
(sliding window, soft-cap) and gpt-oss (sliding window, sinks) vs their eager attention."""
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
    _need_kernels(device)
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

    _compare_with_reference(ours, theirs, device, cfg.vocab_size, 3e-2)


def _need_kernels(device):
    if device == "cuda" and not (_has_kernel("prefill", "CUDA") and _has_kernel("decode", "CUDA")):
        pytest.skip("this build has no CUDA attention kernels")


def _compare_with_reference(ours, theirs, device, vocab, tol):
    """Logits of a 70-token prompt (it crosses a 64-position page, and the
    variant tests' window of 24) and 6 greedy steps (the decode path: one
    query per step, a growing cache), ours against the reference model on the
    same weights, within `tol` of the logits' magnitude. bf16 rounding can
    flip a near-tie, so most greedy tokens, not all, must agree."""
    ids = torch.randint(0, vocab, (2, 70), device=device)
    with torch.no_grad():
        a = ours(ids).logits.float()
        b = theirs(ids).logits.float()
        ga = ours.generate(ids, max_new_tokens=6, do_sample=False)
        gb = theirs.generate(ids, max_new_tokens=6, do_sample=False)
    err = (a - b).abs().max() / b.abs().max()
    assert torch.isfinite(a).all()
    assert err < tol, f"logits differ by {err:.3g} of their magnitude"
    agree = (ga[:, ids.shape[1]:] == gb[:, ids.shape[1]:]).float().mean()
    assert agree >= 0.75, f"greedy tokens agree on only {agree:.0%}"


def _pair(model_cls, cfg, device):
    name = tileinfer_attn.hf.register()
    torch.manual_seed(0)
    ours = model_cls(cfg).to(device=device, dtype=torch.float32).eval()
    for module in ours.modules():  # gpt-oss's sinks: drawn here, whatever the init does with them
        if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
            with torch.no_grad():
                module.sinks.normal_(0.0, 1.0)
    _use(ours, name)
    theirs = model_cls(cfg).to(device=device, dtype=torch.float32).eval()
    theirs.load_state_dict(ours.state_dict())
    _use(theirs, "eager")
    return ours, theirs


@pytest.mark.parametrize("device", DEVICES)
def test_gemma2_sliding_window_and_softcap_match_eager(device):
    """Gemma 2: sliding-window layers (transformers' sliding_window 24: our
    window_left 23) and attention logit soft-capping, against its eager attention."""
    _need_kernels(device)
    Gemma2Config = getattr(transformers, "Gemma2Config", None)
    if Gemma2Config is None:
        pytest.skip("this transformers has no Gemma 2")
    cfg = Gemma2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                       sliding_window=24, attn_logit_softcapping=20.0)
    ours, theirs = _pair(transformers.Gemma2ForCausalLM, cfg, device)
    _compare_with_reference(ours, theirs, device, cfg.vocab_size, 1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_gpt_oss_sliding_window_and_sinks_match_eager(device):
    """gpt-oss: sliding-window layers and learned sinks (s_aux), against its eager attention."""
    _need_kernels(device)
    GptOssConfig = getattr(transformers, "GptOssConfig", None)
    if GptOssConfig is None:
        pytest.skip("this transformers has no gpt-oss")
    cfg = GptOssConfig(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_local_experts=4,
                       num_experts_per_tok=2, max_position_embeddings=1024, sliding_window=24)
    ours, theirs = _pair(transformers.GptOssForCausalLM, cfg, device)
    _compare_with_reference(ours, theirs, device, cfg.vocab_size, 1e-3)

