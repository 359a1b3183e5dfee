"""Every bad-input class of docs/CONTRACT.md ("Bad input") raises a RuntimeError naming the
op called and the argument: dtype, device, shape, strides, head counts that do not divide,
unsupported head dim / page size, seq_lens longer than the block table can
hold (and the other host-checkable metadata values, on CPU).

Each case starts from a valid call (test_valid_baseline proves it is valid),
changes one thing, and expects the error to name what it changed."""
import re

import pytest
import torch

from op_helpers import call_or_skip_not_implemented, has_cuda_kernel, sample_args as valid

ops = torch.ops.tileinfer_attn

OPS = ["prefill", "decode", "combine", "attention", "rms_norm", "rope", "cache_write", "attention_inputs"]


def noncontig_last(t):
    """Same shape and values, last dim with stride 2."""
    big = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    big[..., ::2] = t
    return big[..., ::2]


def noncontig(t):
    """Same shape and values, not contiguous (a transposed copy seen back)."""
    return t.transpose(0, -1).contiguous().transpose(0, -1) if t.dim() > 1 else t.repeat_interleave(2)[::2]


def setv(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


ATT = ["prefill", "decode", "attention"]
PAGED = ATT + ["cache_write", "attention_inputs"]

# (ops, argument named in the message, change, host_only, quantized problem:
# False, True (int8) or an op_helpers.QUANT_KINDS name)
# host_only: the metadata *values* are checked only where they live on the host
# (CPU); on the GPU the kernels clamp and validate_metadata reports.
CASES = [
    # q: dtype, rank, strides, head dim, head counts
    (ATT, "q", lambda kw: kw.update(q=kw["q"].double()), False, False),
    (ATT, "q", lambda kw: kw.update(q=kw["q"].half()), False, False),
    (ATT, "q", lambda kw: kw.update(q=kw["q"].flatten(1)), False, False),
    (ATT, "q", lambda kw: kw.update(q=noncontig_last(kw["q"])), False, False),
    (ATT, "q", lambda kw: kw.update(q=kw["q"][..., :32]), False, False),
    (ATT, "num_q_heads", lambda kw: kw.update(q=kw["q"][:, :5]), False, False),
    (ATT, "q", lambda kw: kw.update(q=kw["q"].float()), False, True),  # fp32 q with an int8 cache
    # pools: dtype, shape, strides, head dim, page size
    (PAGED, "k_cache", lambda kw: kw.update(k_cache=kw["k_cache"].double(), v_cache=kw["v_cache"].double()),
     False, False),
    (PAGED, "k_cache", lambda kw: kw.update(k_cache=kw["k_cache"][0]), False, False),
    (PAGED, "k_cache", lambda kw: kw.update(k_cache=noncontig(kw["k_cache"])), False, False),
    (PAGED, "v_cache", lambda kw: kw.update(v_cache=kw["v_cache"][:, :1]), False, False),
    (PAGED, "v_cache", lambda kw: kw.update(v_cache=kw["v_cache"].half()), False, False),
    (PAGED, "head_dim", lambda kw: kw.update(k_cache=kw["k_cache"][..., :48].contiguous(),
                                            v_cache=kw["v_cache"][..., :48].contiguous()), False, False),
    (PAGED, "page_size", lambda kw: kw.update(k_cache=kw["k_cache"][:, :, :8].contiguous(),
                                             v_cache=kw["v_cache"][:, :, :8].contiguous()), False, False),
    # metadata: dtype, shape, strides
    (PAGED, "block_tables", lambda kw: kw.update(block_tables=kw["block_tables"].long()), False, False),
    (PAGED, "block_tables", lambda kw: kw.update(block_tables=kw["block_tables"][0]), False, False),
    (PAGED, "block_tables", lambda kw: kw.update(block_tables=noncontig(kw["block_tables"])), False, False),
    (PAGED, "seq_lens", lambda kw: kw.update(seq_lens=kw["seq_lens"].long()), False, False),
    (PAGED, "seq_lens", lambda kw: kw.update(seq_lens=kw["seq_lens"][:1]), False, False),
    (PAGED, "cu_seqlens_q", lambda kw: kw.update(cu_seqlens_q=kw["cu_seqlens_q"][:2]), False, False),
    (PAGED, "cu_seqlens_q", lambda kw: kw.update(cu_seqlens_q=kw["cu_seqlens_q"].float()), False, False),
    # metadata values (host): seq_lens longer than the table holds, negative, fewer than the queries;
    # cu_seqlens_q not from 0, decreasing, past the tokens; max_q_len too small
    (PAGED, "seq_lens", lambda kw: kw.update(seq_lens=setv(kw["seq_lens"], 1, 10_000)), True, False),
    (PAGED, "seq_lens", lambda kw: kw.update(seq_lens=setv(kw["seq_lens"], 1, -1)), True, False),
    (PAGED, "seq_lens", lambda kw: kw.update(seq_lens=setv(kw["seq_lens"], 0, 2)), True, False),
    (PAGED, "cu_seqlens_q", lambda kw: kw.update(cu_seqlens_q=setv(kw["cu_seqlens_q"], 0, 1)), True, False),
    (PAGED, "cu_seqlens_q", lambda kw: kw.update(cu_seqlens_q=setv(kw["cu_seqlens_q"], 2, 2)), True, False),
    (PAGED, "cu_seqlens_q", lambda kw: kw.update(cu_seqlens_q=setv(kw["cu_seqlens_q"], 2, 5)), True, False),
    (ATT, "max_q_len", lambda kw: kw.update(max_q_len=1), True, False),
    (ATT, "max_q_len", lambda kw: kw.update(max_q_len=-1), False, False),
    (["decode"], "max_q_len", lambda kw: kw.update(max_q_len=17), False, False),
    # per-layer variants: window below -1, a negative or non-finite soft-cap, sinks of the wrong
    # shape, dtype or strides
    (ATT, "window_left", lambda kw: kw.update(window_left=-2), False, False),
    (ATT, "logits_soft_cap", lambda kw: kw.update(logits_soft_cap=-1.0), False, False),
    (ATT, "logits_soft_cap", lambda kw: kw.update(logits_soft_cap=float("nan")), False, False),
    (ATT, "logits_soft_cap", lambda kw: kw.update(logits_soft_cap=float("inf")), False, False),
    (ATT, "logits_soft_cap", lambda kw: kw.update(logits_soft_cap=1e300), False, False),  # not a finite float
    (ATT, "sinks", lambda kw: kw.update(sinks=torch.zeros(5, device=kw["q"].device)), False, False),
    (ATT, "sinks", lambda kw: kw.update(sinks=torch.zeros(kw["q"].shape[1], 1, device=kw["q"].device)), False,
     False),
    (ATT, "sinks", lambda kw: kw.update(sinks=torch.zeros(kw["q"].shape[1], dtype=torch.bfloat16,
                                                          device=kw["q"].device)), False, False),
    (ATT, "sinks", lambda kw: kw.update(sinks=torch.zeros(2 * kw["q"].shape[1], device=kw["q"].device)[::2]),
     False, False),
    # int8 extras
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=None), False, True),
    (PAGED, "v_scale", lambda kw: kw.update(v_scale=None), False, True),
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=kw["k_scale"][:, :1]), False, True),
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=kw["k_scale"].half()), False, True),
    (PAGED, "k_smooth", lambda kw: kw.update(k_smooth=kw["k_smooth"][:, :32]), False, True),
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=torch.ones(kw["k_cache"].shape[:3],
                                                               device=kw["k_cache"].device)), False, False),
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=torch.ones(1, device=kw["k_cache"].device)), False, True),
    # fp8 extras: scales of the wrong shape, dtype or kind; e5m2 pools
    (ATT, "q", lambda kw: kw.update(q=kw["q"].float()), False, "fp8-tensor"),
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=kw["k_scale"].bfloat16()), False, "fp8-tensor"),
    (PAGED, "v_scale", lambda kw: kw.update(v_scale=kw["v_scale"].bfloat16()), False, "fp8-vector"),
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=torch.ones(2, device=kw["k_cache"].device)), False,
     "fp8-tensor"),
    (PAGED, "v_scale", lambda kw: kw.update(v_scale=kw["v_scale"][:1].flatten()[:1]), False, "fp8-vector"),
    (PAGED, "v_scale", lambda kw: kw.update(v_scale=torch.ones(kw["k_cache"].shape[:3],
                                                               device=kw["k_cache"].device)), False, "fp8-tensor"),
    (PAGED, "k_scale", lambda kw: kw.update(k_scale=None), False, "fp8-tensor"),
    (PAGED, "k_cache", lambda kw: kw.update(k_cache=kw["k_cache"].view(torch.float8_e5m2),
                                            v_cache=kw["v_cache"].view(torch.float8_e5m2)), False, "fp8-vector"),
    # outputs
    (["prefill", "attention"], "out", lambda kw: kw.update(out=kw["out"][:1]), False, False),
    (["prefill", "attention"], "out", lambda kw: kw.update(out=kw["out"].float()), False, False),
    (["prefill", "attention"], "out", lambda kw: kw.update(out=noncontig_last(kw["out"])), False, False),
    (["prefill"], "lse", lambda kw: kw.update(lse=kw["lse"][:, :3]), False, False),
    (["prefill"], "lse", lambda kw: kw.update(lse=kw["lse"].double()), False, False),
    (["decode"], "partial_out", lambda kw: kw.update(partial_out=kw["partial_out"].half()), False, False),
    (["decode"], "partial_out", lambda kw: kw.update(partial_out=kw["partial_out"][:, :, :4]), False, False),
    (["decode"], "partial_lse", lambda kw: kw.update(partial_lse=kw["partial_lse"][:1]), False, False),
    # combine
    (["combine"], "partial_out", lambda kw: kw.update(partial_out=kw["partial_out"][0]), False, False),
    (["combine"], "partial_out", lambda kw: kw.update(partial_out=kw["partial_out"].double()), False, False),
    (["combine"], "partial_out", lambda kw: kw.update(partial_out=noncontig(kw["partial_out"])), False, False),
    (["combine"], "partial_lse", lambda kw: kw.update(partial_lse=kw["partial_lse"][:, :1]), False, False),
    (["combine"], "out", lambda kw: kw.update(out=kw["out"].int()), False, False),
    (["combine"], "out", lambda kw: kw.update(out=kw["out"][:, :2]), False, False),
    (["combine"], "lse", lambda kw: kw.update(lse=kw["lse"][:1]), False, False),
    (["combine"], "head_dim", lambda kw: kw.update(partial_out=kw["partial_out"][..., :48].contiguous(),
                                                  out=kw["out"][..., :48].contiguous()), False, False),
    # rms_norm / rope
    (["rms_norm", "rope"], "x", lambda kw: kw.update(x=kw["x"].double(), out=kw["out"].double()), False, False),
    (["rms_norm", "rope"], "x", lambda kw: kw.update(x=noncontig_last(kw["x"])), False, False),
    (["rms_norm", "rope"], "out", lambda kw: kw.update(out=kw["out"][:, :3]), False, False),
    (["rms_norm", "rope"], "out", lambda kw: kw.update(out=kw["out"].half()), False, False),
    (["rms_norm", "rope"], "head_dim", lambda kw: kw.update(x=kw["x"][..., :48], out=kw["out"][..., :48]),
     False, False),
    (["rms_norm"], "weight", lambda kw: kw.update(weight=kw["weight"][:32]), False, False),
    (["rms_norm"], "weight", lambda kw: kw.update(weight=kw["weight"].float()), False, False),
    (["rope"], "positions", lambda kw: kw.update(positions=kw["positions"].float()), False, False),
    (["rope"], "positions", lambda kw: kw.update(positions=kw["positions"][:2]), False, False),
    (["rope"], "positions", lambda kw: kw.update(positions=setv(kw["positions"], 1, 64)), True, False),
    (["rope", "attention_inputs"], "rotary_dim", lambda kw: kw.update(rotary_dim=63), False, False),
    (["rope", "attention_inputs"], "rotary_dim", lambda kw: kw.update(rotary_dim=128), False, False),
    (["rope", "attention_inputs"], "cos_sin_cache", lambda kw: kw.update(cos_sin_cache=kw["cos_sin_cache"].double()),
     False, False),
    (["rope", "attention_inputs"], "cos_sin_cache",
     lambda kw: kw.update(cos_sin_cache=kw["cos_sin_cache"][:, :32]), False, False),
    # cache_write / attention_inputs inputs
    (["cache_write", "attention_inputs"], "k", lambda kw: kw.update(k=kw["k"][:, :1]), False, False),
    (["cache_write", "attention_inputs"], "k", lambda kw: kw.update(k=kw["k"].float()), False, False),
    (["cache_write", "attention_inputs"], "k", lambda kw: kw.update(k=kw["k"].float()), False, True),
    (["cache_write", "attention_inputs"], "v", lambda kw: kw.update(v=kw["v"].half()), False, False),
    (["cache_write", "attention_inputs"], "v", lambda kw: kw.update(v=kw["v"][:2]), False, False),
    (["cache_write", "attention_inputs"], "k", lambda kw: kw.update(k=noncontig_last(kw["k"])), False, False),
    (["attention_inputs"], "q", lambda kw: kw.update(q=kw["q"].half()), False, False),
    (["attention_inputs"], "q_out", lambda kw: kw.update(q_out=kw["q_out"][:, :2]), False, False),
    (["attention_inputs"], "q_norm_weight", lambda kw: kw.update(q_norm_weight=kw["q_norm_weight"].float()),
     False, False),
    (["attention_inputs"], "k_norm_weight", lambda kw: kw.update(k_norm_weight=kw["k_norm_weight"][:16]),
     False, False),
    (["attention_inputs"], "cos_sin_cache", lambda kw: kw.update(cos_sin_cache=kw["cos_sin_cache"][:10]),
     True, False),
]

