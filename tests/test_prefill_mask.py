"""Which key tiles the Hopper prefill kernel masks (MaskedTiles, worked out
once per item) against the per-tile rule, on the CPU: a tile needs the
per-score test when it holds the item's key end, (causal) a key past the
warpgroup's first query, or a key before the thread's later row's window;
rows of no query have position INT_MAX. The GPU tests check the outputs."""
from __future__ import annotations

import random
import subprocess

import pytest

from cpp_tool import compile_tool

INT_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def masked_tiles(tmp_path_factory):
    exe = compile_tool(tmp_path_factory, "prefill_masked_tiles.cpp")

    def run(cases):
        lines = "\n".join(" ".join(str(int(v)) for v in c) for c in cases) + "\n"
        out = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, check=True).stdout.split()
        return [(int(out[2 * i]), int(out[2 * i + 1])) for i in range(len(cases))]
    return run


def needs_mask(bn, key_begin, key_end, causal, qmin, lo_last, i):
    tile_pos = key_begin + i * bn
    return tile_pos + bn > key_end or (causal and tile_pos + bn - 1 > qmin) or tile_pos < lo_last


def test_masked_tiles_match_the_per_tile_rule(masked_tiles):
    rng = random.Random(0)
    cases = []
    for _ in range(4000):
        bn = rng.choice([64, 128])
        key_begin = rng.choice([0, rng.randint(0, 5000)])
        key_end = key_begin + rng.randint(1, 3000)
        causal = rng.random() < 0.5
        qmin = rng.choice([INT_MAX, rng.randint(0, key_end + 200), key_begin - rng.randint(1, 300)])
        window = rng.choice([None, 0, 1, 37, 130, 4096])
        qpos = rng.choice([INT_MAX, rng.randint(0, key_end + 200)])  # the later row: INT_MAX when padding
        lo_last = 0 if window is None else qpos - min(qpos, window)
        cases.append((bn, key_begin, key_end, causal, qmin, lo_last))
    for (bn, kb, ke, causal, qmin, lo), (frm, until) in zip(cases, masked_tiles(cases)):
        for i in range(-(-(ke - kb) // bn)):
            want = needs_mask(bn, kb, ke, causal, qmin, lo, i)
            assert (i >= frm or i < until) == want, (bn, kb, ke, causal, qmin, lo, i, frm, until)
