"""Ops follow their tensors' device and that device's current stream, whatever
device is current: every op that takes a tensor, on cuda:1 while cuda:0 is
current and on a side stream of cuda:1; two caches on two devices driven from
two threads at once; a CUDA graph captured on cuda:1. Each gives the bits of
the same work on cuda:0. A kernel launched on the wrong device can still
give the right answer (with peer access enabled it reaches the other GPU's
memory), only slower and unordered with that GPU's stream, so the per-op
tests also check where the work ran: on the device and stream that were
made to hold its inputs only after a sleep.

Bits are compared across two devices of the same model: the split count of
`attention`'s decode path depends on the SM count.

The cases and drivers also run on the CPU, so that a case an op outgrows
fails here, not only on a machine with two GPUs.
"""
import os
import sys
import threading
import zlib

import pytest
import torch

import tileinfer_attn as ti
from op_helpers import PATH_KERNELS, has_cuda_kernel, need, sample_args
from tileinfer_attn import PagedKVCache
from tileinfer_attn.metadata import AttentionMetadata
from tileinfer_attn.testing import make_problem, poison_

ops = torch.ops.tileinfer_attn
OPS = ("cache_write", "attention_inputs", "prefill", "decode", "combine")
# torch.cuda._sleep cycles that keep a stream busy long after the host has
# queued an op and read its result back (about 0.1 s at 2 GHz).
SLEEP_CYCLES = 200_000_000

_SAME_MODEL = torch.cuda.device_count() >= 2 and all(
    getattr(torch.cuda.get_device_properties(0), a) == getattr(torch.cuda.get_device_properties(1), a)
    for a in ("name", "multi_processor_count"))
TWO_DEVICES = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device"),
    pytest.mark.skipif(torch.cuda.device_count() >= 2 and not _SAME_MODEL,
                       reason="cuda:0 and cuda:1 differ in model or SM count: bits would differ"),
]


def on_two_devices(test):
    """Marks a test that needs two CUDA devices of the same model (skipped, with the reason, otherwise)."""
    for mark in TWO_DEVICES:
        test = mark(test)
    return test


# ------------------------------------------------------------------ every op, one small call each
def device_ops() -> list:
    """The ops of torch.ops.tileinfer_attn that take a tensor, from the dispatcher's registry."""
    names = sorted(n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("tileinfer_attn::"))
    return [n for n in names if any("Tensor" in str(a.type) for a in getattr(ops, n).default._schema.arguments)]


def written(op: str) -> list:
    """The arguments an op declares it writes (Tensor(a!))."""
    return [a.name for a in getattr(ops, op).default._schema.arguments if a.alias_info and a.alias_info.is_write]


# Written in place and read too (their contents matter): not poisoned.
IN_PLACE = {"k_cache", "v_cache", "k_scale", "v_scale"}
INT8_OPS = {"cache_write", "attention_inputs", "prefill", "decode", "attention"}
CASES = [(op, dt) for op in device_ops() for dt in ("bf16", "fp32", "int8") if dt != "int8" or op in INT8_OPS]


def case_args(op: str, dt: str) -> dict:
    """sample_args of the op on the CPU (the same values every call), bf16 tensors
    made fp32 for "fp32", the int8 cache for "int8"; outputs poisoned (NaN)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(f"{op}-{dt}".encode()))
        args = sample_args(op, "cpu", quant=dt == "int8")
    if dt == "fp32":
        args = {k: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 else v
                for k, v in args.items()}
    for name in written(op):
        if name not in IN_PLACE and args.get(name) is not None:
            poison_(args[name])
    return args


def to(args: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def call(op: str, args: dict) -> dict:
    """Runs the op; returns what it wrote (on its device, not synchronized)."""
    getattr(ops, op)(**args)
    return {name: args[name] for name in written(op) if args.get(name) is not None}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor, on the CPU (NaN compares equal to the same NaN)."""
    return t.detach().cpu().contiguous().view(torch.uint8)


def assert_same_bits(got: dict, expect: dict, what: str) -> None:
    assert got.keys() == expect.keys(), what
    for name in expect:
        assert got[name].shape == expect[name].shape and got[name].dtype == expect[name].dtype, f"{what}: {name}"
        assert torch.equal(bits(got[name]), bits(expect[name])), f"{what}: {name} differs"