PARAMS = [
    pytest.param(op, name, change, host_only, int8, id=f"{op}-{name}-{i}")
    for i, (op_list, name, change, host_only, int8) in enumerate(CASES)
    for op in op_list
    if not (int8 and op not in PAGED)
]


def check_raises(op, name, change, device, int8):
    kw = valid(op, device, int8)
    change(kw)
    with pytest.raises(RuntimeError) as info:
        getattr(ops, op)(**kw)
    msg = str(info.value)
    assert re.search(rf"\b{re.escape(name)}\b", msg), f"error does not name {name!r}: {msg}"
    # the op called, not one it calls (attention runs prefill or decode + combine)
    assert msg.startswith(f"{op}: "), f"the error of {op} does not name {op}: {msg}"


@pytest.mark.parametrize("int8", [False, True, "fp8-vector", "fp8-tensor"])
@pytest.mark.parametrize("op", OPS)
def test_valid_baseline(op, int8):
    """The unchanged calls succeed, so each failure below is due to its one change."""
    if int8 and op not in PAGED:
        pytest.skip("no cache")
    getattr(ops, op)(**valid(op, "cpu", int8))


@pytest.mark.parametrize("op,name,change,host_only,int8", PARAMS)
def test_bad_input_cpu(op, name, change, host_only, int8):
    check_raises(op, name, change, "cpu", int8)


