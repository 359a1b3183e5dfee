"""torch.library.opcheck for every op: schema (declared mutations), fake
implementation, autograd registration, AOT dispatch with dynamic shapes. On CPU,
and on CUDA for the ops this build has a CUDA kernel for. The attention ops
also with their per-layer variants (window, soft-cap, sinks), with and without
a quantized (int8, fp8) cache."""
import pytest
import torch

from op_helpers import QUANT_KINDS, call_or_skip_not_implemented, has_cuda_kernel, sample_args

OPS = ["prefill", "decode", "combine", "attention", "rms_norm", "rope", "cache_write", "attention_inputs"]
INT8 = ["prefill", "decode", "attention", "cache_write", "attention_inputs"]

VARIANTS = ["prefill", "decode", "attention"]

# The quantized caches (op_helpers.QUANT_KINDS) for every op that takes a cache.
CASES = ([pytest.param(op, False, False, id=op) for op in OPS]
         + [pytest.param(op, quant, False, id=f"{op}-{quant}") for op in INT8 for quant in QUANT_KINDS]
         + [pytest.param(op, quant, True, id=f"{op}{'-' + quant if quant else ''}-variants")
            for op in VARIANTS for quant in (False, *QUANT_KINDS)])


def opcheck(op, kwargs):
    # Positional arguments in schema order (opcheck passes them through as
    # given); an optional one not given takes its default, so that later ones
    # (the variants after the quantized cache's tensors) keep their places.
    schema = getattr(torch.ops.tileinfer_attn, op).default._schema
    args = tuple(kwargs[a.name] if a.name in kwargs else a.default_value for a in schema.arguments)
    tests = "test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args):
        # opcheck's schema check compares tensors with torch.allclose, which has
        # no float8 kernel; the same schemas (declared mutations included) are
        # checked with the int8 and bf16 caches.
        tests = tests[1:]
    torch.library.opcheck(getattr(torch.ops.tileinfer_attn, op).default, args, test_utils=tests)


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