def need_op(op: str) -> None:
    need(*PATH_KERNELS.get(op, (op,)))


def warm_up(op: str, args: dict) -> None:
    """One call on cuda:1 first: its kernels loaded and attributes cached, so
    that the timed call below is queued within microseconds."""
    call(op, to(args, "cuda:1"))
    torch.cuda.synchronize(1)


def case_id(case):
    return "-".join(case)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case_is_deterministic_on_cpu(case):
    """The harness on the CPU: each case is a valid call, writes every output
    element, and gives the same bits twice."""
    op, dt = case
    first = {k: v.clone() for k, v in call(op, case_args(op, dt)).items()}
    again = call(op, case_args(op, dt))
    assert_same_bits(again, first, f"{op} {dt} twice on the CPU")
    for name, t in first.items():
        if name not in IN_PLACE and t.is_floating_point():
            assert not torch.isnan(t).any(), f"{op} {dt}: {name} has unwritten (poisoned) elements"


def test_every_op_with_a_tensor_has_a_case():
    assert {"cache_write", "attention_inputs", "prefill", "decode", "combine", "attention", "rms_norm",
            "rope"} <= set(device_ops())
    assert {op for op, _ in CASES} == set(device_ops())


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TILEINFER_REQUIRE_CUDA") != "1",
                    reason="TILEINFER_REQUIRE_CUDA=1 (scripts/gpu_check.sh) asks for a CUDA build with every kernel")
def test_cuda_build_has_every_kernel():
    """Where a CUDA build is expected, every op that takes a tensor has a CUDA
    kernel: the GPU tests skip an op without one (partial builds), so a build
    that lost a kernel would otherwise pass them all as skips."""
    assert torch.cuda.is_available(), "TILEINFER_REQUIRE_CUDA=1 on a machine without a CUDA device"
    missing = [op for op in device_ops() if not has_cuda_kernel(op)]
    assert not missing, f"no CUDA kernel for {', '.join('tileinfer_attn::' + op for op in missing)}"


@on_two_devices
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op_on_second_device_while_first_is_current(case):
    """cuda:1's op while cuda:0 is current gives cuda:0's bits, runs on cuda:1
    (its results are read while cuda:0's stream is still asleep) and allocates
    nothing on cuda:0; the current device is left as it was."""
    op, dt = case
    need_op(op)
    args = case_args(op, dt)
    warm_up(op, args)
    with torch.cuda.device(0):
        expect = {k: v.cpu() for k, v in call(op, to(args, "cuda:0")).items()}
        args1 = to(args, "cuda:1")
        torch.cuda.synchronize(1)
        torch.cuda.synchronize(0)
        base = torch.cuda.memory_allocated(0)
        torch.cuda.reset_peak_memory_stats(0)
        torch.cuda._sleep(SLEEP_CYCLES)  # cuda:0's current stream: busy from here on
        got = {k: v.cpu() for k, v in call(op, args1).items()}  # .cpu() waits for cuda:1's stream only
        asleep = not torch.cuda.current_stream(0).query()
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(0)
    assert asleep, "cuda:0's stream finished its sleep before cuda:1's results were read; raise SLEEP_CYCLES"
    assert torch.cuda.max_memory_allocated(0) == base, f"{op} on cuda:1 allocated memory on cuda:0"
    assert all(v.device == torch.device("cuda:1") for v in args1.values() if isinstance(v, torch.Tensor))
    assert_same_bits(got, expect, f"{op} {dt} on cuda:1 vs cuda:0")


@on_two_devices
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op_on_side_stream_of_second_device(case):
    """With a side stream current on cuda:1 and cuda:0 the current device, the op
    runs on that side stream: its inputs appear there only after a sleep, so
    a launch on any other stream reads poison and gives other bits."""
    op, dt = case
    need_op(op)
    args = case_args(op, dt)
    warm_up(op, args)
    expect = {k: v.cpu() for k, v in call(op, to(args, "cuda:0")).items()}
    real = to(args, "cuda:1")
    staged = {k: poison_(torch.empty_like(v)) if isinstance(v, torch.Tensor) else v for k, v in real.items()}
    torch.cuda.synchronize(1)
    side = torch.cuda.Stream(device=1)
    with torch.cuda.stream(side):  # makes cuda:1 current, with `side` its current stream
        torch.cuda._sleep(SLEEP_CYCLES)
        for k, v in real.items():
            if isinstance(v, torch.Tensor):
                staged[k].copy_(v)
        with torch.cuda.device(0):  # cuda:1's current stream stays `side`
            out = call(op, staged)
        queued = not side.query()
    side.synchronize()
    assert queued, "the side stream finished its sleep before the op was queued; raise SLEEP_CYCLES"
    assert_same_bits({k: v.cpu() for k, v in out.items()}, expect, f"{op} {dt} on a side stream of cuda:1")


