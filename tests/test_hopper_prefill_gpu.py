"""GPU tests of the Hopper prefill kernel (csrc/include/tileinfer/sm90/), which
`prefill` picks for bf16 / fp16 queries, head dim 64, 128 or 256, a cache of
q's dtype (or an int8 / fp8 one at d <= 128), on a compute-capability 9.0
device. Its work items pack a KV head's whole group of query heads where the
group is a power of two, and take one query head each for other groups: the
group sizes below (1, 4, 8, and 32 / 128 for the largest query boxes; 3, 5, 7
an item per head) cover both.

Same oracle and bounds as tests/test_attention_gpu.py (op_helpers): float64
attention on the same inputs, within 4 ulps of each row's magnitude, lse
within 1e-4 relative; outputs poisoned with NaN first, so unwritten rows fail,
and rows of no sequence must stay untouched; cache slots that no row may read
hold NaN. Every head dim (the D fixture:
128, 64, 256) runs every test.

The first test checks (with the torch profiler) which kernel runs, so that a
build or a device without them cannot pass the rest on the tile kernel.
"""

import pytest
import torch

from op_helpers import (QUANT_KINDS, check_lse, check_out, exact_attention, has_cuda_kernel, hopper, kernels_run,
                        misalign_scales_, misaligned_copy, ops, poison_, poison_unowned_, prefill_consumers, run_prefill)
from tileinfer_attn.testing import make_problem

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float16]
WARP_SPECIALIZED = "sm90::prefill_kernel"
TILE = "attention_tile_kernel"
PER_HEAD = "TILEINFER_PREFILL_PER_HEAD"  # "1": an item per query head for every group


@pytest.fixture(params=[128, 64, 256], ids=["d128", "d64", "d256"])
def D(request):
    """The head dim; skips where the Hopper kernel cannot run."""
    if not has_cuda_kernel("prefill"):
        pytest.skip("this build has no CUDA kernel for tileinfer_attn::prefill")
    if not hopper():
        pytest.skip("the Hopper prefill kernel needs a compute-capability 9.0 (Hopper) device")
    return request.param


def check_all(p, causal, dtype, what, with_lse=True):
    """The kernel against float64, with NaN in every cache slot that no row
    may read (op_helpers.poison_unowned_; the oracle, which gathers whole
    pages, first)."""
    exact, exact_lse = exact_attention(p, causal)
    poison_unowned_(p)
    out, lse = run_prefill(p, causal, with_lse=with_lse)
    check_out(out, exact, dtype, what)
    if with_lse:
        check_lse(lse, exact_lse, dtype, what + " lse")
    return out, lse


@pytest.mark.parametrize("group", [4, 3])
def test_hopper_kernel_is_used(D, group, seed):
    """prefill of a bf16 prompt and a second sequence runs the Hopper kernel
    (items of a whole group for group 4, of one query head for group 3), and
    its result is within the bounds."""
    p = make_problem([300, 41], [300, 41], 2 * group, 2, D, 64, device=DEV, seed=seed)
    run_prefill(p, True)  # warm-up (and the shared-memory opt-in) outside the profile
    torch.cuda.synchronize()
    names, _ = kernels_run(lambda: check_all(p, True, torch.bfloat16, "Hopper prefill"))
    assert any(WARP_SPECIALIZED in n for n in names), (
        f"{WARP_SPECIALIZED} did not run (a build without sm_90a code? setup.py's default "
        f"TORCH_CUDA_ARCH_LIST is 9.0a); kernels seen: {sorted(set(names))}")


@pytest.mark.parametrize("kind", ["fp8-tensor", "fp8-vector", "int8"])
def test_quantized_cache_kernel(D, kind, seed):
    """A quantized cache (fp8 with per-tensor scales as vLLM lays them out,
    fp8 or int8 with per-vector scales) runs the warp-specialized kernel, its
    converter warps turning pages into fp16 tiles, at d 64 and 128; d 256
    the mma.sync tile kernel. Results within the quantized caches' 6 ulps
    (tests/test_int8_gpu.py covers them fully)."""
    p = make_problem([300, 41], [300, 41], 8, 2, D, 64, device=DEV, seed=seed, **QUANT_KINDS[kind])
    hopper_kernel = D <= 128
    kernel = WARP_SPECIALIZED if hopper_kernel else TILE
    run_prefill(p, True)  # warm-up (and the shared-memory opt-in) outside the profile
    torch.cuda.synchronize()
    names, (out, _) = kernels_run(lambda: run_prefill(p, True))
    assert any(kernel in n for n in names), f"{kernel} did not run; kernels seen: {sorted(set(names))}"
    exact, _ = exact_attention(p, True)
    check_out(out, exact, torch.bfloat16, f"{kind} prefill", ulps=6.0)


