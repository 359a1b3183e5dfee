"""Batch invariance (docs/CONTRACT.md, "Numerics"): with ``batch_invariant=True`` a sequence's
output bits from ``attention`` do not depend on the other sequences of the
step, their number or its slot among them, nor on the block table's width.

One pool holds a target sequence and 200 others; each step is a subset of
them, the target at some slot: alone, in batches of 8 at every slot, in
batches of 200, beside a prompt chunk (a mixed step: decode for the target,
prefill for the chunk), and with a wider block table. The target's rows must
match bit for bit across all of them and stay within the usual bounds of
float64. A control runs the same steps without the flag (fp32, where a
different split count shows in the bits), so the comparison can fail.
"""
import pytest
import torch

from op_helpers import (DEVICES, ULPS, bits, check_out, exact_attention, hopper, kernels_run, need_path,
                        prefill_consumers)
from tileinfer_attn.testing import PagedProblem, make_problem, poison_

ops = torch.ops.tileinfer_attn

NUM_OTHERS = 200
CHUNK = 40  # a prompt chunk's queries: more than 16, so its step is a mixed one


def universe(target_len, target_q, dtype, device, seed, group=4, kv_heads=2, head_dim=64, page=16,
             cache_dtype=None, scale_kind="vector"):
    """Sequence 0 is the target; 1..NUM_OTHERS decode (one query), except the
    last, a prompt chunk of CHUNK queries."""
    g = torch.Generator().manual_seed(seed)
    lens = [target_len] + torch.randint(1, 5 * page, (NUM_OTHERS,), generator=g).tolist()
    lens[-1] = max(lens[-1], CHUNK) + 3 * page
    q_lens = [target_q] + [1] * (NUM_OTHERS - 1) + [CHUNK]
    p = make_problem(lens, q_lens, group * kv_heads, kv_heads, head_dim, page, dtype=dtype, device=device,
                     seed=seed, cache_dtype=cache_dtype, scale_kind=scale_kind)
    return p, q_lens


def sub_step(p, q_lens, seqs, extra_cols=0):
    """The step of universe sequences `seqs` (in that order) over the same pool;
    extra_cols widens the block table (entries past each sequence's pages)."""
    cu = p.cu_seqlens_q.cpu()
    rows = torch.cat([torch.arange(int(cu[i]), int(cu[i + 1])) for i in seqs]).to(p.q.device)
    idx = torch.tensor(seqs, device=p.q.device)
    tables = p.block_tables[idx]
    if extra_cols:
        tables = torch.cat([tables, tables[:, :1].expand(-1, extra_cols)], dim=1).contiguous()
    sub_q = [q_lens[i] for i in seqs]
    cu_sub = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu_sub[1:] = torch.tensor(sub_q).cumsum(0)
    return PagedProblem(q=p.q[rows].contiguous(), k_cache=p.k_cache, v_cache=p.v_cache, block_tables=tables,
                        seq_lens=p.seq_lens[idx].contiguous(), cu_seqlens_q=cu_sub.to(p.q.device),
                        max_q_len=max(sub_q), scale=p.scale, k_scale=p.k_scale, v_scale=p.v_scale,
                        k_smooth=p.k_smooth)


def target_rows(p, q_lens, seqs, invariant, extra_cols=0, **variants):
    step = sub_step(p, q_lens, seqs, extra_cols)
    out = poison_(torch.empty_like(step.q))
    ops.attention(out, *step.args(), step.scale, True, **step.quant_kwargs(), **variants,
                  batch_invariant=invariant)
    slot = seqs.index(0)
    begin = int(step.cu_seqlens_q[slot])
    return out[begin:begin + q_lens[0]].clone()


def steps(seed):
    """Name -> universe sequences of each step: the target at every slot of a
    batch of 8, at three slots of a batch of 200, beside the chunk."""
    g = torch.Generator().manual_seed(seed)
    others = (torch.randperm(NUM_OTHERS - 1, generator=g) + 1).tolist()  # the decodes
    out = {"alone": ([0], 0)}
    for slot in range(8):
        seven = others[7 * slot:7 * slot + 7]
        out[f"8 at slot {slot}"] = (seven[:slot] + [0] + seven[slot:], 0)
    for slot in (0, 117, 199):
        rest = others[:199]
        out[f"200 at slot {slot}"] = (rest[:slot] + [0] + rest[slot:], 0)
    out["beside a chunk"] = ([others[0], NUM_OTHERS, 0, others[1]], 0)
    out["wider block table"] = ([others[2], 0], 40)
    return out


