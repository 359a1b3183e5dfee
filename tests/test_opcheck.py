"""torch.library.opcheck for every op: schema (declared mutations), fake
implementation, autograd registration, AOT dispatch with dynamic shapes. On CPU,
and on CUDA for the ops this build has a CUDA kernel for."""
import pytest
import torch

from op_helpers import call_or_skip_not_implemented, has_cuda_kernel, sample_args

OPS = ["prefill", "decode", "combine", "attention", "rms_norm", "rope", "cache_write", "attention_inputs"]
INT8 = ["prefill", "decode", "attention", "cache_write", "attention_inputs"]

CASES = [pytest.param(op, False, id=op) for op in OPS] + [pytest.param(op, True, id=f"{op}-int8") for op in INT8]


def opcheck(op, kwargs):
    # Positional arguments in schema order (opcheck passes them through as given).
    schema = getattr(torch.ops.tileinfer_attn, op).default._schema
    args = tuple(kwargs[a.name] for a in schema.arguments if a.name in kwargs)
    torch.library.opcheck(getattr(torch.ops.tileinfer_attn, op).default, args)


@pytest.mark.parametrize("op,int8", CASES)
def test_opcheck_cpu(op, int8):
    opcheck(op, sample_args(op, "cpu", int8))


@pytest.mark.gpu
@pytest.mark.parametrize("op,int8", CASES)
def test_opcheck_cuda(op, int8):
    if not has_cuda_kernel(op):
        pytest.skip(f"this build has no CUDA kernel for {op}")
    kwargs = sample_args(op, "cuda", int8)
    call_or_skip_not_implemented(getattr(torch.ops.tileinfer_attn, op), **sample_args(op, "cuda", int8))
    opcheck(op, kwargs)