OWN_KV = "TILEINFER_PREFILL_OWN_KV"  # "0": every tile of a quantized cache through the converter warps


def own_kv_both_ways(p, monkeypatch):
    """prefill (causal) over p's quantized cache with the step's own tiles from
    their fp16 rows (sm90/prefill_own_kv.cuh, the default) and with every
    tile through the converters: both outputs."""
    monkeypatch.setenv(OWN_KV, "0")
    converted, _ = run_prefill(p, True)
    monkeypatch.delenv(OWN_KV)
    own, _ = run_prefill(p, True)
    return own, converted


@pytest.mark.parametrize("kind", ["fp8-tensor", "fp8-vector", "int8"])
@pytest.mark.parametrize("lens,q_lens", [([300, 41, 700], [300, 41, 700]), ([900, 300, 57, 40], [200, 300, 20, 0])],
                         ids=["prompts", "chunks after prefixes"])
def test_quantized_own_tiles_same_bits(D, kind, lens, q_lens, seed, monkeypatch):
    """A quantized cache's prefill takes the tiles of the step's own keys and
    values (all of a fresh prompt's; a chunk's own beside its prefix's, which
    go through the converters, in one item) from one pass that turns them
    into fp16 first: the bits of every tile through the converters
    (TILEINFER_PREFILL_OWN_KV=0), with NaN in every slot no row may read,
    within the quantized caches' 6 ulps of float64."""
    if D > 128:
        pytest.skip("a quantized cache at d 256 takes the mma.sync tile kernel")
    p = make_problem(lens, q_lens, 8, 2, D, 16 if len(lens) > 3 else 64, device=DEV, seed=seed, **QUANT_KINDS[kind])
    exact, _ = exact_attention(p, True)
    poison_unowned_(p)
    own, converted = own_kv_both_ways(p, monkeypatch)
    assert torch.equal(own.view(torch.int16), converted.view(torch.int16)), "own tiles: other bits than converted"
    check_out(own, exact, torch.bfloat16, f"{kind} prefill, own tiles", ulps=6.0)


PREFIX_MB = "TILEINFER_PREFILL_PREFIX_MB"  # room for prefix rows (MiB; "0": none)
# Two chunks of more queries than an item holds (200 and 600 at group 4; 700
# and 1900 prefix positions), a fresh prompt, a chunk of fewer queries (20)
# and a sequence without queries: seq_lens, then query counts.
PREFIX_CHUNKS = ([900, 300, 2500, 57, 40], [200, 300, 600, 20, 0])


@pytest.mark.parametrize("kind", ["fp8-tensor", "fp8-vector", "int8"])
@pytest.mark.parametrize("room", ["0", "1", None], ids=["no room", "room for one", "default room"])
def test_quantized_prefix_rows_same_bits(D, kind, room, seed, monkeypatch):
    """Chunks after cached prefixes whose prefix positions the own-keys pass
    turns into fp16 prefix rows (sm90/prefill_own_kv.cuh), while they fit the
    room: chunks of more queries than an item holds (200 and 600 at group
    4), one of fewer (20, through the converters), a fresh prompt (own rows)
    and a sequence without queries; with 1 MiB of room only the first
    chunk's 700 prefix positions fit (the second's 1900 do not, at d 64 or
    128). Prefixes end inside a tile (that tile is converted). The bits of
    every tile through the converters, NaN in every slot no row may read,
    within 6 ulps of float64."""
    if D > 128:
        pytest.skip("a quantized cache at d 256 takes the mma.sync tile kernel")
    p = make_problem(*PREFIX_CHUNKS, 8, 2, D, 16, device=DEV, seed=seed, **QUANT_KINDS[kind])
    exact, _ = exact_attention(p, True)
    poison_unowned_(p)
    if room is not None:
        monkeypatch.setenv(PREFIX_MB, room)
    own, converted = own_kv_both_ways(p, monkeypatch)
    assert torch.equal(own.view(torch.int16), converted.view(torch.int16)), "prefix rows: other bits than converted"
    check_out(own, exact, torch.bfloat16, f"{kind} prefill, prefix rows (room {room} MiB)", ulps=6.0)


NAN_ROWS = "TILEINFER_PREFILL_NAN_ROWS"  # a test hook: NaN in the pass's token rows (1), prefix rows (2)


