"""The Hopper prefill kernel's persistent schedule on the CPU: the host's plan
and every block's walk, from csrc/include/tileinfer/sm90/prefill_order.h
itself (compiled with the machine's C++ compiler into
tests/prefill_order_walk.cpp), over random varlen batches, mixed steps and
garbage query counts. The items a block takes are those the kernel's
next_item takes (a row tile with rows of its sequence's queries); the GPU
tests (test_hopper_prefill_gpu.py) check the outputs of the same order."""
from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from cpp_tool import compile_tool

ROOT = Path(__file__).resolve().parents[1]
K_PAIRS, K_SEQUENCES = 0, 1  # sm90::PrefillOrder


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    exe = compile_tool(tmp_path_factory, "prefill_order_walk.cpp")

    def run(batches):
        """batches: dicts of sms, heads, group, block_m, max_q_len, mixed (0, or the decode path's
        most queries a sequence: a mixed step), fits_l2, q (query counts).
        Returns per batch (plan dict, list of (block, item, seq, kv_head, row_tile))."""
        lines = [" ".join(str(v) for v in (b["sms"], b["heads"], b["group"], b["block_m"], b["max_q_len"],
                                           int(b["mixed"]), int(b["fits_l2"]), len(b["q"]), *b["q"]))
                 for b in batches]
        out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                             check=True).stdout.split("\n")
        results, pos = [], 0
        for _ in batches:
            _, order, tail, units, grid = out[pos].split()
            plan = dict(order=int(order), tail_pairs=int(tail), units=int(units), grid=int(grid))
            items = []
            pos += 1
            while out[pos] != "end":
                items.append(tuple(int(x) for x in out[pos].split()))
                pos += 1
            pos += 1
            results.append((plan, items))
        return results
    return run


MIXED_QUERIES = 16  # the attention op's mixed steps: sequences of up to 16 queries take the decode path


