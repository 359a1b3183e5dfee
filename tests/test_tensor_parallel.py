"""Tensor parallelism of the model runner: the small Qwen3-style model split over
two ranks (tileinfer_attn.models.tensor_parallel: column-parallel q/k/v and
gate/up, row-parallel o and down projections each followed by an all-reduce;
embedding, norms and LM head replicated), each rank with its own PagedKVCache
holding half the KV heads, against the same schedule on one rank.

Two processes through torch.distributed: gloo on the CPU (the CPU ops), and
NCCL with one GPU per rank where two CUDA devices exist, eagerly and with the
decode steps replayed from a CUDA graph that holds the all-reduces.

Why the results are close and not equal: a rank's o / down projection sums
half the features and rounds to the element type; the all-reduce then adds
the two halves and rounds again, where one rank rounds the full sum once.
Attention's decode split count also depends on the number of KV heads, so
partials are merged in another order. In fp32 that moves the logits by a few
fp32 ulps (bound: 1e-4 of their magnitude); a head or feature given to the
wrong rank, or a missing all-reduce, moves them by O(1). In bf16 the extra
roundings are of the size of the ones every bf16 run makes, so the bound is
relative, as flash-attention's tests set theirs: against the fp32 one-rank
run, the two-rank bf16 run may be off by at most twice what the one-rank
bf16 run is off by (measured on the CPU: 1.2x).
"""
from __future__ import annotations

import datetime
import functools
import os
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tileinfer_attn  # noqa: F401
from tileinfer_attn import PagedKVCache
from tileinfer_attn.models.qwen3 import Qwen3Config, Qwen3Model
from tileinfer_attn.models.tensor_parallel import RowParallelLinear, shard_qwen3

CFG = Qwen3Config(vocab_size=512, hidden_size=256, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                  intermediate_size=512, max_position=512)
WORLD = 2
PAGE = 16
DECODE_STEPS = 12  # from prompts of 37, 16 and 70 tokens: each sequence crosses a page boundary
FP32_TOL = 1e-4  # of the magnitude (max |x|) of what is compared
BF16_FACTOR = 2.0  # bf16: at most this times the one-rank bf16 error against fp32


def full_model(dtype, device) -> Qwen3Model:
    """The one-rank model: the same weights in every process (seeded)."""
    return Qwen3Model(CFG).randomize_(0).to(device=device, dtype=dtype).eval()


# ------------------------------------------------------------------ one schedule, any number of ranks
@torch.no_grad()
def serve(model: Qwen3Model, device, graph: bool = False) -> dict:
    """Runs a fixed serving schedule over a PagedKVCache sized by the model's KV
    heads (all of them on one rank, the rank's share under tensor parallelism):
    ragged prefill, decode steps across page boundaries, a 4-token verify step,
    a fork, a free and a mixed prefill + decode step, a non-causal drafting
    step. Tokens come from a seeded generator, not from sampling, so every run
    sees the same inputs. graph=True: the decode steps replay a CUDA graph of
    one step (all-reduces included) captured on this rank's current stream.

    Returns each step's logits and metadata and the final pools, on the CPU."""
    cfg = model.cfg
    dtype = next(model.parameters()).dtype
    cache = PagedKVCache(cfg.num_layers, num_pages=48, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                         page_size=PAGE, dtype=dtype, device=device, max_seqs=8)
    kv = [cache.layer_cache(layer) for layer in range(cfg.num_layers)]
    g = torch.Generator().manual_seed(7)
    result = {"logits": [], "block_tables": [], "seq_lens": []}

    def tokens(counts):
        return torch.randint(0, cfg.vocab_size, (sum(counts),), generator=g).to(device)

    def record(md, logits):
        # Copies: on the CPU .cpu() would return the cache's static step buffers themselves.
        result["logits"].append(logits.to("cpu", copy=True))
        result["block_tables"].append(md.block_tables.to("cpu", copy=True))
        result["seq_lens"].append(md.seq_lens.to("cpu", copy=True))

    def step(seqs, counts, causal=True):
        md = cache.prepare_step(seqs, counts, causal=causal)
        record(md, model(tokens(counts), kv, md))

    a, b, c = cache.add(), cache.add(), cache.add()
    step([a, b, c], [37, 16, 70])
    if graph:
        decode_graph(model, cache, kv, [a, b, c], tokens, record)
    else:
        for _ in range(DECODE_STEPS):
            step([a, b, c], [1, 1, 1])
    step([a, b, c], [4, 4, 4])
    d = cache.fork(b)  # copies b's partial last page in every layer of this rank's pools
    step([a, b, d], [1, 1, 1])
    cache.free(c)
    e = cache.add()
    step([e, a, d], [20, 1, 1])  # a prompt chunk beside decodes: the prefill path
    step([a, e], [8, 8], causal=False)
    result["k_pools"], result["v_pools"] = cache.k_pools.to("cpu", copy=True), cache.v_pools.to("cpu", copy=True)
    return result


