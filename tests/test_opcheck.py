"""torch.library.opcheck for every op: schema (declared mutations), fake
implementation, autograd registration, AOT dispatch with dynamic shapes. On CPU,
and on CUDA for the ops this build has a CUDA kernel for. The attention ops
also with their per-layer variants (window, soft-cap, sinks), with and without
an int8 cache."""
import pytest
import torch

from op_helpers import call_or_skip_not_implemented, has_cuda_kernel, sample_args

OPS = ["prefill", "decode", "combine", "attention", "rms_norm", "rope", "cache_write", "attention_inputs"]
INT8 = ["prefill", "decode", "attention", "cache_write", "attention_inputs"]

VARIANTS = ["prefill", "decode", "attention"]

CASES = ([pytest.param(op, False, False, id=op) for op in OPS]
         + [pytest.param(op, True, False, id=f"{op}-int8") for op in INT8]
         + [pytest.param(op, int8, True, id=f"{op}{'-int8' if int8 else ''}-variants")
            for op in VARIANTS for int8 in (False, True)])


def opcheck(op, kwargs):
    # Positional arguments in schema order (opcheck passes them through as
    # given); an optional one not given takes its default, so that later ones
    # (the variants after the int8 tensors) keep their places.
    schema = getattr(torch.ops.tileinfer_attn, op).default._schema
    args = tuple(kwargs[a.name] if a.name in kwargs else a.default_value for a in schema.arguments)
    torch.library.opcheck(getattr(torch.ops.tileinfer_attn, op).default, args)


@pytest.mark.parametrize("op,int8,variants", CASES)
def test_opcheck_cpu(op, int8, variants):
    opcheck(op, sample_args(op, "cpu", int8, variants))


@pytest.mark.gpu
@pytest.mark.parametrize("op,int8,variants", CASES)
def test_opcheck_cuda(op, int8, variants):
    if not has_cuda_kernel(op):
        pytest.skip(f"this build has no CUDA kernel for {op}")
    kwargs = sample_args(op, "cuda", int8, variants)
    call_or_skip_not_implemented(getattr(torch.ops.tileinfer_attn, op), **sample_args(op, "cuda", int8, variants))
    opcheck(op, kwargs)