@pytest.mark.parametrize("kind", ["fp8-tensor", "fp8-vector", "int8"])
@pytest.mark.parametrize("room", [None, "1"], ids=["default room", "1 MiB"])
def test_quantized_pass_rows_are_read(D, kind, room, seed, monkeypatch):
    """The outputs that read the own-keys pass's rows, seen by filling them
    with NaN (TILEINFER_PREFILL_NAN_ROWS), so that the same-bits tests above
    cannot pass with the rows never read: token rows reach every output of
    a fresh prompt; prefix rows reach every output of the chunks whose
    prefixes fit the room (both by default, the first alone in 1 MiB), and
    no other output, whose bits stay those of the step without NaN."""
    if D > 128:
        pytest.skip("a quantized cache at d 256 takes the mma.sync tile kernel")
    p = make_problem(*PREFIX_CHUNKS, 8, 2, D, 16, device=DEV, seed=seed, **QUANT_KINDS[kind])
    poison_unowned_(p)
    if room is not None:
        monkeypatch.setenv(PREFIX_MB, room)
    clean, _ = run_prefill(p, True)
    cu = p.cu_seqlens_q.tolist()
    tokens = [slice(cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    assert not clean.isnan().any(), "NaN without the hook"  # (so the NaN below come from the rows)
    monkeypatch.setenv(NAN_ROWS, "1")
    out, _ = run_prefill(p, True)
    assert out[tokens[1]].isnan().any(-1).all(), "token rows: the fresh prompt did not read them"
    monkeypatch.setenv(NAN_ROWS, "2")
    out, _ = run_prefill(p, True)
    read = [True, False, room is None, False, False]  # (the second chunk's 1900 positions need > 1 MiB)
    for i, r in enumerate(read):
        if r:
            assert out[tokens[i]].isnan().any(-1).all(), f"prefix rows: sequence {i} did not read them"
        else:
            assert torch.equal(out[tokens[i]].view(torch.int16), clean[tokens[i]].view(torch.int16)), (
                f"prefix rows: sequence {i} read rows not its own, or other bits")


def test_prefix_room_bad_value(monkeypatch):
    if not (has_cuda_kernel("prefill") and hopper()):
        pytest.skip("the room is read on the Hopper prefill kernel's path")
    p = make_problem([300], [100], 8, 2, 128, 64, device=DEV, seed=0, **QUANT_KINDS["int8"])
    monkeypatch.setenv(PREFIX_MB, "-1")
    with pytest.raises(RuntimeError, match="TILEINFER_PREFILL_PREFIX_MB must be an integer from 0 to"):
        run_prefill(p, True)


@pytest.mark.parametrize("case", ["overlapping query ranges", "more queries than positions"])
def test_quantized_own_tiles_malformed_metadata(D, case, seed, monkeypatch):
    """Metadata where a token's row is not one sequence position's
    (cu_seqlens_q decreasing: query ranges overlap), and where a sequence has
    more queries than positions: no fault, and the bits of every tile
    through the converters (the pass's check sends the first to them; in the
    second the tokens past the positions are never keys)."""
    if D > 128:
        pytest.skip("a quantized cache at d 256 takes the mma.sync tile kernel")
    p = make_problem([300, 141, 700], [300, 141, 700], 8, 2, D, 64, device=DEV, seed=seed, **QUANT_KINDS["int8"])
    if case == "overlapping query ranges":
        p.cu_seqlens_q.copy_(torch.tensor([0, 300, 200, 1141], dtype=torch.int32))
    else:
        p.seq_lens[1] = 100
    own, converted = own_kv_both_ways(p, monkeypatch)
    torch.cuda.synchronize()
    # (tokens 200-299 are rows of two sequences: whichever item stores last)
    rows = torch.cat([torch.arange(200), torch.arange(300, 1141)]).to(DEV)
    assert torch.equal(own[rows].view(torch.int16), converted[rows].view(torch.int16)), (
        f"{case}: other bits than converted")


@pytest.mark.parametrize("kind", ["fp8-tensor", "fp8-vector", "int8"])
def test_quantized_cache_item_per_head(D, kind, seed):
    """A quantized cache with a group that is not a power of two (3): the
    converter warps' kernel with an item per query head, at d 64 and 128;
    within the quantized caches' 6 ulps."""
    if D > 128:
        pytest.skip("a quantized cache at d 256 takes the mma.sync tile kernel")
    p = make_problem([300, 41, 700], [300, 41, 129], 6, 2, D, 64, device=DEV, seed=seed, **QUANT_KINDS[kind])
    exact, _ = exact_attention(p, True)
    poison_unowned_(p)
    names, (out, _) = kernels_run(lambda: run_prefill(p, True))
    assert any(WARP_SPECIALIZED in n for n in names), f"kernels seen: {sorted(set(names))}"
    check_out(out, exact, torch.bfloat16, f"{kind} prefill, an item per query head", ulps=6.0)


@pytest.mark.parametrize("value", ["2", "yes"])
def test_per_head_bad_value(D, value, monkeypatch):
    monkeypatch.setenv(PER_HEAD, value)
    p = make_problem([100], [100], 8, 2, D, 64, device=DEV, seed=0)
    with pytest.raises(RuntimeError, match="TILEINFER_PREFILL_PER_HEAD must be 0 or 1"):
        run_prefill(p, True)


@pytest.mark.parametrize("kind, what", [("fp8-vector", "scales"), ("int8", "scales"), ("fp8-tensor", "k_smooth"),
                                        ("int8", "k_smooth")])
def test_misaligned_scales_take_the_tile_kernel(kind, what, seed):
    """Per-vector scales that start 4 bytes past a 16-byte boundary (a
    contiguous view into a larger buffer: valid input) cannot be bulk-copied,
    nor can such a k_smooth be loaded 16 bytes at a time: prefill takes the
    mma.sync tile kernel for them, and stays right."""
    if not has_cuda_kernel("prefill"):
        pytest.skip("this build has no CUDA kernel for tileinfer_attn::prefill")
    if not hopper():
        pytest.skip("the kernel choice tested here is Hopper's")
    p = make_problem([300, 41], [300, 41], 8, 2, 128, 64, device=DEV, seed=seed,
                     **QUANT_KINDS[kind])
    if what == "scales":
        misalign_scales_(p)
    else:
        p.k_smooth = misaligned_copy(p.k_smooth)
    run_prefill(p, True)  # warm-up outside the profile
    torch.cuda.synchronize()
    names, (out, _) = kernels_run(lambda: run_prefill(p, True))
    assert any(TILE in n for n in names), f"{TILE} did not run; kernels seen: {sorted(set(names))}"
    exact, _ = exact_attention(p, True)
    check_out(out, exact, torch.bfloat16, f"{kind} prefill, misaligned {what}", ulps=6.0)


@pytest.mark.parametrize("group, per_head", [(4, "0"), (4, "1"), (7, "0")],
                         ids=["group4", "group4-per-head", "group7"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 128])
def test_persistent_scheduler_covers_every_row(D, page, causal, group, per_head, seed, monkeypatch):
    """The warp-specialized kernel's persistent grid (at most one block per SM)
    walks every (row tile, sequence, KV head) item once: a random varlen batch
    of many sequences (empty ones, single positions, chunks, prompts past a
    few tiles) has more items than blocks, and more (sequence, KV head) pairs
    than the scheduler's tail, so most pairs go by doubles of row tiles R - 1 -
    j and j of their own R; every row right, padding untouched. Group 7
    (and group 4 with TILEINFER_PREFILL_PER_HEAD=1) takes an item per query
    head: its pairs are (sequence, query head)."""
    monkeypatch.setenv(PER_HEAD, per_head)
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(0, 700, (61,), generator=g).tolist() + [0, 1, 2000]
    q_lens = [int(torch.randint(0, L + 1, (1,), generator=g)) if i % 3 else L for i, L in enumerate(seq_lens)]
    p = make_problem(seq_lens, q_lens, 2 * group, 2, D, page, device=DEV, seed=seed)
    pad = torch.randn(3, *p.q.shape[1:], device=DEV).to(p.q.dtype)
    p.q = torch.cat([p.q, pad])
    exact, exact_lse = exact_attention(p, causal)
    poison_unowned_(p)
    names, (out, lse) = kernels_run(lambda: run_prefill(p, causal))
    assert any(WARP_SPECIALIZED in n for n in names), f"kernels seen: {sorted(set(names))}"
    n = int(p.cu_seqlens_q[-1])
    check_out(out[:n], exact[:n], torch.bfloat16, f"scheduler coverage page {page}")
    check_lse(lse[:n], exact_lse[:n], torch.bfloat16, f"scheduler coverage page {page} lse")
    assert torch.isnan(out[n:]).all() and torch.isnan(lse[n:]).all(), "rows of no sequence were written"


@pytest.mark.parametrize("group, per_head", [(1, "0"), (3, "0"), (4, "0"), (4, "1"), (5, "0"), (7, "0"), (8, "0")],
                         ids=["group1", "group3", "group4", "group4-per-head", "group5", "group7", "group8"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hopper_prefill(D, dtype, page, causal, group, per_head, seed, monkeypatch):
    """Lengths 1, page-1, page, page+1, several pages and a few hundred; full
    prompts and chunked prefill (fewer queries than positions); 2 KV heads.
    Groups 3, 5, 7 take an item per query head, and group 4 too with
    TILEINFER_PREFILL_PER_HEAD=1; every case checks that the Hopper kernel ran."""
    monkeypatch.setenv(PER_HEAD, per_head)
    seq_lens = [1, page - 1, page, page + 1, 3 * page + 7, 517]
    q_lens = [1, page - 1, page // 2, 1, 2 * page + 3, 517]
    p = make_problem(seq_lens, q_lens, 2 * group, 2, D, page, dtype=dtype, device=DEV, seed=seed)
    run_prefill(p, causal)  # warm-up (and the shared-memory opt-in) outside the profile
    torch.cuda.synchronize()
    names, _ = kernels_run(lambda: check_all(p, causal, dtype, f"Hopper prefill page {page} group {group} "
                                                               f"per head {per_head} causal={causal}"))
    assert any(WARP_SPECIALIZED in n for n in names), f"kernels seen: {sorted(set(names))}"


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 128])
def test_warp_specialized_large_groups(D, page, causal, group, seed):
    """Groups up to the 128-row query tile: the query box then holds 128 /
    group tokens (4, 2 and 1), so a tile's rows span a few queries, each
    consumer warpgroup's 64 rows two queries, one or part of one; one KV
    head. A group past the tile (256) takes an item per query head. (At d 64
    a step with at least two 192-row items per SM takes those instead,
    prefill.cu's prefill_three_consumers: on 132 SMs, group 128 at page 128
    and group 256 here.)"""
    seq_lens = [1, page + 1, 3 * page + 7, 300]
    q_lens = [1, page + 1, 5, 300]
    p = make_problem(seq_lens, q_lens, group, 1, D, page, device=DEV, seed=seed)
    check_all(p, causal, torch.bfloat16, f"warp-specialized prefill page {page} group {group} causal={causal}")


@pytest.mark.parametrize("group", [3, 4])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hopper_prefill_long(D, dtype, causal, group, seed):
    """A few thousand positions: a 3000-query prompt, a chunk of 333 queries at
    the end of 4000 positions, and a short one in the same launch."""
    p = make_problem([3000, 4000, 70], [3000, 333, 70], 2 * group, 2, D, 64, dtype=dtype, device=DEV, seed=seed)
    check_all(p, causal, dtype, f"Hopper prefill long group {group} causal={causal}")


CONSUMERS = "TILEINFER_PREFILL_CONSUMERS"  # "2" or "3": that d 64 kernel for every step
THREE_CONSUMER_MIN_WINDOW = 1024  # prefill.cu's kThreeConsumerMinWindow


def three_consumers(num_seqs, hq, hkv, max_q_len, num_tokens, window_left=-1):
    """prefill.cu's prefill_three_consumers for a d 64 prefill (not batch-
    invariant, CONSUMERS unset): 192-row items where there are at least two
    per SM, counting every sequence at max_q_len but no more than the tokens
    fill, and no sliding window below THREE_CONSUMER_MIN_WINDOW keys."""
    if 0 <= window_left < THREE_CONSUMER_MIN_WINDOW:
        return False
    group = hq // hkv
    item_group = group if group & (group - 1) == 0 and 192 % group == 0 else 1
    row_tiles = min(num_seqs * -(-item_group * max_q_len // 192), -(-item_group * num_tokens // 192))
    items = (hq // item_group) * row_tiles
    return items >= 2 * torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("q_len", [512, 2048])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_d64_item_rows(dtype, causal, q_len, seed):
    """d 64 takes 192-row items (three consumer warpgroups) where a step has
    at least two per SM, 128-row items (two) below: a prompt of 512 and one
    of 2048 tokens beside one of 40, 32 / 8 heads (96 and 352 items of 192
    rows as the rule counts them), each against float64, and the kernel that
    ran, from its name's PrefillTile<..., consumers>."""
    if not (has_cuda_kernel("prefill") and hopper()):
        pytest.skip("the Hopper prefill kernel needs a compute-capability 9.0 device and a CUDA build")
    page = 128 if dtype == torch.bfloat16 else 16
    p = make_problem([q_len + 5, 40], [q_len, 40], 32, 8, 64, page, dtype=dtype, device=DEV, seed=seed)
    exact, exact_lse = exact_attention(p, causal)
    poison_unowned_(p)
    names, (out, lse) = kernels_run(lambda: run_prefill(p, causal, with_lse=True))
    what = f"d 64 prompt of {q_len} causal={causal}"
    check_out(out, exact, dtype, what)
    check_lse(lse, exact_lse, dtype, what + " lse")
    tiles = prefill_consumers(names)
    expected = "3" if three_consumers(2, 32, 8, q_len, q_len + 40) else "2"
    assert tiles == [expected], f"{what}: consumer warpgroups {tiles}, expected {expected}; kernels {set(names)}"


# The d 64 kernels of three consumer warpgroups with each variant's code
# (CONSUMERS=3 where the rule keeps two): gpt-oss's 128-key window with
# sinks (masked tiles throughout), a soft-cap
# on bf16's fixed-offset softmax and on fp16's running maximum, Gemma 2's
# window with a cap, and scale < 0. (name, variants, q's dtype)
THREE_CONSUMER_CASES = [
    ("window 128 + sinks", dict(window_left=127, sinks=True), torch.bfloat16),
    ("soft-cap 30", dict(logits_soft_cap=30.0), torch.bfloat16),
    ("soft-cap 30 + sinks", dict(logits_soft_cap=30.0, sinks=True), torch.float16),
    ("soft-cap 4 + window 300", dict(logits_soft_cap=4.0, window_left=300), torch.bfloat16),
    ("scale -0.05", dict(scale=-0.05), torch.bfloat16),
]


@pytest.mark.parametrize("name,variants,dtype", THREE_CONSUMER_CASES, ids=[c[0] for c in THREE_CONSUMER_CASES])
def test_d64_three_consumers_variants(name, variants, dtype, seed, monkeypatch):
    """A 2048-token prompt beside one of 40 (64 / 8 heads, page 16: 696
    items of 192 rows as prefill_three_consumers counts them) with each of
    THREE_CONSUMER_CASES, against float64 with the same variants, and the
    kernel that ran (PrefillTile<..., 3>; a window below the rule's minimum
    gets it through CONSUMERS=3)."""
    if not (has_cuda_kernel("prefill") and hopper()):
        pytest.skip("the Hopper prefill kernel needs a compute-capability 9.0 device and a CUDA build")
    p = make_problem([2048 + 5, 40], [2048, 40], 64, 8, 64, 16, dtype=dtype, device=DEV, seed=seed)
    kw = dict(variants)
    if kw.pop("sinks", False):
        kw["sinks"] = (torch.randn(64, generator=torch.Generator().manual_seed(seed)) * 2).to(DEV)
    if "scale" in kw:
        p.scale = kw.pop("scale")
    monkeypatch.delenv(CONSUMERS, raising=False)
    if not three_consumers(2, 64, 8, 2048, 2048 + 40, kw.get("window_left", -1)):
        monkeypatch.setenv(CONSUMERS, "3")
    exact, exact_lse = exact_attention(p, True, **kw)
    poison_unowned_(p, kw.get("window_left", -1))
    names, (out, lse) = kernels_run(lambda: run_prefill(p, True, with_lse=True, **kw))
    check_out(out, exact, dtype, f"d 64, three consumers, {name}")
    check_lse(lse, exact_lse, dtype, f"d 64, three consumers, {name} lse")
    tiles = prefill_consumers(names)
    assert tiles == ["3"], f"{name}: consumer warpgroups {tiles}, expected 3; kernels {set(names)}"


@pytest.mark.parametrize("window_left,forced", [(127, None), (-1, None), (-1, "2"), (127, "3")])
def test_d64_window_consumers(window_left, forced, seed, monkeypatch):
    """gpt-oss's shapes (64 / 8 heads of 64, a 2048-token prompt beside one
    of 40, sinks): its 128-key window keeps the two-consumer kernel, the same
    step without a window takes three (prefill_three_consumers), and
    CONSUMERS overrides the rule either way; each against float64."""
    if not (has_cuda_kernel("prefill") and hopper()):
        pytest.skip("the Hopper prefill kernel needs a compute-capability 9.0 device and a CUDA build")
    p = make_problem([2048 + 5, 40], [2048, 40], 64, 8, 64, 16, device=DEV, seed=seed)
    sinks = (torch.randn(64, generator=torch.Generator().manual_seed(seed)) * 2).to(DEV)
    if forced is None:
        monkeypatch.delenv(CONSUMERS, raising=False)
        expected = "3" if three_consumers(2, 64, 8, 2048, 2048 + 40, window_left) else "2"
        assert expected == ("2" if window_left >= 0 else "3")
    else:
        monkeypatch.setenv(CONSUMERS, forced)
        expected = forced
    exact, _ = exact_attention(p, True, window_left=window_left, sinks=sinks)
    poison_unowned_(p, window_left)
    names, (out, _) = kernels_run(lambda: run_prefill(p, True, window_left=window_left, sinks=sinks))
    what = f"d 64 window {window_left}, {CONSUMERS}={forced}"
    check_out(out, exact, torch.bfloat16, what)
    tiles = prefill_consumers(names)
    assert tiles == [expected], f"{what}: consumer warpgroups {tiles}, expected {expected}; kernels {set(names)}"


@pytest.mark.parametrize("value", ["4", "auto"])
def test_consumers_bad_value(value, monkeypatch):
    if not (has_cuda_kernel("prefill") and hopper()):
        pytest.skip("the consumer count is the Hopper d 64 kernel's")
    monkeypatch.setenv(CONSUMERS, value)
    p = make_problem([100], [100], 8, 2, 64, 64, device=DEV, seed=0)
    with pytest.raises(RuntimeError, match="TILEINFER_PREFILL_CONSUMERS must be 2 or 3"):
        run_prefill(p, True)


@pytest.mark.parametrize("page", [16, 128])
def test_hopper_prefill_long_pages(D, page, seed):
    p = make_problem([2500, 129], [2500, 129], 8, 2, D, page, device=DEV, seed=seed)
    check_all(p, True, torch.bfloat16, f"Hopper prefill long page {page}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hopper_prefill_without_lse(D, dtype, seed):
    p = make_problem([300, 45], [120, 45], 8, 2, D, 32, dtype=dtype, device=DEV, seed=seed)
    check_all(p, True, dtype, "Hopper prefill without lse", with_lse=False)


def test_hopper_prefill_negative_scale(D, seed):
    """scale <= 0: the scores are scaled before the softmax instead of in exp2."""
    p = make_problem([200, 64], [200, 10], 8, 2, D, 64, device=DEV, seed=seed)
    p.scale = -0.05
    check_all(p, True, torch.bfloat16, "Hopper prefill negative scale")


def test_hopper_prefill_strided_q(D, seed):
    """q as the head slice of a fused qkv tensor (token stride != heads * d)."""
    p = make_problem([300, 77], [300, 5], 8, 2, D, 64, device=DEV, seed=seed)
    t, h, d = p.q.shape
    qkv = torch.randn(t, h + 4, d, device=DEV).to(p.q.dtype)
    qkv[:, :h] = p.q
    p.q = qkv[:, :h]
    assert not p.q.is_contiguous()
    check_all(p, True, torch.bfloat16, "Hopper prefill strided q")


@pytest.mark.parametrize("group", [4, 128])
def test_hopper_prefill_strided_out(D, group, seed):
    """out as a view of some heads and columns of a larger buffer (token and
    head strides past the rows, columns past the head dim): rows right, and
    every element outside the view still the poison. Group 128 packs 128
    heads of one token into a row tile (at d 64 too: this step has fewer
    than two 192-row items per SM, so it keeps 128-row items)."""
    hkv = 2 if group == 4 else 1
    p = make_problem([300, 77], [300, 5], group * hkv, hkv, D, 64, device=DEV, seed=seed)
    t, h, d = p.q.shape
    buf = poison_(torch.empty(t, h + 3, d + 8, dtype=p.q.dtype, device=DEV))
    out = buf[:, 1:h + 1, :d]
    ops.prefill(out, None, *p.args(), p.scale, True)
    exact, _ = exact_attention(p, True)
    check_out(out, exact, torch.bfloat16, "Hopper prefill strided out")
    rest = buf.clone()
    rest[:, 1:h + 1, :d] = 0
    assert torch.isnan(rest[:, 0]).all() and torch.isnan(rest[:, h + 1:]).all(), "write outside the out view's heads"
    assert torch.isnan(rest[:, :, d:]).all(), "write past the out view's head dim"


def test_hopper_prefill_padding_untouched(D, seed):
    """Padded batch slots (seq_lens 0, no queries), padding tokens past
    cu_seqlens_q[-1], and guard rows around out / lse: real rows right and
    finite, every other element still the poison."""
    p = make_problem([300, 0, 45, 0], [200, 0, 45, 0], 8, 2, D, 32, device=DEV, seed=seed)
    pad = torch.randn(5, *p.q.shape[1:], device=DEV).to(p.q.dtype)
    p.q = torch.cat([p.q, pad])
    guard = 3
    out, lse, big, big_lse = run_prefill(p, True, guard=guard)
    n = int(p.cu_seqlens_q[-1])
    exact, exact_lse = exact_attention(p, True)
    check_out(out[:n], exact[:n], torch.bfloat16, "Hopper prefill padded")
    check_lse(lse[:n], exact_lse[:n], torch.bfloat16, "Hopper prefill padded lse")
    assert torch.isnan(out[n:]).all() and torch.isnan(lse[n:]).all(), "rows of no sequence were written"
    assert torch.isnan(big[:guard]).all() and torch.isnan(big[-guard:]).all(), "write outside out"
    assert torch.isnan(big_lse[:guard]).all() and torch.isnan(big_lse[-guard:]).all(), "write outside lse"


def test_hopper_prefill_rows_that_see_nothing(D, seed):
    """A sequence whose every page id is bad: out 0, lse -inf, no NaN."""
    p = make_problem([100, 90], [100, 30], 8, 2, D, 16, device=DEV, seed=seed)
    p.block_tables[1] = -1
    out, lse = run_prefill(p, True)
    exact, exact_lse = exact_attention(p, True)
    check_out(out, exact, torch.bfloat16, "Hopper prefill all pages bad")
    check_lse(lse, exact_lse, torch.bfloat16, "Hopper prefill all pages bad lse")
    assert torch.all(out[100:] == 0) and torch.all(lse[100:] == float("-inf"))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page", [16, 64])
def test_hopper_prefill_bad_pages(D, page, causal, seed):
    """Out-of-range and negative page ids among used pages, a seq_len beyond
    what the table holds, a negative seq_len: no fault, finite rows, the
    reference's reading (bad pages skipped, lengths clamped), nothing written
    outside out / lse."""
    p = make_problem([700, 400, 3 * page + 1, 20], [300, 3, 20, 1], 8, 2, D, page, device=DEV, seed=seed)
    num_pages = p.k_cache.shape[0]
    bt, sl = p.block_tables, p.seq_lens
    bt[0, 1] = num_pages + 5
    bt[0, 4] = 2**31 - 1
    bt[1, 0] = -3
    bt[1, 5] = -(2**31)
    sl[2] = bt.shape[1] * page + 1000  # clamped to the table (whose extra entries point at other pages)
    sl[3] = -7
    guard = 2
    out, lse, big, big_lse = run_prefill(p, causal, guard=guard)
    torch.cuda.synchronize()  # a fault would raise here
    exact, exact_lse = exact_attention(p, causal)
    check_out(out, exact, torch.bfloat16, "Hopper prefill with bad metadata")
    check_lse(lse, exact_lse, torch.bfloat16, "Hopper prefill with bad metadata lse")
    assert torch.isnan(big[:guard]).all() and torch.isnan(big[-guard:]).all(), "write outside out"
    assert torch.isnan(big_lse[:guard]).all() and torch.isnan(big_lse[-guard:]).all(), "write outside lse"
    # The context survives: a normal case is still right.
    q = make_problem([100, 33], [100, 33], 8, 2, D, 16, device=DEV, seed=seed + 1)
    check_all(q, True, torch.bfloat16, "normal case after bad metadata")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hopper_prefill_deterministic(D, dtype, seed):
    """Same inputs, same bits, run to run."""
    p = make_problem([2000, 3000, 77, 1000], [600, 1, 77, 1000], 16, 4, D, 64, dtype=dtype, device=DEV, seed=seed)
    a, a_lse = run_prefill(p, True)
    b, b_lse = run_prefill(p, True)
    assert torch.isfinite(a).all()
    assert torch.equal(a, b) and torch.equal(a_lse, b_lse), "two runs gave different bits"


def test_hopper_prefill_other_shapes_unchanged(D, seed):
    """The kernel prefill picks next to the Hopper kernel's shapes, and the
    results: head dim 256 in fp16 takes the Hopper kernel; fp32 queries and an
    int8 cache at head dim 256 take the tile kernel. All stay right."""
    for d, dtype, int8, hopper_kernel in ((256, torch.float16, False, True), (D, torch.float32, False, False),
                                  (256, torch.bfloat16, True, False)):
        p = make_problem([130, 40], [130, 40], 8, 2, d, 64, dtype=dtype, device=DEV, seed=seed, int8=int8)
        run_prefill(p, True)  # warm-up outside the profile
        names, (out, _) = kernels_run(lambda: run_prefill(p, True))
        what = f"d {d} {dtype} (int8 cache: {int8})"
        hopper_ran = any(WARP_SPECIALIZED in n for n in names)
        assert hopper_ran == hopper_kernel, f"{what}: the Hopper kernel ran: {hopper_ran}"
        exact, _ = exact_attention(p, True)
        # int8: 6 ulps, the bound of tests/test_int8_gpu.py (which says why)
        check_out(out, exact, dtype, what, ulps=6.0 if int8 else 4.0)