def decode_graph(model, cache, kv, seqs, tokens, record):
    """DECODE_STEPS decode steps of `seqs` from one captured step: prepare_step
    rewrites the contents of the cache's static step buffers (the same storage
    for the same number of sequences), the ids go into a static buffer."""
    n = len(seqs)
    md = cache.prepare_step(seqs, [1] * n)
    ids = tokens([1] * n)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph: writes this step's keys, as the replay will again
        model(ids, kv, md)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: c10d's watchdog thread polls the events of earlier
    # collectives; in global mode a CUDA call from another thread during the
    # capture would invalidate it.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        logits = model(ids, kv, md)
    for i in range(DECODE_STEPS):
        if i:
            nxt = cache.prepare_step(seqs, [1] * n)
            assert nxt.seq_lens.data_ptr() == md.seq_lens.data_ptr(), "step buffers moved: the graph would not see them"
            ids.copy_(tokens([1] * n))
        graph.replay()
        record(md, logits)


# ------------------------------------------------------------------ the ranks
def worker(rank: int, backend: str, init_file: str, out_dir: str, dtypes, graph: bool) -> None:
    """One rank: shards the seeded model, runs the schedule, saves its results."""
    if backend == "gloo":
        torch.set_num_threads(1)  # two ranks on a small CPU: no oversubscription
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    # device_id binds an NCCL group to this rank's GPU (barrier then knows where to run).
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120),
                            device_id=device if device.type == "cuda" else None)
    try:
        for dtype in dtypes:
            shard = shard_qwen3(full_model(dtype, device), rank, WORLD)
            assert shard.cfg.num_kv_heads == CFG.num_kv_heads // WORLD
            torch.save(serve(shard, device, graph), os.path.join(out_dir, f"{dtype}-{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(tmp_path: pathlib.Path, backend: str, dtypes, graph: bool = False) -> dict:
    """Spawns the two ranks; returns {dtype: [rank 0's results, rank 1's]}."""
    # NVLink multicast buys nothing for all-reduces of a few KB; keep NCCL off it.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(worker, args=(backend, str(tmp_path / "rendezvous"), str(tmp_path), tuple(dtypes), graph),
             nprocs=WORLD, join=True)
    return {dt: [torch.load(tmp_path / f"{dt}-{r}.pt") for r in range(WORLD)] for dt in dtypes}


# ------------------------------------------------------------------ checks
def check_against_one_rank(ranks: list, device, dtype, what: str) -> None:
    """The ranks' results against one rank's on `device`: the same metadata at
    every step, the same logits bits on both ranks, and logits and pools
    within the bound of the module docstring."""
    r0, r1 = ranks
    one = one_rank(torch.float32, device)
    steps = len(one["logits"])
    assert len(r0["logits"]) == len(r1["logits"]) == steps, f"{what}: step counts differ"
    for i in range(steps):
        # The same schedule on every rank's own cache: the same metadata as one rank's.
        for key in ("block_tables", "seq_lens"):
            for r, res in enumerate(ranks):
                assert torch.equal(res[key][i], one[key][i]), f"{what}: rank {r}'s {key} at step {i} differ"
        # After the last all-reduce the ranks hold the same hidden states; the
        # replicated LM head gives the same bits (what lets one rank sample).
        assert torch.equal(r0["logits"][i], r1["logits"][i]), f"{what}: ranks' logits differ at step {i}"
    # Each rank's pools hold its block of the KV heads (dim 2 of [layers, pages, heads, page, d]).
    assert r0["k_pools"].shape[2] == one["k_pools"].shape[2] // WORLD
    tp = dict(r0, k_pools=torch.cat([r0["k_pools"], r1["k_pools"]], dim=2),
              v_pools=torch.cat([r0["v_pools"], r1["v_pools"]], dim=2))
    for key in ("logits", "k_pools", "v_pools"):
        err = _error(tp[key], one[key], f"{what}: {key}")
        if dtype == torch.float32:
            assert err <= FP32_TOL, f"{what}: {key} differ from one rank's by {err:.3g} of their magnitude"
        else:
            own = _error(one_rank(dtype, device)[key], one[key], f"one {dtype} rank: {key}")
            assert err <= BF16_FACTOR * own, (f"{what}: {key} off from one fp32 rank's by {err:.3g} of their "
                                              f"magnitude, more than {BF16_FACTOR} x the {own:.3g} of one "
                                              f"{dtype} rank")


def _error(got, want, what) -> float:
    """max |got - want| / max |want| (the largest over steps, for lists of steps)."""
    if isinstance(got, list):
        return max(_error(g, w, f"{what} at step {i}") for i, (g, w) in enumerate(zip(got, want)))
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


@functools.lru_cache(maxsize=None)
def one_rank(dtype, device) -> dict:
    """The schedule on the whole model, one rank (cached: several tests compare with it)."""
    return serve(full_model(dtype, device), device)


# ------------------------------------------------------------------ tests
def test_shards_reassemble_the_model():
    """Concatenating the ranks' weights along the split dims gives the model back;
    replicated weights are equal; each shard has its share of heads."""
    full = full_model(torch.float32, "cpu")
    shards = [shard_qwen3(full, r, WORLD) for r in range(WORLD)]
    d, hq, hkv = CFG.head_dim, CFG.num_heads, CFG.num_kv_heads
    for s in shards:
        assert (s.cfg.num_heads, s.cfg.num_kv_heads, s.cfg.intermediate_size) == (
            hq // WORLD, hkv // WORLD, CFG.intermediate_size // WORLD)
        for name in ("embed.weight", "norm.weight", "lm_head.weight"):
            assert torch.equal(s.get_parameter(name), full.get_parameter(name))
    for i, layer in enumerate(full.layers):
        mine = [s.layers[i] for s in shards]
        q, k, v = layer.qkv_proj.weight.split([hq * d, hkv * d, hkv * d])
        parts = [m.qkv_proj.weight.split([hq * d // WORLD, hkv * d // WORLD, hkv * d // WORLD]) for m in mine]
        for j, w in enumerate((q, k, v)):
            assert torch.equal(torch.cat([p[j] for p in parts]), w)
        gate, up = layer.gate_up.weight.chunk(2)
        assert torch.equal(torch.cat([m.gate_up.weight.chunk(2)[0] for m in mine]), gate)
        assert torch.equal(torch.cat([m.gate_up.weight.chunk(2)[1] for m in mine]), up)
        for name in ("o_proj", "down"):
            assert all(isinstance(getattr(m, name), RowParallelLinear) for m in mine)
            assert torch.equal(torch.cat([getattr(m, name).weight for m in mine], dim=1),
                               getattr(layer, name).weight)
        for name in ("input_norm", "post_norm"):
            assert all(torch.equal(getattr(m, name).weight, getattr(layer, name).weight) for m in mine)
        assert all(torch.equal(m.attn.q_norm, layer.attn.q_norm) and torch.equal(m.attn.k_norm, layer.attn.k_norm)
                   for m in mine)
        assert all(m.attn.num_heads == hq // WORLD and m.attn.num_kv_heads == hkv // WORLD for m in mine)


def test_shard_refuses_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="num_kv_heads"):
        shard_qwen3(full_model(torch.float32, "cpu"), 0, 4)  # 2 KV heads over 4 ranks


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("tp_gloo"), "gloo", (torch.float32, torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_ranks_gloo_cpu_match_one_rank(gloo_runs, dtype):
    check_against_one_rank(gloo_runs[dtype], "cpu", dtype, f"gloo {dtype}")


def two_gpus(test):
    """Marks a test that needs two CUDA devices and NCCL (skipped, with the reason, otherwise)."""
    marks = (pytest.mark.gpu,
             pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (one per rank, NCCL)"),
             pytest.mark.skipif(not dist.is_nccl_available(), reason="this PyTorch has no NCCL backend"))
    for mark in marks:
        test = mark(test)
    return test


def _need_kernels():
    ops = ("prefill", "decode", "combine", "attention_inputs")
    if not all(torch._C._dispatch_has_kernel_for_dispatch_key(f"tileinfer_attn::{op}", "CUDA") for op in ops):
        pytest.skip("this build lacks the CUDA kernels the model needs")


@pytest.fixture(scope="module")
def nccl_runs(tmp_path_factory):
    _need_kernels()
    return run_ranks(tmp_path_factory.mktemp("tp_nccl"), "nccl", (torch.float32, torch.bfloat16))


@two_gpus
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_ranks_nccl_match_one_rank(nccl_runs, dtype):
    check_against_one_rank(nccl_runs[dtype], "cuda:0", dtype, f"nccl {dtype}")


@two_gpus
def test_two_ranks_nccl_cuda_graph_decode_matches_one_rank(tmp_path):
    """The decode steps replayed from a graph captured on each rank, with the NCCL all-reduces inside."""
    _need_kernels()
    dtype = torch.bfloat16
    ranks = run_ranks(tmp_path, "nccl", (dtype,), graph=True)[dtype]
    check_against_one_rank(ranks, "cuda:0", dtype, "nccl bf16, decode from a CUDA graph")
