"""GPU tests of the attention ops under programmatic dependent launches (sm_90
on): a kernel of this package launched behind another one may start while
that one still runs, and must not read what it wrote before
griddepcontrol.wait (common.cuh).

The previous kernel here is a test kernel (late_copy.cu) that lets
dependents start at once (griddepcontrol.launch_dependents), spins for a
while, and only then writes seq_lens and the block table: a kernel that read
them before its wait would see stale values, and the result must be, bit for
bit, that of the same op run on the new metadata (a decode kernel that reads
them early and uses what it read fails the bf16 decode cases). The long case
gives each decode block more tiles than it reads ahead, so block-table
entries of the lines read early are read again, through L1, after the wait.
"""
import dataclasses

import pytest
import torch

from cpp_tool import compile_tool
from op_helpers import need
from tileinfer_attn.testing import make_problem, poison_

pytestmark = pytest.mark.gpu

ops = torch.ops.tileinfer_attn
DEV = "cuda"
DELAY_NS = 2_000_000  # long past the host's launch of the attention op behind it


@pytest.fixture(scope="module")
def late_copy(tmp_path_factory):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launches need sm_90 or later")
    import ctypes
    import os
    from torch.utils.cpp_extension import CUDA_HOME
    nvcc = os.path.join(CUDA_HOME or "/usr/local/cuda", "bin", "nvcc")
    if not os.path.exists(nvcc):
        pytest.skip(f"the test kernel needs nvcc ({nvcc} not found)")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}{'a' if major == 9 else ''}"
    lib = ctypes.CDLL(str(compile_tool(tmp_path_factory, "late_copy.cu", [
        nvcc, "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=sm_{arch}"], ".so")))
    lib.late_copy.restype = ctypes.c_int
    lib.late_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p]

    def launch(dst, src, delay_ns):
        assert dst.is_cuda and dst.dtype == torch.int32 and dst.is_contiguous(), "dst: contiguous int32"
        assert src.is_cuda and src.dtype == torch.int32 and src.is_contiguous() and src.numel() == dst.numel()
        err = lib.late_copy(dst.data_ptr(), src.data_ptr(), dst.numel(), delay_ns,
                            torch.cuda.current_stream().cuda_stream)
        assert err == 0, f"late_copy: CUDA error {err}"
    return launch


# (path, int8, q_lens, long): decode + combine for 1 and 4 queries per
# sequence; 64 sequences (128 (sequence, KV head) pairs: 2 splits on 132 SMs,
# merged in thread-block clusters on Hopper, whose blocks must all start over
# together); prefill (an int8 cache takes the tensor-core kernel on every GPU).
CASES = [("attention", False, [1, 1, 1], False), ("attention", False, [1, 1, 1], True),
         ("attention", False, [4, 4, 4], False), ("attention", True, [1, 1, 1], False),
         ("attention", False, [1] * 64, False),
         ("prefill", True, [20, 33, 7], False), ("prefill", False, [20, 33, 7], False)]


@pytest.mark.parametrize("path,int8,q_lens,long", CASES,
                         ids=lambda v: f"{len(v)}x{v[0]}" if isinstance(v, list) and len(v) > 4 else str(v))
def test_metadata_written_after_the_next_kernel_started(late_copy, path, int8, q_lens, long, seed):
    need(path if path == "prefill" else "decode", "combine")
    # Long: 32 splits of 18 or 14 pages of 16 positions, up to 5 tiles of 64 keys per block.
    more = len(q_lens) - 3  # sequences past the first three: 40 positions, 33 before
    lens = ([9000, 7000, 300] if long else [300, 517, 129]) + [40] * more
    p = make_problem(lens, q_lens, 8, 2, 128, 16, dtype=torch.bfloat16, device=DEV, seed=seed, int8=int8)
    # Before: other lengths (one of them longer than the new one) and the
    # pages of each row in another order.
    old_lens = torch.tensor(([8800, 7400, 160] if long else [270, 540, 160]) + [33] * more, dtype=torch.int32,
                            device=DEV)
    old_tables = torch.roll(p.block_tables, 1, dims=1)
    new_meta = torch.cat([p.block_tables.flatten(), p.seq_lens])
    old_meta = torch.cat([old_tables.flatten(), old_lens])
    n_table = p.block_tables.numel()
    extra = p.quant_kwargs() if int8 else {}

    def run(prob, out):
        args = (*prob.args(), prob.scale, True)
        if path == "prefill":
            ops.prefill(out, None, *args, **extra)
        else:
            ops.attention(out, *args, **extra)
        return out

    # Outputs are poisoned before late_copy: a kernel between it and the op
    # would hold the op back until late_copy ends.
    expected = run(p, poison_(torch.empty_like(p.q)))
    stale = run(dataclasses.replace(p, block_tables=old_tables, seq_lens=old_lens), poison_(torch.empty_like(p.q)))
    assert not torch.equal(expected, stale), "the test needs metadata changes that change the result"
    for _ in range(3):
        meta = old_meta.clone()
        late = dataclasses.replace(p, block_tables=meta[:n_table].view_as(p.block_tables), seq_lens=meta[n_table:])
        out = poison_(torch.empty_like(p.q))
        late_copy(meta, new_meta, DELAY_NS)  # nothing may run between it and the op
        run(late, out)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"{path}: the result of stale metadata (max diff " \
            f"{(out.float() - expected.float()).abs().max().item():.3g})"
