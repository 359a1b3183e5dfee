"""Mixed steps on the GPU: `attention` over steps whose sequences have any query
counts (decodes of 1, verifies of 2-16, prompt chunks of more) in any order
runs decode (+ combine) for the sequences of at most 16 queries and prefill for
the others (attention_work.cuh, "Mixed steps"). Against float64 with the
output poisoned first, across group sizes, page sizes, dtypes and split
counts (few sequences: partials indexed by slots and combine; many: decode
writes the output itself); and one captured CUDA graph replayed over steps
whose mix changes, bit for bit against eager calls."""
import dataclasses
import math

import pytest
import torch

from op_helpers import (CACHE_KINDS, QUANT_KINDS, ULPS, check_out, exact_attention, hopper, kernels_run, misaligned_copy,
                        need_path, prefill_consumers, run_attention)
from tileinfer_attn.testing import PagedProblem, make_problem, poison_

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ops = torch.ops.tileinfer_attn
DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
PREFILL_KERNEL = "sm90::prefill_kernel"  # the warp-specialized Hopper prefill, in a kernel's profiler name


def check_prefill_launches(names, decode_sms):
    """On Hopper: the warp-specialized prefill ran once after the decodes, or
    twice beside them (TILEINFER_MIXED_DECODE_SMS = D > 0), which the op does
    where the prefill grid is at least 2 D blocks: the steps here fill every
    SM, so where the GPU has 2 D SMs. `names`: kernels_run's."""
    if not hopper():
        return
    d = int(decode_sms)
    beside = d > 0 and torch.cuda.get_device_properties(0).multi_processor_count >= 2 * d
    launches = sum(PREFILL_KERNEL in n for n in names)
    assert launches == (2 if beside else 1), f"{launches} prefill launches with {decode_sms} SMs for the decodes"


def in_turn_and_beside(p, decode_sms, monkeypatch):
    """The attention op on p with the parts in turn (TILEINFER_MIXED_DECODE_SMS
    = 0) and with decode_sms SMs for the decodes beside the prefill, which
    must give the same bits: the kernel names of each run (kernels_run's)
    and the output."""
    monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", "0")
    names, in_turn = kernels_run(lambda: run_attention(p, True))
    monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", decode_sms)
    run_attention(p, True)  # warm-up outside the profile
    beside_names, beside = kernels_run(lambda: run_attention(p, True))
    assert torch.equal(beside, in_turn), f"{decode_sms} SMs for the decodes: other bits than the parts in turn"
    return names, beside_names, in_turn


