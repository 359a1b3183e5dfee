"""Decode benchmark: one query per sequence over the paged cache, our attention
op (split-KV decode + combine) against its peers, and speculative
verify steps of n = 2..16 queries: the decode path against the prefill op on
the same inputs (where is the crossover?).

Shapes: Qwen3-4B attention (32 query heads, 8 KV heads, head dim 128, bf16,
page 64); batch x context (1,1k) (1,4k) (1,32k) (8,32k) (32,4k) (128,2k); a
Llama-3-8B-like batch (same head counts, 16 x 8k); head dims 64 and 256; groups
of 7 and 5 (28/4, 40/8), MQA (32/1; 1, 4 and 32 sequences) and one KV head of
group 8 (a tensor-parallel shard); full runs add groups of 1, 8 and 16.
Decode must read k and v of every position once: GB/s of those bytes against
the copy bandwidth measured in this run. Small launches are timed as CUDA-graph
replays (how serving engines run decode), each of ours and of the peers that
can be captured; the `mode` column says which.

Peers: torch SDPA with the cuDNN and the flash backend on a contiguous cache,
gather-pages-then-SDPA(flash), the eager reference (small sizes only),
FlashInfer's paged decode if it imports. The verify grid's rows are internal
(role "dev": our decode path, other split counts, our prefill op), as are
the rows of steps of 17-32 packed rows (MQA; 8-query verify steps of group
4) on each decode tile, the 16-row and the 64-row one, whichever the launch
takes.

Writes benchmarks/results/decode.json and decode.png.

    python3 benchmarks/bench_decode.py [--quick] [--only 32k] [--no-verify] [--out-dir DIR]
    python3 benchmarks/bench_decode.py --only splits   # forced split counts alone
    python3 benchmarks/bench_decode.py --only invariant   # batch-invariant decode against the default
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_peers as ap  # noqa: E402
import common  # noqa: E402

NAME = "decode"
QWEN3 = dict(hq=32, hkv=8, d=128)
LLAMA3_8B = dict(hq=32, hkv=8, d=128)  # same head counts as Qwen3-4B; a longer, wider batch

# (label, batch, context, heads)
CASES = [
    ("1x1k", 1, 1024, QWEN3),
    ("1x4k", 1, 4096, QWEN3),
    ("1x32k", 1, 32768, QWEN3),
    ("8x32k", 8, 32768, QWEN3),
    ("32x4k", 32, 4096, QWEN3),
    ("128x2k", 128, 2048, QWEN3),
    ("llama3-8b 16x8k", 16, 8192, LLAMA3_8B),
    ("d64 32x4k", 32, 4096, dict(hq=32, hkv=8, d=64)),
    ("d256 32x4k", 32, 4096, dict(hq=32, hkv=8, d=256)),
    # Head dims on head dim 128's kernels (Phi-2-like 80, Phi-3-like 96).
    ("d80 32x4k", 32, 4096, dict(hq=32, hkv=8, d=80)),
    ("d96 32x4k", 32, 4096, dict(hq=32, hkv=8, d=96)),
    ("d96 1x32k", 1, 32768, dict(hq=32, hkv=8, d=96)),
    # Groups that are not powers of two (Qwen2.5-7B 28/4, Qwen2.5-14B 40/8) and MQA.
    ("28/4 32x4k", 32, 4096, dict(hq=28, hkv=4, d=128)),
    ("28/4 1x32k", 1, 32768, dict(hq=28, hkv=4, d=128)),
    ("40/8 32x4k", 32, 4096, dict(hq=40, hkv=8, d=128)),
    ("40/8 1x32k", 1, 32768, dict(hq=40, hkv=8, d=128)),
    ("MQA 32/1 1x4k", 1, 4096, dict(hq=32, hkv=1, d=128)),
    ("MQA 32/1 1x32k", 1, 32768, dict(hq=32, hkv=1, d=128)),
    ("MQA 32/1 4x4k", 4, 4096, dict(hq=32, hkv=1, d=128)),
    ("MQA 32/1 32x4k", 32, 4096, dict(hq=32, hkv=1, d=128)),
    # One KV head of group 8: a tensor-parallel shard (Llama-3-70B's 64/8 heads over 8 GPUs).
    ("TP shard 8/1 1x4k", 1, 4096, dict(hq=8, hkv=1, d=128)),
    # The other group sizes of the decode tiles (full runs): 1 (MHA), 8, 16.
    ("MHA 32/32 32x4k", 32, 4096, dict(hq=32, hkv=32, d=128)),
    ("32/4 32x4k", 32, 4096, dict(hq=32, hkv=4, d=128)),
    ("32/2 32x4k", 32, 4096, dict(hq=32, hkv=2, d=128)),
]
QUICK = {"1x1k", "1x32k", "8x32k", "32x4k", "128x2k", "d64 32x4k", "d256 32x4k", "d80 32x4k", "d96 32x4k",
         "d96 1x32k", "28/4 32x4k", "28/4 1x32k",
         "40/8 32x4k", "40/8 1x32k", "MQA 32/1 1x4k", "MQA 32/1 1x32k", "MQA 32/1 4x4k", "MQA 32/1 32x4k",
         "TP shard 8/1 1x4k"}
EAGER_MAX_POSITIONS = 4096  # batch x context; the eager reference loops in Python

VERIFY_N = [2, 4, 8, 16]
VERIFY_L = [256, 512, 1024, 2048, 4096, 8192]
VERIFY_QUICK_N = [4, 8, 16]
VERIFY_QUICK_L = [256, 512, 2048, 8192]

OURS = "tileinfer decode (attention op)"
# Outputs are compared with the first of these that ran (a sanity check).
BASE = ["sdpa flash (contiguous)", "sdpa cudnn (contiguous)", "eager reference"]
VERIFY_DECODE = "decode path (attention op)"
VERIFY_SPLITS = [8, 16]  # split counts tried for 9-16-query steps besides the dispatcher's (32 for one sequence)
VERIFY_PREFILL = "prefill op"
# Launches of 17-32 packed rows (group x queries) take the 16-row decode tile
# (a block per 16 rows) where its blocks fit one wave, else the 64-row tile,
# which reads the pages once for all rows (decode.cu, decode_small_tile);
# these dev rows time the same step on each tile.
ROW_TILES = [(f"decode on the {rows}-row tile", rows) for rows in (16, 64)]


def small_tile_rows(cfg, n):
    """Whether a step of n queries per sequence has 17-32 packed rows (the
    launches whose tile follows their blocks)."""
    return 16 < cfg["hq"] // cfg["hkv"] * n <= 32


def sets_of(batch, ctx, n, cfg, cap=64):
    lens, q_lens = [ctx] * batch, [n] * batch
    one = ap.make_sets(lens, q_lens, cfg["hq"], cfg["hkv"], cfg["d"], n_sets=1)[0]
    k = common.sets_for(ap.set_bytes(one), cap=cap)
    return ap.make_sets(lens, q_lens, cfg["hq"], cfg["hkv"], cfg["d"], n_sets=k) if k > 1 else [one]


def run_case(label, batch, ctx, cfg, args, ceil, errors, status):
    sets = sets_of(batch, ctx, 1, cfg)
    nbytes = ap.kv_bytes(sets[0])
    kw = dict(rep_ms=60 if args.quick else 200, warmup_ms=20)
    impls = []
    for be in ("cudnn", "flash"):
        impls.append((f"sdpa {be} (contiguous)", lambda p, be=be: ap.sdpa_contiguous(p, be), True))
    impls.append(("gather+sdpa flash", lambda p: ap.gather_then_sdpa(p, "flash"), True))
    if batch * ctx <= EAGER_MAX_POSITIONS:
        impls.append(("eager reference", lambda p: ap.eager_reference(p), False))
    if status["flashinfer"][0] and (not args.quick or cfg["d"] == 128):
        impls.append(("flashinfer paged decode", lambda p: ap.flashinfer_decode(p), True))
    # Ours last: a kernel that breaks the CUDA context then costs no peer of this case.
    if status["decode"][0]:
        impls.append((OURS, lambda p: ap.ours_attention(p), True))
        if small_tile_rows(cfg, 1):
            impls += [(name, lambda p, r=rows: ap.on_decode_row_tile(r, ap.ours_attention(p)), True, "dev")
                      for name, rows in ROW_TILES]

    def metrics(t):
        gbps = nbytes / t.seconds / 1e9
        return dict(kv_bytes=nbytes, gbps=gbps,
                    pct_copy=100 * gbps / ceil["copy_gbps"] if ceil.get("copy_gbps") else None)
    rows = ap.time_impls(label, impls, sets, errors, ours=OURS, base=BASE, metrics=metrics,
                         extra=dict(batch=batch, ctx=ctx, n=1, **cfg), **kw)
    del sets
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def run_verify(n, ctx, args, ceil, errors, status):
    """Decode path vs prefill op on the same n-query step of one sequence."""
    sets = sets_of(1, ctx, n, QWEN3)
    flops = ap.attention_flops(sets[0], causal=True)
    nbytes = ap.kv_bytes(sets[0])
    kw = dict(rep_ms=40 if args.quick else 150, warmup_ms=10)
    impls = []
    if status["decode"][0]:
        impls.append((VERIFY_DECODE, lambda p: ap.ours_attention(p), True, "dev"))
        if small_tile_rows(QWEN3, n):
            impls += [(name, lambda p, r=rows: ap.on_decode_row_tile(r, ap.ours_attention(p)), True, "dev")
                      for name, rows in ROW_TILES]
        # Split counts other than the dispatcher's for 9-16-query steps: does its choice hold?
        if n > 8:
            for splits in VERIFY_SPLITS:
                impls.append((f"decode+combine, {splits} splits",
                              lambda p, s=splits: ap.ours_decode_combine(p, s), True, "dev"))
    if status["prefill"][0]:
        impls.append((VERIFY_PREFILL, lambda p: ap.ours_prefill(p), True, "dev"))

    def metrics(t):
        return dict(kv_bytes=nbytes, gbps=nbytes / t.seconds / 1e9, tflops=flops / t.seconds / 1e12)
    rows = ap.time_impls(f"verify n={n} L={ctx}", impls, sets, errors, ours=VERIFY_DECODE, base=[VERIFY_PREFILL],
                         metrics=metrics, extra=dict(batch=1, ctx=ctx, n=n, **QWEN3), **kw)
    for r in rows:  # every row here is an internal comparison, the decode path's too
        r["role"] = "dev"
    del sets
    return rows


# Per-layer variants against plain decode: (label, batch, context, window_left,
# soft-cap, sinks, the plain case it is measured against as (batch, context)).
VARIANTS = [
    ("1x32k, window 4k", 1, 32768, 4095, 0.0, False, (1, 4096)),
    ("1x128k, window 4k", 1, 131072, 4095, 0.0, False, (1, 4096)),
    ("8x32k, window 4k", 8, 32768, 4095, 0.0, False, (8, 4096)),
    ("32x4k, soft-cap 50", 32, 4096, -1, 50.0, False, (32, 4096)),
    ("32x4k, sinks", 32, 4096, -1, 0.0, True, (32, 4096)),
    ("32x4k, window 1k + sinks", 32, 4096, 1023, 0.0, True, (32, 1024)),
]


def run_variant(label, batch, ctx, window, cap, sinks, plain, args, errors):
    """The variant, plain decode on the same inputs, and plain decode at the
    context the variant reads (a window's length): graph replays."""
    kw = dict(rep_ms=40 if args.quick else 150, warmup_ms=10)
    times = {}
    for name, (b, c), make in (
            ("variant", (batch, ctx), lambda p: ap.ours_attention_variant(p, window, cap, sinks)),
            ("plain, same inputs", (batch, ctx), lambda p: ap.ours_attention(p)),
            ("plain, what it reads", plain, lambda p: ap.ours_attention(p))):
        sets = sets_of(b, c, 1, QWEN3)
        r = ap.timed(f"{label} {name}", make, sets, True, errors, **kw)
        if r is not None:
            times[name] = r[0].median_us
        del sets
        torch.cuda.empty_cache()
    v, same, reads = (times.get(k) for k in ("variant", "plain, same inputs", "plain, what it reads"))
    return [dict(case=label, variant_us=v, plain_us=same, plain_reads_us=reads, plain_reads=f"{plain[0]}x{plain[1]}",
                 over_plain=v / same if v and same else None, over_reads=v / reads if v and reads else None)]


# Split counts forced on the decode path (decode + combine: the attention op's
# kernels at another count than decode_num_splits), beside the op (the rule's
# count) and cuDNN: how the rule stands against the counts it could pick.
# Full runs, or --only splits.
SPLIT_CASES = [
    ("MQA 32/1 1x4k", 1, 4096, dict(hq=32, hkv=1, d=128), [16, 32, 64, 128, 256]),
    ("MQA 32/1 1x32k", 1, 32768, dict(hq=32, hkv=1, d=128), [32, 64, 128, 256]),
    ("28/4 32x4k", 32, 4096, dict(hq=28, hkv=4, d=128), [1, 2, 3, 4]),
    ("1x32k", 1, 32768, QWEN3, [16, 32, 64]),
]


def run_splits(label, batch, ctx, cfg, counts, args, errors):
    import tileinfer_attn as ti
    sets = sets_of(batch, ctx, 1, cfg)
    rule = ti.decode_num_splits(sets[0].q.device, batch, cfg["hkv"])
    kw = dict(rep_ms=60, warmup_ms=20)
    impls = [(f"attention op ({rule} splits)", lambda p: ap.ours_attention(p)),
             ("sdpa cudnn (contiguous)", lambda p: ap.sdpa_contiguous(p, "cudnn"))]
    impls += [(f"{s} splits", lambda p, s=s: ap.ours_decode_combine(p, s)) for s in counts]
    rows = []
    for name, make in impls:
        r = ap.timed(f"{label} {name}", make, sets, True, errors, **kw)
        if r is not None:
            rows.append(dict(case=label, impl=name, us=r[0].median_us, rule_splits=rule))
    del sets
    torch.cuda.empty_cache()
    return rows


# Batch-invariant decode (attention's batch_invariant) against the default
# split rule on the same inputs: with the table as wide as the context (the
# fewest grid splits) and as an engine sizes it for 128k positions (32 grid
# splits, the later ones empty), each against the default on the same table.
# Graph replays; full runs, or --only invariant.
INVARIANT_CASES = [
    ("1x1k", 1, 1024, QWEN3), ("1x4k", 1, 4096, QWEN3), ("1x32k", 1, 32768, QWEN3), ("8x32k", 8, 32768, QWEN3),
    ("16x4k", 16, 4096, QWEN3), ("32x4k", 32, 4096, QWEN3), ("128x2k", 128, 2048, QWEN3),
    ("256x1k", 256, 1024, QWEN3), ("MQA 32/1 1x4k", 1, 4096, dict(hq=32, hkv=1, d=128)),
    ("28/4 24x4k", 24, 4096, dict(hq=28, hkv=4, d=128)), ("28/4 32x4k", 32, 4096, dict(hq=28, hkv=4, d=128)),
    ("TP shard 8/1 1x4k", 1, 4096, dict(hq=8, hkv=1, d=128)),
    # 32-88 (sequence, KV head) pairs: three or more blocks a pair, each walking a run of splits.
    ("MQA 32/1 32x4k", 32, 4096, dict(hq=32, hkv=1, d=128)), ("TP shard 8/1 64x4k", 64, 4096, dict(hq=8, hkv=1, d=128)),
    # One long sequence of one KV head: the 32-split cap against the default's 128 splits.
    ("MQA 32/1 1x32k", 1, 32768, dict(hq=32, hkv=1, d=128)), ("TP shard 8/1 1x32k", 1, 32768, dict(hq=8, hkv=1, d=128)),
]


def run_invariant(label, batch, ctx, cfg, args, errors):
    sets = sets_of(batch, ctx, 1, cfg)
    kw = dict(rep_ms=60, warmup_ms=20)
    times = {}
    for name, make in (("default", lambda p: ap.ours_attention(p)),
                       ("invariant", lambda p: ap.ours_attention(p, batch_invariant=True)),
                       ("default, 128k table", lambda p: ap.ours_attention(p, table_positions=131072)),
                       ("invariant, 128k table",
                        lambda p: ap.ours_attention(p, batch_invariant=True, table_positions=131072))):
        r = ap.timed(f"{label} {name}", make, sets, True, errors, **kw)
        times[name] = r[0].median_us if r is not None else None
    del sets
    torch.cuda.empty_cache()
    d, tight = times["default"], times["invariant"]
    dw, wide = times["default, 128k table"], times["invariant, 128k table"]
    return [dict(case=label, default_us=d, invariant_us=tight, default_wide_us=dw, invariant_wide_us=wide,
                 over_default=tight / d if d and tight else None,
                 wide_over_default=wide / dw if dw and wide else None)]


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--no-verify", action="store_true", help="skip the verify-step grid")
    args = p.parse_args()
    env = common.print_header(NAME)
    ceil = common.measure_ceilings(quick=args.quick, skip=args.no_ceilings)
    fi, fi_why = ap.load_flashinfer()
    dec, dec_why = common.has_cuda_kernel("decode")
    comb, comb_why = common.has_cuda_kernel("combine")
    status = {"decode": (dec and comb, dec_why or comb_why), "prefill": common.has_cuda_kernel("prefill"),
              "flashinfer": (fi is not None, fi_why or "")}
    for k, (ok, why) in status.items():
        print(f"   {k}: {'yes' if ok else 'skipped: ' + why}")
    errors, rows, verify = [], [], []
    for label, batch, ctx, cfg in CASES:
        if args.quick and label not in QUICK or args.only and args.only not in label:
            continue
        print(f"-- {label}: {batch} x {ctx} positions, {cfg['hq']}/{cfg['hkv']} heads, d {cfg['d']}")
        rows += common.attempt(label, lambda a=(label, batch, ctx, cfg): run_case(*a, args, ceil, errors, status),
                               errors) or []
    cols = [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"), ("GB/s", "gbps", ".0f"),
            ("%copy", "pct_copy", ".0f"), ("t/t_ours", "t_over_ours", ".2f"), ("rel diff", "rel_diff", ".1e"),
            ("mode", "mode", ""), ("sets", "sets", ""), ("note", "note", "")]
    common.print_table(rows, cols, title=f"\n{NAME} (GB/s of k+v read once; t/t_ours > 1: ours faster)")

    if not args.no_verify and (status["decode"][0] or status["prefill"][0]):
        grid_n = VERIFY_QUICK_N if args.quick else VERIFY_N
        grid_l = VERIFY_QUICK_L if args.quick else VERIFY_L
        print(f"-- verify steps: n in {grid_n}, context in {grid_l}, one sequence")
        for n in grid_n:
            for ctx in grid_l:
                if args.only and args.only not in f"verify n={n} L={ctx}":
                    continue
                verify += common.attempt(f"verify n={n} L={ctx}",
                                         lambda a=(n, ctx): run_verify(*a, args, ceil, errors, status), errors) or []
        common.print_table(verify, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f"),
                                    ("t/t_decode", "t_over_ours", ".2f"), ("GB/s", "gbps", ".0f"),
                                    ("rel diff", "rel_diff", ".1e"), ("mode", "mode", "")],
                           title="\nverify steps (t/t_decode > 1: the decode path is faster)")
    elif not args.no_verify:
        print("   [skip] verify steps: neither decode nor prefill has a CUDA kernel in this build")

    variants = []
    if status["decode"][0]:
        for label, *case in VARIANTS:
            if args.only and args.only not in label:
                continue
            variants += common.attempt(label, lambda a=(label, *case): run_variant(*a, args, errors), errors) or []
        common.print_table(variants, [("case", "case", ""), ("variant us", "variant_us", ".1f"),
                                      ("plain us", "plain_us", ".1f"), ("t / plain", "over_plain", ".2f"),
                                      ("plain at", "plain_reads", ""), ("us", "plain_reads_us", ".1f"),
                                      ("t / that", "over_reads", ".2f")],
                           title="\nvariants (attention op; plain decode on the same inputs and at the window's length)")
    splits = []
    if status["decode"][0] and (not args.quick and not args.only or args.only == "splits"):
        for label, batch, ctx, cfg, counts in SPLIT_CASES:
            print(f"-- split counts: {label}")
            splits += common.attempt(f"splits {label}",
                                     lambda a=(label, batch, ctx, cfg, counts): run_splits(*a, args, errors),
                                     errors) or []
        common.print_table(splits, [("case", "case", ""), ("impl", "impl", ""), ("us", "us", ".1f")],
                           title="\nsplit counts (decode + combine at forced counts; the op at the rule's)")
    invariant = []
    if status["decode"][0] and (not args.quick and not args.only or args.only == "invariant"):
        for label, batch, ctx, cfg in INVARIANT_CASES:
            print(f"-- batch-invariant decode: {label}")
            invariant += common.attempt(f"invariant {label}",
                                        lambda a=(label, batch, ctx, cfg): run_invariant(*a, args, errors),
                                        errors) or []
        common.print_table(invariant, [("case", "case", ""), ("default us", "default_us", ".1f"),
                                       ("invariant us", "invariant_us", ".1f"), ("t / default", "over_default", ".2f"),
                                       ("default, 128k table us", "default_wide_us", ".1f"),
                                       ("invariant, 128k table us", "invariant_wide_us", ".1f"),
                                       ("t / default", "wide_over_default", ".2f")],
                           title="\nbatch-invariant decode (attention op, batch_invariant=True) against the default")
    common.save(NAME, dict(env=env, ceilings=ceil, status=status, rows=rows, verify=verify, variants=variants,
                           splits=splits, invariant=invariant, errors=errors), args)


if __name__ == "__main__":
    main()