def check_invariant(p, q_lens, seed, dtype, ulps=ULPS, **variants):
    """The target's rows of every step of steps() have the bits of the target
    alone, which is within `ulps` of float64."""
    alone = None
    for name, (seqs, extra) in steps(seed).items():
        rows = target_rows(p, q_lens, seqs, True, extra, **variants)
        if alone is None:
            alone = rows
            exact = exact_attention(sub_step(p, q_lens, [0]), True, **variants)[0]
            check_out(rows, exact, dtype, "the target alone", ulps=ulps)
            continue
        assert torch.equal(bits(rows), bits(alone)), f"target's bits differ: {name}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("target_q", [1, 4, CHUNK], ids=["decode", "verify", "prefill"])
def test_batch_invariant(device, target_q, seed):
    """Decode, a verify step of 4 queries, and a prompt chunk (the prefill path),
    bf16, 2 KV heads of 4 query heads, pages of 16: about 3000 positions, so the
    target has several splits of its own."""
    if device == "cuda":
        need_path("attention")
    p, q_lens = universe(3001, target_q, torch.bfloat16, device, seed)
    check_invariant(p, q_lens, seed, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_invariant_past_the_split_cap(device, seed):
    """A sequence long enough for the 32-split cap to set its splits: 20000
    positions in pages of 16 (1250 pages) take splits of 40 pages, 32 of
    them; decode and a verify step of 4 queries."""
    if device == "cuda":
        need_path("attention")
    for target_q in (1, 4):
        p, q_lens = universe(20000, target_q, torch.bfloat16, device, seed)
        check_invariant(p, q_lens, seed, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_control_without_the_flag_bits_follow_the_batch(device, seed):
    """The comparison can fail: without batch_invariant the split count follows
    the batch (many splits alone, one among 200), and fp32 outputs show it."""
    if device == "cuda":
        need_path("attention")
    p, q_lens = universe(3001, 1, torch.float32, device, seed)
    plan = steps(seed)
    alone = target_rows(p, q_lens, plan["alone"][0], False)
    among = target_rows(p, q_lens, plan["200 at slot 117"][0], False)
    assert not torch.equal(bits(alone), bits(among)), "without batch_invariant the bits were expected to differ"
    assert torch.equal(bits(target_rows(p, q_lens, plan["alone"][0], True)),
                       bits(target_rows(p, q_lens, plan["200 at slot 117"][0], True)))


@pytest.mark.parametrize("device", DEVICES)
def test_split_positions_for_a_measurement(device, seed, monkeypatch):
    """TILEINFER_INVARIANT_SPLIT_POSITIONS sets the plan's shortest split (to
    measure it): other splits give other bits (fp32 shows them), invariant
    again; values out of range are an error."""
    if device == "cuda":
        need_path("attention")
    p, q_lens = universe(3001, 1, torch.float32, device, seed)
    plan = steps(seed)
    at_default = target_rows(p, q_lens, plan["alone"][0], True)
    monkeypatch.setenv("TILEINFER_INVARIANT_SPLIT_POSITIONS", "512")
    alone = target_rows(p, q_lens, plan["alone"][0], True)
    assert torch.equal(bits(alone), bits(target_rows(p, q_lens, plan["200 at slot 117"][0], True)))
    assert not torch.equal(bits(alone), bits(at_default)), \
        "6 splits were expected to give other bits than 12 (the 256-position floor)"
    monkeypatch.setenv("TILEINFER_INVARIANT_SPLIT_POSITIONS", "32")
    with pytest.raises(RuntimeError, match="TILEINFER_INVARIANT_SPLIT_POSITIONS must be an integer from 64 to 4096"):
        target_rows(p, q_lens, plan["alone"][0], True)


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


@gpu
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("group", [1, 4, 7, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("target_len", [1, 511, 2048, 9000])
@pytest.mark.parametrize("target_q", [1, 16])
def test_batch_invariant_gpu(target_q, target_len, dtype, group, page, seed):
    """The decode path over group sizes (MQA-like 32 included), dtypes, page
    sizes and lengths from one position to several splits."""
    need_path("attention")
    p, q_lens = universe(max(target_len, target_q), target_q, dtype, "cuda", seed, group=group, kv_heads=2,
                         head_dim=128, page=page)
    check_invariant(p, q_lens, seed, dtype)


@gpu
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_many_sequences_merge_their_splits_in_the_decode_kernel(head_dim, seed):
    """Where the default rule gives each (sequence, KV head) one block (200
    sequences of 2 KV heads), that block merges the sequence's splits itself:
    no combine launch, and the bits of a step whose partials go through
    combine (the target alone: several blocks a sequence). 9000 positions in
    pages of 16: 32 splits, more than a combine chunk of 16 at d <= 128. Head
    dim 256 keeps the partials and combine. The bits are checked over more
    cases above."""
    need_path("attention")
    p, q_lens = universe(9000, 1, torch.bfloat16, "cuda", seed, head_dim=head_dim)
    plan = steps(seed)

    def run(name):
        return kernels_run(lambda: target_rows(p, q_lens, plan[name][0], True))

    alone_kernels, alone = run("alone")
    among_kernels, among = run("200 at slot 117")
    combines = [sum("combine_kernel" in k for k in ks) for ks in (alone_kernels, among_kernels)]
    assert combines[0] == 1, f"the target alone: {alone_kernels}"
    assert combines[1] == (1 if head_dim == 256 else 0), f"200 sequences: {among_kernels}"
    assert torch.equal(bits(alone), bits(among)), "the target's bits differ between the two merges"


@gpu
def test_two_blocks_a_pair_become_one_that_merges(seed, monkeypatch):
    """Where the default rule gives each (sequence, KV head) two blocks (as
    many pairs as SMs), the invariant step takes one block a pair that merges
    the splits itself, no combine launch; TILEINFER_INVARIANT_ONE_BLOCK=0
    keeps two blocks, their partials and combine. Same bits both ways, and
    those of the target alone."""
    need_path("attention")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kv_heads = 2
    assert ops.decode_num_splits(sms, sms // kv_heads, kv_heads) == 2
    p, q_lens = universe(3001, 1, torch.bfloat16, "cuda", seed, head_dim=128)
    others = steps(seed)["200 at slot 117"][0]
    batch = [0] + [i for i in others if i != 0][:sms // kv_heads - 1]

    def run():
        return kernels_run(lambda: target_rows(p, q_lens, batch, True))

    one_kernels, one = run()
    monkeypatch.setenv("TILEINFER_INVARIANT_ONE_BLOCK", "0")
    two_kernels, two = run()
    combines = [sum("combine_kernel" in k for k in ks) for ks in (one_kernels, two_kernels)]
    assert combines == [0, 1], f"one block: {one_kernels}; two blocks: {two_kernels}"
    assert torch.equal(bits(one), bits(two)), "the target's bits differ between one and two blocks a pair"
    assert torch.equal(bits(one), bits(target_rows(p, q_lens, [0], True))), "the target's bits differ from alone"
    monkeypatch.setenv("TILEINFER_INVARIANT_ONE_BLOCK", "2")
    with pytest.raises(RuntimeError, match="TILEINFER_INVARIANT_ONE_BLOCK must be 0 or 1"):
        target_rows(p, q_lens, batch, True)


@gpu
@pytest.mark.parametrize("cache", ["int8", "fp8 tensor", "fp8 vector"])
def test_batch_invariant_quantized_gpu(cache, seed):
    """Quantized caches: the decode tile no longer follows the block count."""
    need_path("attention")
    cache_dtype = torch.int8 if cache == "int8" else torch.float8_e4m3fn
    kind = "tensor" if cache == "fp8 tensor" else "vector"
    p, q_lens = universe(5000, 1, torch.bfloat16, "cuda", seed, head_dim=128, page=64, cache_dtype=cache_dtype,
                         scale_kind=kind)
    check_invariant(p, q_lens, seed, torch.bfloat16)


@gpu
def test_batch_invariant_d64_keeps_two_consumers(seed, monkeypatch):
    """At head dim 64 the Hopper prefill takes 192-row items (three consumer
    warpgroups) where a step has at least two per SM, counted from its shapes
    (prefill.cu, prefill_three_consumers): the target alone, a 1024-token
    prompt (32 / 8 heads: 176 such items), would not, the same step with a
    2048-token prompt and 8 decodes (520) would. With batch_invariant=True
    both keep 128-row items, and the target's rows have the bits of the
    target alone; without it that step takes the three-consumer kernel (the
    control: the rule is what the flag overrides)."""
    need_path("attention")
    if not hopper():
        pytest.skip("the three-consumer kernel is the Hopper prefill's")
    monkeypatch.delenv("TILEINFER_MIXED_DECODE_SMS", raising=False)
    q_lens = [1024, 2048] + [1] * 8
    lens = [1024, 2048 + 7] + [300 + 17 * i for i in range(8)]
    p = make_problem(lens, q_lens, 32, 8, 64, 16, dtype=torch.bfloat16, device="cuda", seed=seed)

    def run(seqs, invariant):
        names, rows = kernels_run(lambda: target_rows(p, q_lens, seqs, invariant))
        return prefill_consumers(names), rows

    tiles, alone = run([0], True)
    assert tiles == ["2"], f"the target alone: consumer warpgroups {tiles}"
    check_out(alone, exact_attention(sub_step(p, q_lens, [0]), True)[0], torch.bfloat16, "the target alone")
    everyone = [1, 0] + list(range(2, 10))
    tiles, rows = run(everyone, True)
    assert tiles == ["2"], f"batch_invariant beside a 2048-token prompt: consumer warpgroups {tiles}"
    assert torch.equal(bits(rows), bits(alone)), "the target's bits differ beside a 2048-token prompt"
    tiles, _ = run(everyone, False)
    assert tiles == ["3"], f"without batch_invariant: consumer warpgroups {tiles}, expected 3"


# Shapes of quantized caches' batch-invariant walks: (target_len, target_q,
# page, head_dim, group) of the target (2 KV heads). The batch-invariant plan
# cuts splits of max(ceil(pages / 32), ceil(256 / page)) pages
# (decode_splits.h, invariant_decode_plan).
QUANT_SHAPES = {
    # pages of 16: 16 pages a split, 188 pages in 12 splits.
    "page16": (3001, 1, 16, 128, 4),
    # a group of 7 (14 query heads), d 64 (the smallest tile dim): 79 pages, 20 splits.
    "group7-d64": (5000, 1, 64, 64, 7),
    # d 256 (partials and combine: no merge in the decode block), a verify step
    # of 16 queries (64 packed rows on the small tile, which the group picks).
    "d256-verify16": (2048, 16, 32, 256, 4),
    # one position past the fourth 256-position split (pages of 64): the fifth
    # split holds that position alone, which only the last of the 4 queries sees.
    "split-boundary": (1025, 4, 64, 128, 4),
}


@gpu
@pytest.mark.parametrize("shape", QUANT_SHAPES)
@pytest.mark.parametrize("cache", ["int8", "fp8 tensor", "fp8 vector"])
def test_batch_invariant_quantized_shapes_gpu(cache, shape, seed):
    """Quantized caches over more shapes (QUANT_SHAPES): pages of 16, a group
    that is not a power of two at d 64, d 256 with a verify step of 16
    queries, a length one position past a split boundary. The target's bits
    are the same in every step of steps() and within 6 ulps of float64
    (test_int8_gpu.ULPS: the kernels round q * k_smooth and p * v_scale)."""
    need_path("attention")
    target_len, target_q, page, head_dim, group = QUANT_SHAPES[shape]
    cache_dtype = torch.int8 if cache == "int8" else torch.float8_e4m3fn
    kind = "tensor" if cache == "fp8 tensor" else "vector"
    p, q_lens = universe(target_len, target_q, torch.bfloat16, "cuda", seed, group=group, head_dim=head_dim,
                         page=page, cache_dtype=cache_dtype, scale_kind=kind)
    check_invariant(p, q_lens, seed, torch.bfloat16, ulps=6.0)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_invariant_variants(device, seed):
    """A sliding window, soft-cap and sinks (gpt-oss / Gemma 2 style layers)."""
    if device == "cuda":
        need_path("attention")
    p, q_lens = universe(3001, 1, torch.bfloat16, device, seed)
    sinks = torch.randn(p.q.shape[1], device=device)
    check_invariant(p, q_lens, seed, torch.bfloat16, window_left=1500, logits_soft_cap=30.0, sinks=sinks)