def row_tiles(q, group, block_m, mixed=0):
    """The row tiles prefill computes for a sequence of q queries (none where the decode path takes it)."""
    return 0 if 0 < q <= mixed else -(-q * group // block_m)


def random_batch(rng, garbage=False):
    n = rng.randint(1, 48)
    max_q_len = rng.choice([1, 16, 17, 100, 300, 1024, 2000, 3000])
    kinds = [0, 1, max_q_len, lambda: rng.randint(0, max_q_len), lambda: rng.randint(0, max(1, max_q_len // 8))]
    q = []
    for _ in range(n):
        k = rng.choice(kinds)
        q.append(k() if callable(k) else k)
    if garbage:  # counts past max_q_len (the kernel clamps only to the step's tokens)
        for s in rng.sample(range(n), k=max(1, n // 4)):
            q[s] = max_q_len + rng.randint(1, 5 * max_q_len + 200)
    # heads: the items' heads per sequence, group: the query heads of an item
    # (28 heads of 1: Qwen2.5-7B's query heads, an item each).
    return dict(sms=rng.choice([132, 114, 78, 7, 1]), heads=rng.choice([1, 2, 8, 28]), group=rng.choice([1, 4, 8]),
                block_m=rng.choice([128, 192, 64]), max_q_len=max_q_len,
                mixed=MIXED_QUERIES if rng.random() < 0.25 else 0, fits_l2=rng.random() < 0.3, q=q)


def check_plan(b, plan):
    pairs = len(b["q"]) * b["heads"]
    assert plan["grid"] == min(plan["units"], b["sms"])
    if b["mixed"]:
        assert plan["order"] == K_SEQUENCES
        return
    assert plan["order"] == K_PAIRS
    assert 1 <= plan["tail_pairs"] <= pairs
    if b["fits_l2"]:
        assert plan["tail_pairs"] == pairs, "a batch that fits in L2 is all tail (heaviest first)"


@pytest.mark.parametrize("seed", range(4))
def test_every_item_once(walk, seed):
    """Each (sequence, head, row tile) with rows of the sequence's queries
    is taken exactly once over all blocks, and nothing else is; each block's
    item numbers grow (next_item's early exit relies on it)."""
    rng = random.Random(seed)
    batches = [random_batch(rng) for _ in range(60)]
    for b, (plan, items) in zip(batches, walk(batches)):
        check_plan(b, plan)
        want = sorted((s, h, t) for s, q in enumerate(b["q"]) for h in range(b["heads"])
                      for t in range(row_tiles(q, b["group"], b["block_m"], b["mixed"])))
        got = sorted((s, h, t) for _, _, s, h, t in items)
        assert got == want, f"batch {b}: {len(got)} items taken, {len(want)} expected"
        last = {}
        for blk, item, *_ in items:
            assert item > last.get(blk, -1), f"block {blk}: items do not grow"
            last[blk] = item


@pytest.mark.parametrize("seed", range(2))
def test_garbage_query_counts(walk, seed):
    """Query counts past max_q_len (device metadata cannot be checked): no
    item twice (two blocks writing the same rows), every row tile inside its
    sequence's queries, sequences and heads in range."""
    rng = random.Random(100 + seed)
    batches = [random_batch(rng, garbage=True) for _ in range(40)]
    for b, (plan, items) in zip(batches, walk(batches)):
        check_plan(b, plan)
        keys = [(s, h, t) for _, _, s, h, t in items]
        assert len(keys) == len(set(keys)), f"batch {b}: an item taken twice"
        for s, h, t in keys:
            assert 0 <= s < len(b["q"]) and 0 <= h < b["heads"]
            assert 0 <= t < row_tiles(b["q"][s], b["group"], b["block_m"], b["mixed"])


def test_doubles_spread_short_sequences(walk):
    """A 2k-query chunk beside 64 single queries (Qwen3-4B's 8 KV heads, group
    4, 132 SMs): the pairs' units start at their own offsets, so the single
    queries' items spread over the blocks instead of landing on the few that
    one stride reaches (33 of 132 when every pair's units started at 0)."""
    b = dict(sms=132, heads=8, group=4, block_m=128, max_q_len=2048, mixed=0, fits_l2=False, q=[2048] + [1] * 64)
    plan, items = walk([b])[0]
    singles = {blk for blk, _, s, _, _ in items if s > 0}
    assert plan["tail_pairs"] < 64 * 8, "the single queries should be mostly in the doubles"
    assert len(singles) >= 100, f"the single queries' items sit on {len(singles)} blocks"


def test_benchmark_model_matches(walk):
    """bench_prefill.item_counts (the model its per-item fit counts with)
    hands out the same items per block as the header, on uniform causal
    batches of Qwen3-4B heads, whether they fit in L2 or not, with even and
    odd row-tile counts."""
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_prefill

    def key_tiles(tokens, row_tile):  # 32 tokens a row tile, 128 keys a tile
        return -(-min(tokens, 32 * (row_tile + 1)) // 128)
    l2 = 60 << 20
    cases = [(1, 512), (1, 2048), (1, 8192), (16, 1024), (64, 256), (16, 512), (3, 1152), (1, 3456), (8, 4000),
             (16, 1000)]
    batches = [dict(sms=132, heads=8, group=4, block_m=128, max_q_len=t, mixed=0,
                    fits_l2=bench_prefill.kv_fits_l2(b, t, l2), q=[t] * b) for b, t in cases]
    for (b, t), batch, (plan, items) in zip(cases, batches, walk(batches)):
        tiles, counts = [0] * plan["grid"], [0] * plan["grid"]
        for blk, _, _, _, row_tile in items:
            tiles[blk] += key_tiles(t, row_tile)
            counts[blk] += 1
        assert bench_prefill.item_counts(b, t, 132, l2_bytes=l2) == (tiles, counts), f"{b} x {t}"