@pytest.mark.gpu
@pytest.mark.parametrize("op,name,change,host_only,int8", [p for p in PARAMS if not p.values[3]])
def test_bad_input_cuda(op, name, change, host_only, int8):
    if not has_cuda_kernel(op):
        pytest.skip(f"this build has no CUDA kernel for {op}")
    call_or_skip_not_implemented(getattr(ops, op), **valid(op, "cuda", int8))
    check_raises(op, name, change, "cuda", int8)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ATT)
def test_sinks_on_the_cpu_cuda(op):
    """sinks on the CPU, the rest on the GPU: an error naming sinks, never a fault."""
    if not has_cuda_kernel(op):
        pytest.skip(f"this build has no CUDA kernel for {op}")
    kw = valid(op, "cuda", variants=True)
    call_or_skip_not_implemented(getattr(ops, op), **valid(op, "cuda", variants=True))
    kw["sinks"] = kw["sinks"].cpu()
    with pytest.raises(RuntimeError, match=r"\bsinks\b"):
        getattr(ops, op)(**kw)


@pytest.mark.gpu
@pytest.mark.parametrize("op", PAGED)
@pytest.mark.parametrize("arg", ["q", "k", "block_tables", "seq_lens", "cu_seqlens_q", "v_cache"])
def test_wrong_device_cuda(op, arg):
    """One argument on the CPU, the rest on the GPU."""
    if not has_cuda_kernel(op):
        pytest.skip(f"this build has no CUDA kernel for {op}")
    kw = valid(op, "cuda")
    if arg not in kw:
        pytest.skip(f"{op} has no argument {arg}")
    call_or_skip_not_implemented(getattr(ops, op), **valid(op, "cuda"))
    kw[arg] = kw[arg].cpu()
    with pytest.raises(RuntimeError, match=rf"\b{arg}\b"):
        getattr(ops, op)(**kw)


def test_wrappers_raise_runtime_error():
    """The Python wrappers' own checks raise RuntimeError too, naming the argument."""
    import tileinfer_attn as ti

    kw = valid("attention", "cpu")
    args = [kw[n] for n in ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "cu_seqlens_q")]
    with pytest.raises(RuntimeError, match="max_q_len"):
        ti.attention(*args, max_q_len=2.5)
    with pytest.raises(RuntimeError, match="scale"):
        ti.attention(*args, max_q_len=3, scale=-1.0)
    with pytest.raises(RuntimeError, match=r"\bq\b"):
        ti.attention(args[0][0], *args[1:], max_q_len=3)
    with pytest.raises(RuntimeError, match="window_left"):
        ti.attention(*args, max_q_len=3, window_left=2.0)
    with pytest.raises(RuntimeError, match="window_left"):
        ti.prefill(*args, max_q_len=3, window_left=-5)
    with pytest.raises(RuntimeError, match="logits_soft_cap"):
        ti.decode(*args, max_q_len=3, logits_soft_cap=float("inf"))
    with pytest.raises(RuntimeError, match="sinks"):
        ti.attention(*args, max_q_len=3, sinks=[0.0] * 8)