def against_default(p, monkeypatch, **env):
    """The attention op on p (causal) with the environment variables `env`
    set, then with them unset: the first output, and the kernel names
    (kernels_run's, after a warm-up) and output of the second."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    first = run_attention(p, True)
    for name in env:
        monkeypatch.delenv(name)
    run_attention(p, True)  # warm-up outside the profile
    names, out = kernels_run(lambda: run_attention(p, True))
    return first, names, out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("group", [1, 4, 7])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mixed_step(dtype, group, page, causal, seed):
    """Decodes, verify steps of 16 and 17 queries (either side of the threshold),
    a sequence with no query this step, and prompt chunks, in no particular order."""
    need_path("attention")
    q_lens = [1, 40, 16, 1, 0, 17, 3, 300, 1]
    lens = [90, 40, 2 * page + 16, 1, 33, 17 + page, page - 1, 300, 5 * page]
    p = make_problem(lens, q_lens, 2 * group, 2, 128, page, dtype=dtype, device=DEV, seed=seed)
    out = run_attention(p, causal)
    check_out(out, exact_attention(p, causal)[0], dtype, f"mixed step group {group}")


@pytest.mark.parametrize("num_decodes", [3, 70])
def test_mixed_step_split_counts(num_decodes, seed):
    """One prompt chunk beside 3 decodes (several splits: slot partials and
    combine) or 70 (one split: the decode kernel writes out), 8 KV heads."""
    need_path("attention")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = ops.decode_num_splits(sms, num_decodes + 1, 8)
    assert (splits > 1) == (num_decodes == 3)
    lens = [500] + [64 + 37 * i for i in range(num_decodes)]
    p = make_problem(lens, [200] + [1] * num_decodes, 32, 8, 128, 64, device=DEV, seed=seed)
    out = run_attention(p, True)
    check_out(out, exact_attention(p, True)[0], torch.bfloat16, f"mixed step, {splits} splits")


# (dtype, head dim) of the steps beside their decodes: every tile dim of the
# warp-specialized prefill (sm90/prefill_tile.h: 128 keys a stage at d 64 and
# 128, 64 at d 256) and both 16-bit types, each of which takes the beside
# path on Hopper (prefill.cu: a cache of the queries' type, any tile dim).
BESIDE_SHAPES = [pytest.param(torch.bfloat16, 128, id="bf16-d128"), pytest.param(torch.float16, 64, id="fp16-d64"),
                 pytest.param(torch.bfloat16, 256, id="bf16-d256")]


@pytest.mark.parametrize("dtype,head_dim", BESIDE_SHAPES)
def test_mixed_step_chunks_among_many_decodes(dtype, head_dim, seed, monkeypatch):
    """Prompt chunks at slots 0, 35, 70 and 99 of 100 sequences (decodes and
    16-query verifies between them), beside the decodes: the run-time hand-out
    of the prefill items (prefill_scheduler.cuh) moves its window of 32
    sequences past ones without items. The bits of the parts one after the
    other, which float64 bounds; on Hopper two launches of the prefill kernel
    (8000 items fill every SM)."""
    need_path("attention")
    chunks = {0: 300, 35: 120, 70: 64, 99: 200}
    q_lens = [chunks.get(i, 1 if i % 7 else 16) for i in range(100)]
    lens = [q + (37 * i) % 200 for i, q in enumerate(q_lens)]
    p = make_problem(lens, q_lens, 32, 8, head_dim, 64, dtype=dtype, device=DEV, seed=seed)
    _, names, out = in_turn_and_beside(p, "33", monkeypatch)
    check_out(out, exact_attention(p, True)[0], dtype, f"chunks among 100 sequences, {dtype} d {head_dim}")
    check_prefill_launches(names, "33")


@pytest.mark.parametrize("decode_sms", ["16", "33", "60"])
@pytest.mark.parametrize("dtype,head_dim", BESIDE_SHAPES)
def test_mixed_step_beside_decodes_same_bits(dtype, head_dim, decode_sms, seed, monkeypatch):
    """The prompt chunks' prefill beside the decodes, on any number of SMs left
    to the decodes at first (TILEINFER_MIXED_DECODE_SMS), gives the bits of the
    parts one after the other (the default), which float64 bounds; bf16 at
    head dims 128 and 256, fp16 at 64 (BESIDE_SHAPES: each tile dim of the
    warp-specialized prefill, whose beside path takes them all). On Hopper,
    where the path exists, the profiler shows it ran: two launches of the
    prefill kernel (one on the SMs the decodes leave, one after them),
    against one in turn."""
    need_path("attention")
    q_lens = [1] * 40 + [700] + [16] * 3 + [250]
    lens = [200 + 31 * i for i in range(40)] + [1500, 300, 40, 900, 250]
    p = make_problem(lens, q_lens, 32, 8, head_dim, 64, dtype=dtype, device=DEV, seed=seed)
    names, beside_names, default = in_turn_and_beside(p, decode_sms, monkeypatch)
    check_out(default, exact_attention(p, True)[0], dtype, f"mixed step, the parts in turn, {dtype} d {head_dim}")
    check_prefill_launches(names, "0")
    check_prefill_launches(beside_names, decode_sms)


@pytest.mark.parametrize("decode_sms", ["16", "60"])
@pytest.mark.parametrize("kind", list(QUANT_KINDS))
def test_mixed_step_beside_decodes_quantized(kind, decode_sms, seed, monkeypatch):
    """A quantized cache's mixed step beside its decodes: the converter warps
    take each item as the producer hands it out (prefill_convert.cuh), here
    by the run-time hand-out of two launches; a chunk after a cached prefix
    (its prefix's tiles through the converters, its own from the pass before
    the kernel) and one with more queries than positions (items of no key
    tile, which release their query buffer without the converters' work).
    The bits of the parts in turn, which float64 bounds on the dequantized
    cache (the quantized caches' 6 ulps), and two prefill launches."""
    need_path("attention")
    q_lens = [1] * 40 + [700] + [16] * 3 + [250, 300]
    lens = [200 + 31 * i for i in range(40)] + [1500, 300, 40, 900, 250, 300]
    p = make_problem(lens, q_lens, 32, 8, 128, 64, dtype=torch.bfloat16, device=DEV, seed=seed, **QUANT_KINDS[kind])
    p.seq_lens[-1] = 100  # 300 queries, 100 positions: the first 200 see none
    names, beside_names, default = in_turn_and_beside(p, decode_sms, monkeypatch)
    check_out(default, exact_attention(p, True)[0], torch.bfloat16, f"{kind} mixed step, the parts in turn", ulps=6.0)
    check_prefill_launches(names, "0")
    check_prefill_launches(beside_names, decode_sms)


def test_mixed_step_beside_decodes_by_default(seed, monkeypatch):
    """Without TILEINFER_MIXED_DECODE_SMS a step of two sequences or more
    runs its chunks beside its decodes on Hopper, with 16 / 33 of the SMs
    (prefill.cu, decode_sms) left to the decodes, and the bits of the parts
    in turn; a lone prompt, which holds no decode, runs in turn on the
    static order (one launch)."""
    need_path("attention")
    q_lens = [1] * 24 + [2048] + [1] * 8
    lens = [300 + 29 * i for i in range(24)] + [4096] + [2000 + 7 * i for i in range(8)]
    p = make_problem(lens, q_lens, 32, 8, 128, 64, dtype=torch.bfloat16, device=DEV, seed=seed)
    in_turn, names, out = against_default(p, monkeypatch, TILEINFER_MIXED_DECODE_SMS="0")
    assert torch.equal(out, in_turn), "the default beside the decodes: other bits than the parts in turn"
    check_out(out, exact_attention(p, True)[0], torch.bfloat16, "mixed step, the default")
    sms = torch.cuda.get_device_properties(0).multi_processor_count if hopper() else 0
    check_prefill_launches(names, str(sms * 16 // 33))
    alone = make_problem([2048], [2048], 32, 8, 128, 64, dtype=torch.bfloat16, device=DEV, seed=seed)
    run_attention(alone, True)
    names, out = kernels_run(lambda: run_attention(alone, True))
    check_out(out, exact_attention(alone, True)[0], torch.bfloat16, "one prompt, the default")
    check_prefill_launches(names, "0")


def test_mixed_step_beside_decodes_from_a_pool_stream(seed):
    """A caller on the stream of PyTorch's pool that the op's side stream
    would be next (the pool hands its streams out in turn; torch.cuda.Stream()
    gives one, and graph captures often run on one): the decodes still run
    beside the first prefill launch, not after it. With the caller's stream
    as the side stream, the gate kernel (the side branch's first) started
    only once the first launch had taken every item alone, in every try;
    other processes' kernels on the GPU (the test workers beside this one)
    can delay it in one try, so it gets three."""
    need_path("attention")
    if not hopper():
        pytest.skip("the prefill beside the decodes runs on Hopper's warp-specialized kernel only")
    q_lens = [1024, 1024] + [1] * 8
    lens = [4096, 4096] + [3000 + 11 * i for i in range(8)]
    p = make_problem(lens, q_lens, 32, 8, 128, 64, dtype=torch.bfloat16, device=DEV, seed=seed)
    expected = run_attention(p, True)
    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())
    # The pool's round: streams until `caller` comes back.
    period = next((n for n in range(1, 1025) if torch.cuda.Stream().cuda_stream == caller.cuda_stream), None)
    if period is None:
        pytest.skip("torch.cuda.Stream() does not hand out the streams of a round-robin pool in this build")
    starts_ends = []
    for attempt in range(3):
        for _ in range(2 * period if attempt > 0 else 0):  # the round again, up to `caller`
            if torch.cuda.Stream().cuda_stream == caller.cuda_stream:
                break
        for _ in range(period - 1):  # all but one more: the op's next stream from the pool is `caller`
            torch.cuda.Stream()
        with torch.cuda.stream(caller):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                out = run_attention(p, True)
                torch.cuda.synchronize()
        assert torch.equal(out, expected), "from a pool stream: other bits than from the default stream"
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        gates = [e for e in kernels if "hand_out_gate" in e.name]
        prefills = sorted((e for e in kernels if PREFILL_KERNEL in e.name), key=lambda e: e.time_range.start)
        assert len(gates) == 1 and len(prefills) == 2, [e.name[:60] for e in kernels]
        starts_ends.append((gates[0].time_range.start, prefills[0].time_range.end))
        if gates[0].time_range.start < prefills[0].time_range.end:
            return
    pytest.fail("the side branch waited for the first prefill launch in every try: the caller's stream was "
                f"taken as the side stream (gate start, first launch's end, us: {starts_ends})")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mixed_step_beside_decodes_three_consumers(dtype, seed, monkeypatch):
    """A 2048-token chunk among 40 decodes at head dim 64 (32 / 8 heads: 352
    items of 192 rows as prefill.cu's prefill_three_consumers counts the
    step's tokens) takes the three-consumer kernel in turn and beside the
    decodes (33 SMs), with the same bits, which float64 bounds."""
    need_path("attention")
    q_lens = [1] * 20 + [2048] + [1] * 20
    lens = [300 + 29 * i for i in range(20)] + [2048 + 100] + [500 + 13 * i for i in range(20)]
    p = make_problem(lens, q_lens, 32, 8, 64, 16, dtype=dtype, device=DEV, seed=seed)
    names, beside_names, default = in_turn_and_beside(p, "33", monkeypatch)
    check_out(default, exact_attention(p, True)[0], dtype, f"2048-token chunk among 40 decodes, {dtype} d 64")
    check_prefill_launches(names, "0")
    check_prefill_launches(beside_names, "33")
    if hopper():
        for what, ran in (("in turn", names), ("beside", beside_names)):
            tiles = prefill_consumers(ran)
            assert tiles == ["3"], f"{what}: consumer warpgroups {tiles}, expected 3"


@pytest.mark.parametrize("decode_sms", ["0", "33"])
def test_mixed_step_per_head_items(decode_sms, seed, monkeypatch):
    """Qwen2.5-7B's heads (28 / 4: group 7, an item per query head on the
    Hopper kernel): a mixed step whose chunks run after the decodes or beside
    them, against float64, and (on Hopper) the kernel's launches."""
    need_path("attention")
    monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", decode_sms)
    q_lens = [1] * 20 + [700] + [16] * 3 + [250]
    lens = [200 + 31 * i for i in range(20)] + [1500, 300, 40, 900, 250]
    p = make_problem(lens, q_lens, 28, 4, 128, 64, device=DEV, seed=seed)
    exact = exact_attention(p, True)[0]
    run_attention(p, True)  # warm-up outside the profile
    names, out = kernels_run(lambda: run_attention(p, True))
    check_out(out, exact, torch.bfloat16, f"per-head items, {decode_sms} SMs for the decodes")
    check_prefill_launches(names, decode_sms)


@pytest.mark.parametrize("value", ["-1", "x", "100000"])
def test_mixed_decode_sms_bad_value(value, monkeypatch):
    need_path("attention")
    p = make_problem([500, 40], [300, 1], 32, 8, 128, 64, device=DEV, seed=0)
    monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", value)
    with pytest.raises(RuntimeError, match="TILEINFER_MIXED_DECODE_SMS must be an integer"):
        run_attention(p, True)


@pytest.mark.parametrize("kind", list(CACHE_KINDS))
@pytest.mark.parametrize("q_lens,lens", [([1] * 6 + [300, 16], [90 + 37 * i for i in range(6)] + [700, 400]),
                                          ([600], [900])], ids=["chunk and decodes", "lone prompt"])
def test_mixed_step_in_turn_side_stream(q_lens, lens, kind, seed, monkeypatch):
    """A step in turn (TILEINFER_MIXED_DECODE_SMS=0, or a lone prompt)
    launches its decodes on a side stream after the whole prefill grid
    (prefill.cu, "Mixed steps beside their decodes"): the bits of the
    decodes launched first on the caller's stream
    (TILEINFER_MIXED_SIDE_STREAM=0), which float64 bounds (on the dequantized
    cache: the quantized caches' 6 ulps), and one prefill launch."""
    need_path("attention")
    p = make_problem(lens, q_lens, 32, 8, 128, 64, dtype=torch.bfloat16, device=DEV, seed=seed, **CACHE_KINDS[kind])
    monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", "0")
    first, names, out = against_default(p, monkeypatch, TILEINFER_MIXED_SIDE_STREAM="0")
    assert torch.equal(out, first), "decodes on the side stream: other bits than the decodes first"
    check_out(out, exact_attention(p, True)[0], torch.bfloat16, f"{kind}: a step in turn, decodes on the side stream",
              ulps=6.0 if kind in QUANT_KINDS else ULPS)
    check_prefill_launches(names, "0")


def test_mixed_side_stream_bad_value(monkeypatch):
    need_path("attention")
    if not hopper():
        pytest.skip("the switch is read on the warp-specialized (Hopper) prefill's path")
    p = make_problem([500, 40], [300, 1], 32, 8, 128, 64, device=DEV, seed=0)
    monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", "0")  # (read for steps in turn only)
    monkeypatch.setenv("TILEINFER_MIXED_SIDE_STREAM", "2")
    with pytest.raises(RuntimeError, match="TILEINFER_MIXED_SIDE_STREAM must be 0 or 1"):
        run_attention(p, True)


@pytest.mark.parametrize("group", [4, 7])
def test_mixed_step_decode_blocks_walk_row_tiles(group, seed, monkeypatch):
    """A mixed step's decodes over a 16-bit cache run on blocks that walk their
    row tiles (attention_work.cuh, DecodeRowWalkWork): verifies of 16 and 5
    queries (4-7 row tiles of 16 rows at these groups) beside single queries,
    sequences of no query and a prompt chunk, against float64."""
    need_path("attention")
    monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", "0")
    q_lens = [16, 1, 0, 5, 40, 1, 16]
    lens = [300, 90, 12, 70, 40, 1, 16]
    p = make_problem(lens, q_lens, 2 * group, 2, 128, 16, dtype=torch.bfloat16, device=DEV, seed=seed)
    names, out = kernels_run(lambda: run_attention(p, True))
    decodes = [n for n in names if "attention_tile_kernel" in n and "Decode" in n]
    assert decodes and all("DecodeRowWalkWork" in n for n in decodes), decodes
    check_out(out, exact_attention(p, True)[0], p.q.dtype, f"mixed step, group {group}, walked row tiles")


@pytest.mark.parametrize("kind", list(QUANT_KINDS))
@pytest.mark.parametrize("q_lens,lens,max_q_len", [([600], [900], 600), ([5], [300], 40), ([16], [70], 40),
                                                   ([1, 600], [90, 900], 600)],
                         ids=["lone prompt", "lone 5-query step", "lone 16-query step", "two sequences"])
def test_mixed_step_quantized_row_walk(q_lens, lens, max_q_len, kind, seed):
    """Over a quantized cache a mixed step's decode blocks walk their row
    tiles only in a step of one sequence (decode.cu, launch_decode): a lone
    prompt (its decode launch finds nothing), a lone step of 5 or 16 queries
    under a max_q_len of 40 (2 and 4 row tiles at group 4, on the decode
    path), and a step of two sequences (a block per row tile); float64 on
    the dequantized cache bounds each."""
    need_path("attention")
    p = make_problem(lens, q_lens, 32, 8, 128, 64, dtype=torch.bfloat16, device=DEV, seed=seed, **CACHE_KINDS[kind])
    p = dataclasses.replace(p, max_q_len=max_q_len)
    names, out = kernels_run(lambda: run_attention(p, True))
    decodes = [n for n in names if "attention_tile_kernel" in n and "Decode" in n]
    walks = len(lens) == 1
    assert decodes and all(("DecodeRowWalkWork" in n) == walks for n in decodes), decodes
    check_out(out, exact_attention(p, True)[0], torch.bfloat16, f"{kind}: {len(lens)} sequence(s), max_q_len "
              f"{max_q_len}", ulps=6.0)


@pytest.mark.parametrize("which", ["q", "out"])
@pytest.mark.parametrize("step", ["prefill op", "mixed, partials", "mixed, one split"])
def test_misaligned_contiguous_views(step, which, seed):
    """q or out as a contiguous view one element into its buffer: the ops go
    through 16-byte aligned copies (attention_host.h, aligned_rows), on the
    prefill op and on a mixed step (its prefill in turn: a misaligned view
    never runs beside the decodes), whose decodes go through partials and
    combine (4 sequences) or write out themselves (71: one split)."""
    need_path("attention")
    if step == "mixed, one split":
        q_lens, lens = [300] + [1] * 70, [300] + [64 + 37 * i for i in range(70)]
    else:
        q_lens, lens = ([300], [300]) if step == "prefill op" else ([1, 300, 3, 1], [700, 300, 50, 90])
    p = make_problem(lens, q_lens, 32, 8, 128, 64, device=DEV, seed=seed)
    q = misaligned_copy(p.q) if which == "q" else p.q
    out = poison_(torch.empty_like(p.q))
    if which == "out":
        out = misaligned_copy(out)
    args = (p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len, p.scale, True)
    if step == "prefill op":
        ops.prefill(out, None, q, *args)
    else:
        ops.attention(out, q, *args)
    check_out(out, exact_attention(p, True)[0], p.q.dtype, f"{step}, misaligned {which}")


def test_mixed_step_leaves_padding_rows(seed):
    """Tokens past cu_seqlens_q[-1] (a batch captured larger than it runs) keep
    their contents on a mixed step, as on the prefill path."""
    need_path("attention")
    p = make_problem([50, 80, 7], [1, 30, 2], 8, 2, 64, 16, device=DEV, seed=seed)
    pad = 5
    q = torch.cat([p.q, torch.randn(pad, *p.q.shape[1:], device=DEV).to(p.q.dtype)])
    out = torch.full_like(q, 3.0)
    ops.attention(out, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, p.max_q_len, p.scale,
                  True)
    n = p.q.shape[0]
    check_out(out[:n], exact_attention(p, True)[0], p.q.dtype, "mixed step with padding")
    assert (out[n:] == 3.0).all(), "padding rows were written"


# Graph configurations: (query heads, KV heads, token budget, max_q_len, longest
# sequence, steps as (q_lens, seq_lens) per slot, token counts <= budget).
# "beside decodes" runs its prompt chunks beside the decodes
# (TILEINFER_MIXED_DECODE_SMS=33; prefill.cu, "Mixed steps beside their
# decodes"), with prefill items enough for it: two streams and the run-time
# hand-out inside the graph.
GRAPH_CONFIGS = {
    "small": (8, 2, 96, 64, 400, [
        ([1, 1, 1, 1, 1, 1], [17, 300, 1, 64, 65, 399]),        # all decodes
        ([64, 32, 0, 0, 0, 0], [64, 100, 5, 0, 0, 0]),          # prompt chunks, empty slots, padding tokens
        ([1, 40, 16, 1, 17, 3], [200, 40, 50, 1, 80, 333]),     # mixed, 78 tokens
        ([16, 16, 16, 16, 16, 16], [16, 40, 100, 200, 300, 399]),  # verify steps at the threshold
        ([1, 0, 64, 0, 2, 0], [9, 0, 128, 0, 30, 0]),
    ]),
    "beside decodes": (32, 8, 720, 320, 1200, [
        ([1, 1, 1, 1, 1, 1], [17, 900, 1, 64, 65, 1199]),
        ([320, 200, 0, 0, 0, 0], [320, 1000, 5, 0, 0, 0]),
        ([1, 300, 16, 1, 17, 3], [700, 300, 50, 1, 80, 1000]),
        ([16, 16, 16, 16, 16, 16], [16, 40, 100, 200, 300, 1199]),
        ([1, 0, 320, 0, 2, 0], [9, 0, 1100, 0, 30, 0]),
    ]),
}


# (configuration, dtype, head dim, cache): each configuration in bf16 at d
# 128, and "beside decodes" also at the other tile dims of BESIDE_SHAPES and
# over an int8 and an fp8 cache (QUANT_KINDS).
GRAPH_CASES = [pytest.param("small", torch.bfloat16, 128, "bf16", id="small"),
               pytest.param("beside decodes", torch.bfloat16, 128, "bf16", id="beside decodes"),
               pytest.param("beside decodes", torch.float16, 64, "bf16", id="beside decodes-fp16-d64"),
               pytest.param("beside decodes", torch.bfloat16, 256, "bf16", id="beside decodes-bf16-d256"),
               pytest.param("beside decodes", torch.bfloat16, 128, "int8", id="beside decodes-int8"),
               pytest.param("beside decodes", torch.bfloat16, 128, "fp8-tensor", id="beside decodes-fp8-tensor")]


@pytest.mark.parametrize("config,dtype,d,kind", GRAPH_CASES)
def test_mixed_steps_in_one_graph(config, dtype, d, kind, seed, monkeypatch):
    """One graph captured with a token budget and 6 sequence slots, replayed
    over steps of every kind: all decodes, all prompt chunks, mixed, verify
    steps, slots without queries and padding tokens. Each replay equals an
    eager call bit for bit (real rows) and float64 (on a quantized cache's
    dequantized values, within its 6 ulps)."""
    need_path("attention")
    if config == "beside decodes":
        monkeypatch.setenv("TILEINFER_MIXED_DECODE_SMS", "33")
    g = torch.Generator().manual_seed(seed)
    hq, hkv, budget, max_q, max_len, steps = GRAPH_CONFIGS[config]
    page, slots = 16, 6
    max_pages = math.ceil(max_len / page)
    num_pages = slots * max_pages + 2
    quant = {}
    if kind in QUANT_KINDS:  # pools of random stored values and scales (make_problem's)
        pools = make_problem([slots * max_pages * page], [1], hq, hkv, d, page, device=DEV, seed=seed, spare_pages=2,
                             **QUANT_KINDS[kind])
        k_pool, v_pool, quant = pools.k_cache, pools.v_cache, pools.quant_kwargs()
    else:
        k_pool = torch.randn(num_pages, hkv, page, d, generator=g).to(dtype).to(DEV)
        v_pool = torch.randn(num_pages, hkv, page, d, generator=g).to(dtype).to(DEV)
    table = torch.randperm(num_pages, generator=g)[:slots * max_pages].view(slots, max_pages).int().to(DEV)
    q = torch.empty(budget, hq, d, dtype=dtype, device=DEV)
    seq_lens = torch.zeros(slots, dtype=torch.int32, device=DEV)
    cu = torch.zeros(slots + 1, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    scale = d ** -0.5

    def set_step(q_lens, lens):
        q.copy_(torch.randn(budget, hq, d, generator=g).to(dtype))
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        c = torch.zeros(slots + 1, dtype=torch.int32)
        c[1:] = torch.tensor(q_lens).cumsum(0)
        cu.copy_(c)

    def call(o):
        ops.attention(o, q, k_pool, v_pool, table, seq_lens, cu, max_q, scale, True, **quant)

    set_step(*steps[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(out)  # warm-up outside the capture (allocator, kernel attributes)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out)

    for i, (q_lens, lens) in enumerate(steps):
        set_step(q_lens, lens)
        poison_(out)
        graph.replay()
        eager = poison_(torch.empty_like(out))
        call(eager)
        n = sum(q_lens)
        assert torch.equal(out[:n], eager[:n]), f"step {i}: graph replay differs from the eager call"
        live = [s for s in range(slots) if q_lens[s] > 0]
        c = torch.zeros(len(live) + 1, dtype=torch.int32)
        c[1:] = torch.tensor([q_lens[s] for s in live]).cumsum(0)
        sub = PagedProblem(q=q[:n], k_cache=k_pool, v_cache=v_pool, block_tables=table[live],
                           seq_lens=seq_lens[live], cu_seqlens_q=c.to(DEV), max_q_len=max(q_lens), scale=scale,
                           **quant)
        check_out(out[:n], exact_attention(sub, True)[0], dtype, f"graph step {i}",
                  ulps=6.0 if kind in QUANT_KINDS else ULPS)
