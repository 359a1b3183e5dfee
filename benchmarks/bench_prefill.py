"""Prefill benchmark: causal attention of fresh prompts over the paged cache,
our prefill op against its peers in the same run.

Shapes: Qwen3-4B attention (32 query heads, 8 KV heads, head dim 128, bf16,
page 64) at prompt lengths 512 / 2k / 8k / 16k (and 32k) for one sequence,
batches of 4 x 2k, 8 x 512 and 16 x 1k, a mixed batch of 1 x 8k + 31 x 256
(no SDPA peer: it needs equal lengths), and head dims 64, 80, 96 and 256
(64 and 256 also at 512 / 2k / 16k); groups that are not powers of two
(28 / 4, 40 / 8 heads); non-causal prompts ("full") at 2k, 8k and 16 x 1k.
--quick leaves out 32k, the other d 64 / 256 lengths, 28 / 4 heads over 16 x
1k and the non-causal cases. Mixed steps: prompt
chunks beside single-query decodes through the attention op, against the
same chunks and decodes run alone, the same op with the parts one after the
other and the prefill op over the whole step; prompt batches without decodes
through the attention op, against the prefill op. Per-item
cost: uniform batches of 1-64 prompts, each launch's time (ours and cuDNN's)
fitted to the key tiles and items of our busiest block. FLOPs: 2 * 2 * L * L / 2 * d * Hq
per causal prompt (half the query-key pairs), twice that non-causal; TFLOP/s against the bf16 GEMM rate
measured in this run.

Peers: torch SDPA with the cuDNN and the flash backend on a contiguous cache,
gather-pages-then-SDPA(flash), the eager reference (small sizes only: it is
slow), FlashInfer's paged prefill if it imports.

Writes benchmarks/results/prefill.json and prefill.png.

    python3 benchmarks/bench_prefill.py [--quick] [--only 8k] [--out-dir DIR]
    python3 benchmarks/bench_prefill.py --only chunk --beside-sms 48,32,64   # mixed steps, three SM counts
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_peers as ap  # noqa: E402
import common  # noqa: E402

NAME = "prefill"
QWEN3 = dict(hq=32, hkv=8, d=128)

# (label, prompt lengths, head config). The eager reference runs where the
# total prompt length is at most EAGER_MAX_TOKENS.
CASES = [
    ("1x512", [512], QWEN3),
    ("1x2k", [2048], QWEN3),
    ("1x8k", [8192], QWEN3),
    ("1x16k", [16384], QWEN3),
    ("4x2k", [2048] * 4, QWEN3),
    ("8x512", [512] * 8, QWEN3),
    ("16x1k", [1024] * 16, QWEN3),
    # Mixed lengths: SDPA on a contiguous cache needs equal lengths (skipped).
    ("1x8k+31x256", [8192] + [256] * 31, QWEN3),
    ("1x8k d64", [8192], dict(hq=32, hkv=8, d=64)),
    ("1x8k d256", [8192], dict(hq=32, hkv=8, d=256)),
    # Head dims on head dim 128's kernels (Phi-2-like 80, Phi-3-like 96).
    ("1x8k d80", [8192], dict(hq=32, hkv=8, d=80)),
    ("1x8k d96", [8192], dict(hq=32, hkv=8, d=96)),
    ("1x2k d96", [2048], dict(hq=32, hkv=8, d=96)),
    # Groups that are not powers of two (Qwen2.5-7B 28/4, Qwen2.5-14B 40/8):
    # an item per query head.
    ("28/4 1x8k", [8192], dict(hq=28, hkv=4, d=128)),
    ("40/8 1x8k", [8192], dict(hq=40, hkv=8, d=128)),
    ("28/4 16x1k", [1024] * 16, dict(hq=28, hkv=4, d=128)),
    # The full grid only: 32k, the other lengths at d 64 and 256, and
    # non-causal prompts ("full": every query sees every key, 2x the FLOPs).
    ("1x32k", [32768], QWEN3),
    *[(f"1x{n} d{d}", [t], dict(hq=32, hkv=8, d=d)) for d in (64, 256)
      for n, t in (("512", 512), ("2k", 2048), ("16k", 16384))],
    ("1x2k full", [2048], dict(QWEN3, causal=False)),
    ("1x8k full", [8192], dict(QWEN3, causal=False)),
    ("16x1k full", [1024] * 16, dict(QWEN3, causal=False)),
]
QUICK = {"1x512", "1x2k", "1x8k", "1x16k", "4x2k", "16x1k", "1x8k+31x256", "1x8k d64", "1x8k d256", "1x8k d80",
         "1x8k d96", "1x2k d96", "28/4 1x8k", "40/8 1x8k"}
EAGER_MAX_TOKENS = 2048
OURS = "tileinfer prefill"
# Our kernels timed in every case: (name, make, role). The op as shipped is
# "ours"; another of our kernels, timed for an A/B, is one more entry with role
# "dev" (its rows stay in the JSON and the printed table, out of README's plot
# and tables).
OUR_KERNELS = [(OURS, ap.ours_prefill, "ours")]
# Packing a group that is a power of two into one work item, against an item
# per query head (TILEINFER_PREFILL_PER_HEAD=1, a dev row) on a few cases.
PER_HEAD = "tileinfer prefill, an item per query head"
PER_HEAD_CASES = {"1x512", "8x512", "1x8k", "1x16k", "16x1k"}
# Outputs are compared with the first of these that ran (a sanity check).
BASE = ["sdpa flash (contiguous)", "sdpa cudnn (contiguous)", "eager reference"]


def run_case(label, lens, cfg, args, ceil, errors, status):
    d = cfg["d"]
    causal = cfg.get("causal", True)
    one = ap.make_sets(lens, lens, cfg["hq"], cfg["hkv"], d, n_sets=1)[0]
    n_sets = common.sets_for(ap.set_bytes(one), cap=16)
    sets = ap.make_sets(lens, lens, cfg["hq"], cfg["hkv"], d, n_sets=n_sets) if n_sets > 1 else [one]
    flops = ap.attention_flops(one, causal=causal)
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    impls = []
    for be in ("cudnn", "flash"):
        impls.append((f"sdpa {be} (contiguous)", lambda p, be=be: ap.sdpa_contiguous(p, be, causal), True))
    impls.append(("gather+sdpa flash", lambda p: ap.gather_then_sdpa(p, "flash", causal), True))
    if sum(lens) <= EAGER_MAX_TOKENS:
        impls.append(("eager reference", lambda p: ap.eager_reference(p, causal), False))
    if status["flashinfer"][0] and (not args.quick or d == 128):
        impls.append(("flashinfer paged (auto backend)", lambda p: ap.flashinfer_prefill(p, causal), True))
    # Ours last: a kernel that breaks the CUDA context then costs no peer of this case.
    if status["prefill"][0]:
        impls += [(name, lambda p, make=make: make(p, causal), True, role) for name, make, role in OUR_KERNELS]
        if label in PER_HEAD_CASES:
            impls.append((PER_HEAD, lambda p: ap.ours_prefill_per_head(p, causal), True, "dev"))

    def metrics(t):
        tflops = flops / t.seconds / 1e12
        return dict(tflops=tflops, pct_gemm=100 * tflops / ceil["gemm_tflops"] if ceil.get("gemm_tflops") else None)
    rows = ap.time_impls(label, impls, sets, errors, ours=OURS, base=BASE, metrics=metrics,
                         extra=dict(lens=lens, **cfg), **kw)
    del sets, one
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


# Mixed steps (a serving engine's chunked prefill): (label, prompt chunks as
# (queries, positions), decodes as (count, positions)), Qwen3-4B heads.
MIXED = [
    ("2k chunk + 64 decodes, 4k", [(2048, 4096)], (64, 4096)),
    ("512 chunk + 16 decodes, 2k", [(512, 2048)], (16, 2048)),
    ("2 x 2k chunks + 128 decodes, 4k", [(2048, 4096)] * 2, (128, 4096)),
    ("4k chunk + 256 decodes, 2k", [(4096, 4096)], (256, 2048)),
    ("1k chunk + 8 decodes, 32k", [(1024, 8192)], (8, 32768)),
    ("4 x 1k chunks + 32 decodes, 8k", [(1024, 8192)] * 4, (32, 8192)),
    # Prompts alone through the attention op: the step is its own part.
    ("16 x 1k prompts, no decode", [(1024, 1024)] * 16, (0, 0)),
    ("1 x 2k prompt, no decode", [(2048, 2048)], (0, 0)),
    ("1 x 512 prompt, no decode", [(512, 512)], (0, 0)),
]
MIXED_QUICK = {"2k chunk + 64 decodes, 4k", "512 chunk + 16 decodes, 2k", "1k chunk + 8 decodes, 32k",
               "16 x 1k prompts, no decode", "1 x 512 prompt, no decode"}


def run_mixed(label, chunks, decodes, args, errors):
    """One mixed step through the attention op, against its parts run alone
    (the chunks, the decodes: each through the attention op; none for a step
    without decodes), against the same op with the parts one after the other
    (TILEINFER_MIXED_DECODE_SMS=0) and against the prefill op over the whole
    step (the attention op's path for such a step before mixed steps). Graph
    replays."""
    n_dec, dec_ctx = decodes
    parts = {"mixed step": ([c for _, c in chunks] + [dec_ctx] * n_dec, [q for q, _ in chunks] + [1] * n_dec),
             "chunks alone": ([c for _, c in chunks], [q for q, _ in chunks]),
             "decodes alone": ([dec_ctx] * n_dec, [1] * n_dec)}
    if n_dec == 0:
        parts = {"mixed step": parts["mixed step"]}
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    times = {}
    for name, (lens, q_lens) in parts.items():
        one = ap.make_sets(lens, q_lens, **QWEN3, n_sets=1)[0]
        k = common.sets_for(ap.set_bytes(one), cap=8)
        sets = ap.make_sets(lens, q_lens, **QWEN3, n_sets=k) if k > 1 else [one]
        impls = [(name, ap.ours_attention, None)]
        if name == "mixed step":
            # The same op with the parts one after the other, and with other
            # counts of SMs left to the decodes at first (prefill.cu, "Mixed
            # steps beside their decodes"; the default leaves 16 / 33 of them).
            impls += [("in turn", ap.ours_attention, "0")]
            impls += [(f"beside {d}", ap.ours_attention, str(d)) for d in args.beside_sms]
            impls += [("prefill op, whole step", ap.ours_prefill, None)]
        for impl, make, decode_sms in impls:
            with common.environment_variable("TILEINFER_MIXED_DECODE_SMS", decode_sms):
                r = ap.timed(f"{label} {impl}", make, sets, True, errors, **kw)
            if r is not None:
                times[impl] = r[0].median_us
        del sets, one
        torch.cuda.empty_cache()
    t, a, b = times.get("mixed step"), times.get("chunks alone"), times.get("decodes alone")
    beside = {d: times.get(f"beside {d}") for d in args.beside_sms}
    row = dict(case=label, mixed_us=t, chunks_us=a, decodes_us=b, whole_prefill_us=times.get("prefill op, whole step"),
               in_turn_us=times.get("in turn"), beside_by_sms=beside, parts_sum_us=a + b if a and b else None)
    row["in_turn_over_mixed"] = row["in_turn_us"] / t if t and row["in_turn_us"] else None
    row["over_parts"] = t / row["parts_sum_us"] if t and row["parts_sum_us"] else None
    row["over_whole_prefill"] = t / row["whole_prefill_us"] if t and row["whole_prefill_us"] else None
    return [row]


# Per-layer variants against plain prefill of the same prompt: (label, prompt
# length, window_left, soft-cap, sinks, heads). Through the attention op. The
# gpt-oss cases (64 / 8 heads of 64: a 128-key window plus sinks, sinks alone)
# are timed on the d 64 kernels of two and of three consumer warpgroups as
# well (TILEINFER_PREFILL_CONSUMERS, dev columns), against the choice of
# prefill.cu's prefill_three_consumers.
GPT_OSS = dict(hq=64, hkv=8, d=64)
VARIANTS = [
    ("1x8k, window 4k", 8192, 4095, 0.0, False, QWEN3),
    ("1x8k, soft-cap 50", 8192, -1, 50.0, False, QWEN3),
    ("1x8k, window 4k + soft-cap 50", 8192, 4095, 50.0, False, QWEN3),
    ("1x8k, sinks", 8192, -1, 0.0, True, QWEN3),
    ("1x8k, window 4k + sinks", 8192, 4095, 0.0, True, QWEN3),
    ("gpt-oss 1x8k, window 128 + sinks", 8192, 127, 0.0, True, GPT_OSS),
    ("gpt-oss 1x8k, sinks", 8192, -1, 0.0, True, GPT_OSS),
    ("gpt-oss 1x2k, window 128 + sinks", 2048, 127, 0.0, True, GPT_OSS),
]


def run_variant(label, length, window, cap, sinks, heads, args, errors):
    """The variant against plain prefill on the same input sets (as many as the
    prefill cases rotate), in two alternating rounds: each keeps its faster
    round, since 1 x 8k's times move between two modes over a run. d 64: the
    variant on each consumer count as well."""
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    one = ap.make_sets([length], [length], **heads, n_sets=1)
    n_sets = common.sets_for(ap.set_bytes(one[0]), cap=16)
    sets = ap.make_sets([length], [length], **heads, n_sets=n_sets) if n_sets > 1 else one
    impls = [("variant", lambda p: ap.ours_attention_variant(p, window, cap, sinks)),
             ("plain", lambda p: ap.ours_attention(p))]
    if heads["d"] == 64:
        impls += [(f"{n} consumers", lambda p, n=n: ap.with_environment(
            "TILEINFER_PREFILL_CONSUMERS", str(n), ap.ours_attention_variant(p, window, cap, sinks))) for n in (2, 3)]
    times = {}
    for _ in range(2):
        for name, make in impls:
            r = ap.timed(f"{label} {name}", make, sets, True, errors, **kw)
            if r is not None:
                times[name] = min(times.get(name, float("inf")), r[0].median_us)
    del sets
    torch.cuda.empty_cache()
    v, plain = times.get("variant"), times.get("plain")
    return [dict(case=label, variant_us=v, plain_us=plain, over_plain=v / plain if v and plain else None,
                 two_consumers_us=times.get("2 consumers"), three_consumers_us=times.get("3 consumers"))]


# Per-item cost: uniform causal batches of Qwen3-4B prompts (batch, tokens)
# from one item per block to 32, ours and cuDNN timed in the same run. Each
# launch time is fitted to `a * key tiles + b * items + c` of its busiest
# block, counted by item_counts (the warp-specialized kernel's scheduler).
ITEM_CASES = [(1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (2, 1024), (4, 1024), (16, 1024),
              (64, 256), (32, 512), (16, 512), (4, 2048), (8, 2048)]
ITEM_QUICK = {(1, 2048), (1, 8192), (16, 1024), (64, 256), (16, 512)}


def kv_fits_l2(batch, tokens, l2_bytes, kv_heads=8, d=128):
    """Whether a batch's bf16 keys and values fit in half the L2, as prefill.cu
    estimates it (from max_q_len): such a batch is all tail, heaviest first."""
    return 2 * batch * kv_heads * tokens * d * 2 <= l2_bytes // 2


def item_counts(batch, tokens, blocks, group=4, kv_heads=8, rows=128, keys=128, tail_rounds=3, l2_bytes=0,
                d=128):
    """Key tiles and items of each block of the Hopper prefill kernel on a
    uniform causal batch, as sm90/prefill_scheduler.cuh hands them out: units
    of two row tiles (R - 1 - j and j) pair by pair ((sequence, KV head), j
    from the pair's index on, wrapping around), then
    the last ceil(tail_rounds * blocks / R) pairs item by item, row tile major
    and the heaviest first (all pairs when the batch's bf16 keys and values
    fit in half of `l2_bytes`); unit u of round r goes to block u - r * G on even
    rounds and the reverse on odd ones (G blocks, at most one per SM). A row
    tile is `rows` packed rows (rows / group tokens) and sees the key tiles up
    to its last token. tests/test_prefill_order.py checks it against the
    header."""
    per_tile = rows // group
    R = -(-tokens // per_tile)
    pairs = batch * kv_heads
    tail = pairs if kv_fits_l2(batch, tokens, l2_bytes, kv_heads, d) else min(pairs, -(-tail_rounds * blocks // R))
    halves = (R + 1) // 2

    def key_tiles(row_tile):
        return -(-min(tokens, per_tile * (row_tile + 1)) // keys)
    js = [(k + pair) % halves for pair in range(pairs - tail) for k in range(halves)]  # each pair's units rotated
    units = [[R - 1 - j] + ([j] if j < R - 1 - j else []) for j in js]
    units += [[R - 1 - t // tail] for t in range(tail * R)]
    grid = min(blocks, len(units))
    tiles, items = [0] * grid, [0] * grid
    for u, row_tiles in enumerate(units):
        rnd, pos = divmod(u, grid)
        b = pos if rnd % 2 == 0 else grid - 1 - pos
        tiles[b] += sum(key_tiles(t) for t in row_tiles)
        items[b] += len(row_tiles)
    return tiles, items


def fit_items(rows, key):
    """Least squares of rows[key] (us) on the busiest block's key tiles and
    items, plus a constant."""
    import numpy as np
    ok = [r for r in rows if r.get(key) is not None]
    if len(ok) < 4:
        return None
    a = np.array([[r["busiest_tiles"], r["busiest_items"], 1.0] for r in ok])
    coef = np.linalg.lstsq(a, np.array([r[key] for r in ok]), rcond=None)[0]
    return dict(us_per_key_tile=float(coef[0]), us_per_item=float(coef[1]), us_fixed=float(coef[2]))


def run_items(args, errors):
    rows = []
    for batch, tokens in ITEM_CASES:
        if args.quick and (batch, tokens) not in ITEM_QUICK:
            continue
        lens = [tokens] * batch
        one = ap.make_sets(lens, lens, QWEN3["hq"], QWEN3["hkv"], QWEN3["d"], n_sets=1)[0]
        sets = ap.make_sets(lens, lens, QWEN3["hq"], QWEN3["hkv"], QWEN3["d"],
                            n_sets=common.sets_for(ap.set_bytes(one), cap=8))
        times, clocks = {}, {}
        for name, make in (("ours", ap.ours_prefill), ("cudnn", lambda p: ap.sdpa_contiguous(p, "cudnn"))):
            r = ap.timed(f"items {batch}x{tokens} {name}", make, sets, True, errors, rep_ms=60, warmup_ms=20)
            times[name] = r[0].median_us if r else None
            clocks[f"{name}_sm_mhz"] = ap.gpu_columns(r[0])["sm_mhz"] if r else None
        tiles, items = item_counts(batch, tokens, torch.cuda.get_device_properties(0).multi_processor_count,
                                   l2_bytes=common.l2_bytes())
        b = max(range(len(tiles)), key=lambda i: (tiles[i], items[i]))
        rows.append(dict(case=f"{batch}x{tokens}", batch=batch, tokens=tokens, ours_us=times["ours"],
                         cudnn_us=times["cudnn"], busiest_tiles=tiles[b], busiest_items=items[b], **clocks,
                         cudnn_over_ours=times["cudnn"] / times["ours"] if times["ours"] and times["cudnn"] else None))
        del sets, one
        torch.cuda.empty_cache()
    return rows, {"ours": fit_items(rows, "ours_us"), "cudnn": fit_items(rows, "cudnn_us")}


def main():
    cli = common.parser(__doc__.splitlines()[0])
    cli.add_argument("--beside-sms", type=lambda v: [int(x) for x in v.split(",")], default=[],
                     help="mixed steps timed again with these counts of SMs left to the decodes at first "
                          "(TILEINFER_MIXED_DECODE_SMS), comma-separated")
    args = cli.parse_args()
    env = common.print_header(NAME)
    ceil = common.measure_ceilings(quick=args.quick, skip=args.no_ceilings)
    status = {"prefill": common.has_cuda_kernel("prefill"), "flashinfer": ap.load_flashinfer()}
    status["flashinfer"] = (status["flashinfer"][0] is not None, status["flashinfer"][1] or "")
    for k, (ok, why) in status.items():
        print(f"   {k}: {'yes' if ok else 'skipped: ' + why}")
    errors, rows = [], []
    for label, lens, cfg in CASES:
        if args.quick and label not in QUICK or args.only and args.only not in label:
            continue
        print(f"-- {label}: {len(lens)} x {lens[0]} tokens, {cfg['hq']}/{cfg['hkv']} heads, d {cfg['d']}"
              + ("" if cfg.get("causal", True) else ", non-causal"))
        rows += common.attempt(label, lambda a=(label, lens, cfg): run_case(*a, args, ceil, errors, status),
                               errors) or []

    common.print_table(rows, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"),
                              ("TFLOP/s", "tflops", ".0f"), ("%gemm", "pct_gemm", ".0f"),
                              ("t/t_ours", "t_over_ours", ".2f"), ("rel diff", "rel_diff", ".1e"),
                              ("SM MHz", "sm_mhz", ".0f"), ("W", "power_w", ".0f"), ("capped", "power_capped", ".2f"),
                              ("mode", "mode", ""), ("sets", "sets", ""), ("role", "role", ""), ("note", "note", "")],
                       title=f"\n{NAME} (t/t_ours > 1: ours faster; rel diff vs sdpa flash, else the next peer)")
    mixed = []
    if status["prefill"][0]:
        for label, chunks, decodes in MIXED:
            if args.quick and label not in MIXED_QUICK or args.only and args.only not in label:
                continue
            print(f"-- mixed step: {label}")
            mixed += common.attempt(label, lambda a=(label, chunks, decodes): run_mixed(*a, args, errors),
                                    errors) or []
        common.print_table(mixed, [("case", "case", ""), ("mixed us", "mixed_us", ".1f"),
                                   ("chunks us", "chunks_us", ".1f"), ("decodes us", "decodes_us", ".1f"),
                                   ("t / parts", "over_parts", ".2f"), ("in turn us", "in_turn_us", ".1f"),
                                   ("t_in_turn / t", "in_turn_over_mixed", ".2f"),
                                   ("prefill op us", "whole_prefill_us", ".1f"),
                                   ("t / prefill op", "over_whole_prefill", ".2f")],
                           title="\nmixed steps (attention op; parts run alone; the prefill op over the whole step)")
        if args.beside_sms:
            for r in mixed:
                print(f"   beside, by decode SMs: {r['case']}: " + ", ".join(
                    f"{d}: {us:.1f} us ({us / r['parts_sum_us']:.2f} of the parts)" if us and r["parts_sum_us"]
                    else f"{d}: -" for d, us in r["beside_by_sms"].items()))
    variants = []
    if status["prefill"][0]:
        for label, *case in VARIANTS:
            if args.only and args.only not in label:
                continue
            variants += common.attempt(label, lambda a=(label, *case): run_variant(*a, args, errors), errors) or []
        common.print_table(variants, [("case", "case", ""), ("variant us", "variant_us", ".1f"),
                                      ("plain us", "plain_us", ".1f"), ("t / plain", "over_plain", ".2f"),
                                      ("2 consumers us", "two_consumers_us", ".1f"),
                                      ("3 consumers us", "three_consumers_us", ".1f")],
                           title="\nvariants (attention op, against plain prefill of the same prompt)")
    items, items_fit = [], {}
    if status["prefill"][0] and (not args.only or args.only in "items"):
        print("-- per-item cost: uniform causal batches")
        items, items_fit = common.attempt("items", lambda: run_items(args, errors), errors) or ([], {})
        common.print_table(items, [("case", "case", ""), ("ours us", "ours_us", ".1f"), ("cudnn us", "cudnn_us", ".1f"),
                                   ("t_cudnn / t", "cudnn_over_ours", ".2f"), ("busiest tiles", "busiest_tiles", ""),
                                   ("busiest items", "busiest_items", ""), ("ours MHz", "ours_sm_mhz", ".0f"),
                                   ("cudnn MHz", "cudnn_sm_mhz", ".0f")],
                           title="\nper-item cost (ours: the busiest block's key tiles and items)")
        for who, fit in items_fit.items():
            if fit:
                print(f"   fit {who}: {fit['us_per_key_tile']:.2f} us per key tile, {fit['us_per_item']:.2f} us per "
                      f"item, {fit['us_fixed']:.1f} us fixed" + (" (our counts, for scale)" if who == "cudnn" else ""))
    common.save(NAME, dict(env=env, ceilings=ceil, status=status, rows=rows, mixed=mixed, variants=variants,
                           items=items, items_fit=items_fit, errors=errors), args)


if __name__ == "__main__":
    main()