# ------------------------------------------------------------------ a step, on a side stream and on cuda:1
def step(p, k, v, cos_sin):
    """attention_inputs + attention (decode path for 1-query steps, prefill otherwise)."""
    q = torch.empty_like(p.q)
    ops.attention_inputs(q, p.k_cache, p.v_cache, p.q, k, v, p.block_tables, p.seq_lens, p.cu_seqlens_q, cos_sin,
                         64, None, None, 1e-6)
    out = torch.empty_like(q)
    ops.attention(out, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len,
                  p.scale, True)
    return out


def problem(device, q_lens):
    p = make_problem([40, 65, 130], q_lens, 8, 2, 64, 16, torch.bfloat16, device, seed=len(q_lens) + sum(q_lens))
    g = torch.Generator().manual_seed(1)
    t = p.q.shape[0]
    k = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    v = torch.randn(t, 2, 64, generator=g).bfloat16().to(device)
    return p, k, v, ti.rope_cos_sin_cache(64, 256, device=device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("q_lens", [(1, 1, 1), (20, 3, 40)])
def test_side_stream_matches_default_stream(q_lens):
    if not all(has_cuda_kernel(op) for op in OPS):
        pytest.skip("this build lacks some CUDA kernels")
    expect = step(*problem("cuda", q_lens))
    args = problem("cuda", q_lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Work queued on the side stream only: a kernel on the default stream
        # would race with it (and, in a CUDA graph, not be captured).
        torch.cuda._sleep(1_000_000)
        got = step(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got, expect)


@on_two_devices
@pytest.mark.parametrize("q_lens", [(1, 1, 1), (20, 3, 40)])
def test_second_device_while_first_is_current(q_lens):
    if not all(has_cuda_kernel(op) for op in OPS):
        pytest.skip("this build lacks some CUDA kernels")
    expect = step(*problem("cuda:0", q_lens))
    with torch.cuda.device(0):
        got = step(*problem("cuda:1", q_lens))
    assert got.device == torch.device("cuda:1")
    assert torch.equal(got.cpu(), expect.cpu())


# ------------------------------------------------------------------ two threads, two caches
DRIVE_STEPS = [(37, 16, 70)] + [(1, 1, 1)] * 12 + [(4, 4, 4), (20, 1, 1)]


def drive(device, seed: int = 11) -> list:
    """A serving loop over a PagedKVCache of two layers on `device`: ragged
    prefill, decode steps across page boundaries, a verify step and a prompt
    chunk beside decodes, through the Python wrappers (attention_inputs with
    q / k norms and RoPE, then attention). Inputs from a seeded generator.
    Returns every attention output and the final pools, on the CPU."""
    cache = PagedKVCache(2, num_pages=48, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.bfloat16,
                         device=device, max_seqs=4)
    g = torch.Generator().manual_seed(seed)
    cos_sin = ti.rope_cos_sin_cache(64, 512, device=device)
    norm = (1 + 0.1 * torch.randn(64, generator=g)).bfloat16().to(device)
    seqs = [cache.add() for _ in range(3)]
    outs = []
    for counts in DRIVE_STEPS:
        md = cache.prepare_step(seqs, counts)
        for layer in range(cache.num_layers):
            q, k, v = (torch.randn(md.num_tokens, h, 64, generator=g).bfloat16().to(device) for h in (8, 2, 2))
            k_cache, v_cache = cache.layer_cache(layer)
            q = ti.attention_inputs(q, k, v, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q, cos_sin,
                                    q_norm_weight=norm, k_norm_weight=norm)
            outs.append(ti.attention(q, k_cache, v_cache, md.block_tables, md.seq_lens, md.cu_seqlens_q, md.max_q_len))
    return [o.cpu() for o in outs] + [cache.k_pools.cpu(), cache.v_pools.cpu()]


@pytest.mark.parametrize("devices", [
    ("cpu", "cpu"),
    pytest.param(("cuda:0", "cuda:1"), marks=TWO_DEVICES),
], ids=["cpu", "cuda:0+cuda:1"])
def test_two_threads_two_caches(devices):
    """Two threads drive a cache each at once (the second thread leaves cuda:0
    current, a new thread's default, while its tensors are on cuda:1); each
    gives the bits of the same loop run alone on the first device."""
    if devices[0] != "cpu":
        need("attention_inputs", "prefill", "decode", "combine")
    alone = drive(devices[0])
    results, errors = {}, []
    start = threading.Barrier(len(devices))

    def body(i, device):
        try:
            start.wait(timeout=60)
            results[i] = drive(device)
            if device.startswith("cuda"):
                assert torch.cuda.current_device() == 0, "the ops left another device current"
        except BaseException as e:  # reported below, in the test's thread
            errors.append((device, e))

    threads = [threading.Thread(target=body, args=(i, d)) for i, d in enumerate(devices)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the two threads' host code finely, not every 5 ms
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    for i, device in enumerate(devices):
        for j, (got, expect) in enumerate(zip(results[i], alone)):
            assert torch.equal(bits(got), bits(expect)), f"thread on {device}: result {j} differs from the lone run"


# ------------------------------------------------------------------ a CUDA graph captured on cuda:1
CHAIN_LENS = (40, 65, 130)  # positions held before the first step
CHAIN_STEPS = ((1, 1, 1), (2, 1, 3), (4, 4, 4), (1, 0, 1))  # queries per sequence, step by step
CHAIN_TOKENS = 12  # the captured token count: the largest step; the others are padded
CHAIN_MAX_Q = 4
CHAIN_SPLITS = 3
# The buffers every step reads (rewritten before it) and writes (read back after it).
CHAIN_INPUTS = ("q", "k", "v", "positions", "seq_lens", "cu_seqlens_q")
CHAIN_OUTPUTS = ("normed", "rotated", "k2", "v2", "q_out", "k_cache", "v_cache", "partial_out", "partial_lse",
                 "combined", "combined_lse", "prefilled", "prefilled_lse", "attended")


def chain_buffers(device) -> dict:
    """Static buffers of a step that calls every op once, the same contents on any device."""
    final = [n + sum(s[i] for s in CHAIN_STEPS) for i, n in enumerate(CHAIN_LENS)]
    p = make_problem(final, [1, 1, 1], 8, 2, 64, 16, torch.bfloat16, "cpu", seed=5)
    t, f32 = CHAIN_TOKENS, dict(dtype=torch.float32)
    b = dict(k_cache=p.k_cache, v_cache=p.v_cache, k2=p.k_cache.clone(), v2=p.v_cache.clone(),
             block_tables=p.block_tables, norm=(1 + 0.1 * torch.randn(64, generator=torch.Generator().manual_seed(3))
                                                ).bfloat16(),
             cos_sin=ti.rope_cos_sin_cache(64, 512),
             q=torch.zeros(t, 8, 64, dtype=torch.bfloat16), k=torch.zeros(t, 2, 64, dtype=torch.bfloat16),
             v=torch.zeros(t, 2, 64, dtype=torch.bfloat16), positions=torch.zeros(t, dtype=torch.long),
             seq_lens=torch.zeros(3, dtype=torch.int32), cu_seqlens_q=torch.zeros(4, dtype=torch.int32),
             partial_out=torch.zeros(CHAIN_SPLITS, t, 8, 64, **f32), partial_lse=torch.zeros(CHAIN_SPLITS, t, 8, **f32),
             combined_lse=torch.zeros(t, 8, **f32), prefilled_lse=torch.zeros(t, 8, **f32))
    for name in ("normed", "rotated", "q_out", "combined", "prefilled", "attended"):
        b[name] = torch.zeros(t, 8, 64, dtype=torch.bfloat16)
    return {k: v.to(device) for k, v in b.items()}


def chain_inputs(i: int) -> dict:
    """Step i's inputs on the CPU (lengths after the step, queries, keys, values, positions)."""
    counts = CHAIN_STEPS[i]
    lens = [n + sum(s[j] for s in CHAIN_STEPS[:i + 1]) for j, n in enumerate(CHAIN_LENS)]
    md = AttentionMetadata.build([[0]] * 3, lens, counts, "cpu")
    g = torch.Generator().manual_seed(100 + i)
    rows = sum(counts)
    x = {name: torch.zeros(CHAIN_TOKENS, h, 64, dtype=torch.bfloat16) for name, h in (("q", 8), ("k", 2), ("v", 2))}
    for name, t in x.items():
        t[:rows] = torch.randn(rows, t.shape[1], 64, generator=g).bfloat16()
    return dict(x, positions=md.positions(CHAIN_TOKENS).clamp_min(0), seq_lens=md.seq_lens,
                cu_seqlens_q=md.cu_seqlens_q)


def chain(b: dict) -> None:
    """One step through every op, reading and writing only the static buffers."""
    meta = (b["block_tables"], b["seq_lens"], b["cu_seqlens_q"])
    scale = 64 ** -0.5
    ops.rms_norm(b["normed"], b["q"], b["norm"], 1e-6)
    ops.rope(b["rotated"], b["normed"], b["positions"], b["cos_sin"], 64)
    ops.cache_write(b["k2"], b["v2"], b["k"], b["v"], *meta)
    ops.attention_inputs(b["q_out"], b["k_cache"], b["v_cache"], b["q"], b["k"], b["v"], *meta, b["cos_sin"], 64,
                         b["norm"], b["norm"], 1e-6)
    ops.decode(b["partial_out"], b["partial_lse"], b["q_out"], b["k_cache"], b["v_cache"], *meta, CHAIN_MAX_Q,
               scale, True)
    ops.combine(b["combined"], b["combined_lse"], b["partial_out"], b["partial_lse"])
    ops.prefill(b["prefilled"], b["prefilled_lse"], b["q_out"], b["k_cache"], b["v_cache"], *meta, CHAIN_MAX_Q,
                scale, True)
    # attention allocates its partials inside the op: from the graph's pool, on cuda:1.
    ops.attention(b["attended"], b["q_out"], b["k_cache"], b["v_cache"], *meta, CHAIN_MAX_Q, scale, True)


def load(b: dict, i: int) -> None:
    for name, value in chain_inputs(i).items():
        b[name].copy_(value)


def snapshot(b: dict) -> dict:
    return {name: b[name].to("cpu", copy=True) for name in CHAIN_OUTPUTS}


def eager_chain(device) -> list:
    """The steps run eagerly; step 0 twice, as the graph's warm-up and first replay run it."""
    b = chain_buffers(device)
    load(b, 0)
    chain(b)
    out = []
    for i in range(len(CHAIN_STEPS)):
        load(b, i)
        chain(b)
        out.append(snapshot(b))
    return out


def test_chain_is_deterministic_on_cpu():
    """The graph test's step, eagerly on the CPU: valid calls, the same bits twice."""
    for i, (a, b) in enumerate(zip(eager_chain("cpu"), eager_chain("cpu"))):
        assert_same_bits(a, b, f"step {i} twice on the CPU")


@on_two_devices
@pytest.mark.parametrize("current", [1, 0], ids=["cuda1_current", "cuda0_current"])
def test_cuda_graph_captured_on_second_device(current):
    """A step through every op captured on a stream of cuda:1 (with cuda:1, or
    cuda:0, current during capture and replay) and replayed as the metadata
    changes gives, step by step, the bits of the same steps run eagerly on
    cuda:0. A kernel launched on another stream would be missing from the
    graph, one on cuda:0 would fail the capture or the comparison."""
    need("rms_norm", "rope", "cache_write", "attention_inputs", "prefill", "decode", "combine")
    expect = eager_chain("cuda:0")
    b = chain_buffers("cuda:1")
    load(b, 0)
    stream = torch.cuda.Stream(device=1)
    stream.wait_stream(torch.cuda.current_stream(1))
    with torch.cuda.stream(stream):  # warm-up outside the graph, as the eager run's first step
        chain(b)
    torch.cuda.synchronize(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # makes cuda:1 current
        with torch.cuda.device(current):
            chain(b)
    with torch.cuda.device(current):
        for i, want in enumerate(expect):
            load(b, i)
            graph.replay()  # on cuda:1's current stream, whichever device is current
            assert_same_bits(snapshot(b), want, f"step {i} replayed on cuda:1 vs eager on cuda:0")
