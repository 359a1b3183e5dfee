"""The Python side as a new user meets it: reference.paged_attention takes the
arguments of attention in the same order; the wrappers reject tensors on the
meta device mixed with real ones, naming the argument; testing.ulp_error's
dtype defaults to the output's; the PagedKVCache examples of README and of
tileinfer_attn.cache run as written on the CPU and on a GPU; README's
performance tables are benchmarks/report.py's rendering of the committed
results."""
import inspect
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import tileinfer_attn as ti
from op_helpers import DEVICES, need, sample_args
from tileinfer_attn import cache as cache_module
from tileinfer_attn import reference
from tileinfer_attn.testing import make_problem, rel_error, ulp_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ["prefill", "decode", "combine", "attention", "rms_norm", "rope", "cache_write", "attention_inputs"]


# ------------------------------------------------------------------ reference.paged_attention
def test_reference_takes_the_arguments_of_attention():
    """attention's parameters, same names, order, kinds and defaults, then keyword-only extras."""
    att = list(inspect.signature(ti.attention).parameters.values())
    ref = list(inspect.signature(reference.paged_attention).parameters.values())
    assert [p.name for p in ref[:len(att)]] == [p.name for p in att], \
        f"reference.paged_attention{inspect.signature(reference.paged_attention)} does not start with " \
        f"attention{inspect.signature(ti.attention)}"
    for a, r in zip(att, ref):
        assert (r.kind, r.default) == (a.kind, a.default), f"{a.name}: {r} in the reference, {a} in attention"
    extra = ref[len(att):]
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in extra), \
        f"the reference's own arguments must be keyword-only: {[str(p) for p in extra]}"


def test_reference_called_as_attention_gives_its_result():
    """The same positional call on both, fp32 on the CPU: the same attention
    (the eager reference rounds as fp32 PyTorch does); out= is written."""
    p = make_problem([70, 33], [5, 1], 8, 2, 64, 16, dtype=torch.float32, seed=1)
    args = (p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len, 0.1, False)
    want = ti.attention(*args)
    got = reference.paged_attention(*args)
    assert rel_error(got, want) <= 1e-5
    out = torch.full_like(p.q, float("nan"))
    assert reference.paged_attention(*args, out) is out and rel_error(out, want) <= 1e-5
    # defaults as attention's: scale head_dim ** -0.5, causal
    assert rel_error(reference.paged_attention(*args[:7]), ti.attention(*args[:7])) <= 1e-5


def test_reference_rejects_the_old_argument_order():
    """A scale where max_q_len goes (the order before max_q_len was taken) is an error naming max_q_len."""
    p = make_problem([40], [3], 4, 2, 64, 16, dtype=torch.float32, seed=2)
    with pytest.raises(RuntimeError, match="max_q_len"):
        reference.paged_attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.scale,
                                  True, exact=True)


# ------------------------------------------------------------------ meta tensors
META_CASES = [pytest.param(op, name, id=f"{op}-{name}")
              for op in OPS for name, value in sample_args(op, "cpu").items() if isinstance(value, torch.Tensor)]


@pytest.mark.parametrize("op,name", META_CASES)
def test_meta_tensor_among_real_ones_is_rejected(op, name):
    """One argument on the meta device (no data), the others on the CPU: the
    wrapper raises a RuntimeError that names the op and that argument."""
    kwargs = sample_args(op, "cpu")
    kwargs[name] = kwargs[name].to("meta")
    with pytest.raises(RuntimeError, match=rf"^{op}: {name} is on the meta device"):
        getattr(ti, op)(**kwargs)


# ------------------------------------------------------------------ testing.ulp_error
def test_ulp_error_dtype_defaults_to_the_outputs():
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(4, 64, generator=g, dtype=torch.float64)
    out = (exact + 3 * torch.finfo(torch.bfloat16).eps).bfloat16()
    assert ulp_error(out, exact) == ulp_error(out, exact, torch.bfloat16)
    # held in float64, the error counts float64 ulps unless told the element type
    assert ulp_error(out.double(), exact) > 1e6 * ulp_error(out.double(), exact, torch.bfloat16)
    with pytest.raises(TypeError, match="dtype"):
        ulp_error(out, exact, torch.int32)


# ------------------------------------------------------------------ PagedKVCache examples
def python_block(text, marker):
    """The first ```python block of a markdown text that contains `marker`."""
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        if marker in block:
            return block
    raise AssertionError(f"no ```python block with {marker!r}")


def run_example(code, device):
    """Runs code in a fresh interpreter; device "cpu" hides the GPUs. Returns its stdout."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    return child.stdout


def need_device(device):
    if device == "cuda":
        need("cache_write", "attention_inputs", "prefill", "decode", "combine")


@pytest.mark.parametrize("device", DEVICES)
def test_readme_paged_kv_cache_example_runs(device):
    """README's PagedKVCache example, as written; it prints what its last comment says."""
    need_device(device)
    with open(os.path.join(ROOT, "README.md")) as f:
        code = python_block(f.read(), "ti.PagedKVCache(")
    printed = run_example(code, device)
    said = re.search(r"print\(.*\)\s*#\s*(.*)", code)
    if said:
        assert said.group(1).strip() in printed, f"README says it prints {said.group(1)!r}; it printed {printed!r}"


@pytest.mark.parametrize("device", DEVICES)
def test_cache_module_example_runs(device):
    """The step in tileinfer_attn.cache's docstring, as written."""
    need_device(device)
    doc = cache_module.__doc__
    body = doc[doc.index("::\n") + 3:]
    run_example(textwrap.dedent(body) + "\nprint(out.shape)\n", device)


@pytest.mark.parametrize("op", ["rms_norm", "attention"])
def test_meta_tensor_among_real_ones_is_rejected_by_the_op(op):
    """The same through torch.ops directly: torch sends a call with a meta
    tensor to the fake kernel, which must refuse it (and accept all-meta calls)."""
    if op == "rms_norm":
        x = torch.randn(3, 4, 64).bfloat16()
        args = [torch.empty_like(x), x, torch.randn(64).bfloat16(), 1e-6]
        meta_at, meta_name, real_name = 0, "out", "x"
    else:
        p = make_problem([9, 5], [9, 1], 4, 2, 64, 16)
        args = [torch.empty_like(p.q), *p.args(), p.scale, True]
        meta_at, meta_name, real_name = 1, "q", "out"
    mixed = list(args)
    mixed[meta_at] = mixed[meta_at].to("meta")
    fn = getattr(torch.ops.tileinfer_attn, op)
    with pytest.raises(RuntimeError, match=rf"^{op}: {meta_name} is on the meta device but {real_name} is on cpu"):
        fn(*mixed)
    fn(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])  # all meta: shapes only


# ------------------------------------------------------------------ README's performance tables
def test_readme_tables_are_rendered_from_the_committed_results():
    """README's performance tables are what benchmarks/report.py renders from
    benchmarks/results/*.json, every one of them: a result file committed
    without re-rendering README, a table edited by hand or a missing result
    fails here."""
    child = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "report.py"), "--check"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    said = child.stdout.strip().splitlines()
    assert child.returncode == 0 and len(said) == 1 and said[0].endswith("is up to date"), child.stdout + child.stderr
