"""Attention inputs: the fused attention_inputs (2 launches) against
this package's separate ops (rms_norm, rope, rms_norm, rope, cache_write: 5
launches) and against plain PyTorch eager ops (reference.rms_norm /
reference.rope and an index_put into the pools through a precomputed slot
mapping, as a model without these kernels does it).

Qwen3-4B attention shapes: 32 query heads, 8 KV heads, head_dim 128, bf16,
page 64, q_norm and k_norm on, full rotary dim. Decode-sized steps (1, 8, 64,
256 sequences of one token each) and a prefill-sized step (4096 tokens).

Bytes counted (the fewest a step must move): q, k, v read once, q_out and the
new keys and values written once: 2 * T * (32 + 2 * 8) * 128 * 2 bytes. GB/s is
that over the median time, against the copy bandwidth measured in this run
(2 GiB buffers), and against a peer that moves as many bytes and does nothing
else: contiguous PyTorch copies of q's values into q_out and of k's and v's
into a buffer (two launches, as the fused op), timed the same way: the memory
speed at this step's size.
Small steps are launch-bound: each variant is also timed as CUDA-graph replays,
next to the replay time of one trivial kernel (the floor of one launch), so
"one launch's worth of latency per launch" can be read off.

Writes benchmarks/results/inputs.json and inputs.png.

    python3 benchmarks/bench_inputs.py [--quick] [--out-dir DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

HQ, HKV, D, PAGE, ROT = 32, 8, 128, 64, 128
DTYPE = torch.bfloat16
EPS = 1e-6
DECODE_CTX = 1024  # positions per sequence after a decode step
NAME = "inputs"


def written_pages(q_len: int, ctx: int) -> int:
    """Pages of one sequence that a step of q_len tokens ending at ctx writes."""
    return (ctx + PAGE - 1) // PAGE - (ctx - q_len) // PAGE


def step_bytes(t: int) -> int:
    return 2 * t * (HQ + 2 * HKV) * D * torch.finfo(DTYPE).bits // 8


class Step:
    """One input set: a packed qkv projection output, its sequences' metadata
    and slots (pages of their own, so sets never share cache lines), outputs and
    the unfused path's intermediates."""

    def __init__(self, num_seqs: int, q_len: int, ctx: int, pools, first_page: int, gen, cos_sin, ref):
        t = num_seqs * q_len
        dev = "cuda"
        self.t = t
        self.qkv = (torch.randn(t, (HQ + 2 * HKV) * D, generator=gen, device=dev)).to(DTYPE)
        self.q = self.qkv[:, :HQ * D].view(t, HQ, D)
        self.k = self.qkv[:, HQ * D:(HQ + HKV) * D].view(t, HKV, D)
        self.v = self.qkv[:, (HQ + HKV) * D:].view(t, HKV, D)
        # Only the pages this step writes get pages of their own (the op reads
        # no other entry); earlier entries point at this set's first page.
        pages_per_seq = (ctx + PAGE - 1) // PAGE
        first_written = (ctx - q_len) // PAGE
        w = pages_per_seq - first_written
        assert w == written_pages(q_len, ctx)
        bt = torch.full((num_seqs, pages_per_seq), first_page, dtype=torch.int32)
        bt[:, first_written:] = first_page + torch.arange(num_seqs * w, dtype=torch.int32).view(num_seqs, w)
        self.block_tables = bt.to(dev)
        self.seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=dev)
        self.cu = (torch.arange(num_seqs + 1, dtype=torch.int32, device=dev) * q_len).contiguous()
        self.positions = ref.token_positions(self.seq_lens, self.cu, t)  # int64, as a model computes once a step
        # The eager path's slot mapping (vLLM style): page and slot of each token.
        seq = torch.arange(t, device=dev) // q_len
        self.page_idx = self.block_tables.long()[seq, self.positions // PAGE]
        self.slot_idx = self.positions % PAGE
        self.q_out = torch.empty_like(self.q)
        self.qn = torch.empty_like(self.q)
        self.kn = torch.empty(t, HKV, D, dtype=DTYPE, device=dev)
        self.kr = torch.empty_like(self.kn)
        # The copy peer's contiguous sources (the same values) and destination.
        self.q_src = self.q.contiguous()
        self.kv_src = self.qkv[:, HQ * D:].contiguous()
        self.kv_copy = torch.empty_like(self.kv_src)
        self.cos_sin = cos_sin
        self.pools = pools


def fused(s: Step, qw, kw):
    torch.ops.tileinfer_attn.attention_inputs(
        s.q_out, s.pools[0], s.pools[1], s.q, s.k, s.v, s.block_tables, s.seq_lens, s.cu, s.cos_sin, ROT, qw, kw, EPS)


def unfused(s: Step, qw, kw):
    ops = torch.ops.tileinfer_attn
    ops.rms_norm(s.qn, s.q, qw, EPS)
    ops.rope(s.q_out, s.qn, s.positions, s.cos_sin, ROT)
    ops.rms_norm(s.kn, s.k, kw, EPS)
    ops.rope(s.kr, s.kn, s.positions, s.cos_sin, ROT)
    ops.cache_write(s.pools[0], s.pools[1], s.kr, s.v, s.block_tables, s.seq_lens, s.cu)


def copy(s: Step, qw, kw):
    """As many bytes as the step moves and nothing else: contiguous copies (q's
    values into q_out, k's and v's into a buffer), two launches as the fused op.
    (Copies from qkv's strided views run PyTorch's unvectorized strided copy:
    twice as slow as the fused op at 4096 tokens, no ceiling.)"""
    s.q_out.copy_(s.q_src)
    s.kv_copy.copy_(s.kv_src)


def make_eager(ref):
    def eager(s: Step, qw, kw):
        q = ref.rope(ref.rms_norm(s.q, qw, EPS), s.positions, s.cos_sin, ROT)
        k = ref.rope(ref.rms_norm(s.k, kw, EPS), s.positions, s.cos_sin, ROT)
        s.pools[0][s.page_idx, :, s.slot_idx] = k
        s.pools[1][s.page_idx, :, s.slot_idx] = s.v
        return q
    return eager


def check(steps, qw, kw, ref) -> dict:
    """Bit-identity of fused vs unfused at these shapes, and q_out vs eager (ulps)."""
    from tileinfer_attn.testing import ulp_error
    s = steps[0]
    fused(s, qw, kw)
    q_f = s.q_out.clone()
    idx = (s.page_idx, slice(None), s.slot_idx)
    k_f, v_f = s.pools[0][idx].clone(), s.pools[1][idx].clone()
    unfused(s, qw, kw)
    same = torch.equal(q_f, s.q_out) and torch.equal(k_f, s.pools[0][idx]) and torch.equal(v_f, s.pools[1][idx])
    q_e = make_eager(ref)(s, qw, kw)
    return {"fused_equals_unfused": bool(same), "q_out_ulps_vs_eager": ulp_error(q_f, q_e, DTYPE),
            "k_ulps_vs_eager": ulp_error(k_f, s.pools[0][idx], DTYPE)}


def main():
    ap = common.parser("attention_inputs: fused vs separate ops vs eager PyTorch")
    args = ap.parse_args()
    env = common.print_header(NAME)
    ok, why = common.has_cuda_kernel("attention_inputs")
    if not ok:
        print(f"   [skip] {NAME}: {why}")
        return
    ref = common.load_reference()
    ceil = common.measure_ceilings(quick=args.quick, skip=args.no_ceilings)
    copy_gbps = ceil.get("copy_gbps")

    gen = torch.Generator(device="cuda").manual_seed(0)
    # Qwen3's table (theta 1e6): cos then sin of p * theta^(-2i / rotary_dim).
    inv_freq = 1e6 ** (-torch.arange(0, ROT, 2, dtype=torch.float64) / ROT)
    angles = torch.arange(8192, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).float().cuda()
    qw = (1 + 0.3 * torch.randn(D, generator=gen, device="cuda")).to(DTYPE)
    kw = (1 + 0.3 * torch.randn(D, generator=gen, device="cuda")).to(DTYPE)
    eager = make_eager(ref)

    # One launch's floor: a trivial kernel timed the same ways.
    tiny = torch.zeros(1, device="cuda")
    floor_graph = common.bench(lambda: tiny.add_(1), graph=True, rep_ms=50 if args.quick else 200)
    floor_events = common.bench(lambda: tiny.add_(1), rep_ms=50 if args.quick else 200)
    print(f"   one trivial launch: {floor_graph.median_us:.2f} us per graph node, "
          f"{floor_events.median_us:.2f} us back-to-back launched")

    cases = [("decode", n, 1, DECODE_CTX) for n in (1, 8, 64, 256)] + [("prefill", 1, 4096, 4096)]
    if args.quick:
        cases = [c for c in cases if c[1] in (1, 64) or c[0] == "prefill"]
    rows, errors = [], []
    accuracy = None
    for kind, num_seqs, q_len, ctx in cases:
        t = num_seqs * q_len
        label = f"{kind} T={t}"
        if args.only and args.only not in label:
            continue
        nsets = common.sets_for(step_bytes(t))
        pages_per_set = num_seqs * written_pages(q_len, ctx)
        pool_shape = (nsets * pages_per_set, HKV, PAGE, D)
        pools = (torch.empty(pool_shape, dtype=DTYPE, device="cuda"), torch.empty(pool_shape, dtype=DTYPE, device="cuda"))
        steps = [Step(num_seqs, q_len, ctx, pools, i * pages_per_set, gen, cos_sin, ref) for i in range(nsets)]
        if accuracy is None or kind == "prefill":
            accuracy = common.attempt(f"{label} check", lambda: check(steps, qw, kw, ref), errors) or accuracy
            print(f"   {label}: {accuracy}")
        sets = [(s, qw, kw) for s in steps]
        row = {"case": label, "tokens": t, "sets": nsets, "bytes": step_bytes(t)}
        for name, fn in (("fused", fused), ("copy", copy), ("unfused", unfused), ("eager", eager)):
            tg = common.attempt(f"{label} {name} graph", lambda: common.bench(fn, sets, graph=True), errors)
            te = common.attempt(f"{label} {name} events", lambda: common.bench(fn, sets), errors)
            row[f"{name}_graph"] = tg
            row[f"{name}_events"] = te
            row[f"{name}_us"] = tg.median_us if tg else None
            row[f"{name}_launched_us"] = te.median_us if te else None
            row[f"{name}_gbps"] = step_bytes(t) / tg.seconds / 1e9 if tg else None
            if copy_gbps and tg:
                row[f"{name}_of_copy"] = row[f"{name}_gbps"] / copy_gbps
        if row.get("fused_us"):
            row["fused_over_copy"] = row["fused_us"] / row["copy_us"] if row.get("copy_us") else None
            row["unfused_over_fused"] = row["unfused_us"] / row["fused_us"] if row.get("unfused_us") else None
            row["eager_over_fused"] = row["eager_us"] / row["fused_us"] if row.get("eager_us") else None
            row["fused_launch_floors"] = row["fused_us"] / floor_graph.median_us  # 2 launches
        rows.append(row)
        del steps, pools, sets
        torch.cuda.empty_cache()

    common.print_table(rows, [
        ("case", "case", ""), ("fused us", "fused_us", ".2f"), ("unfused us", "unfused_us", ".2f"),
        ("eager us", "eager_us", ".2f"), ("fused GB/s", "fused_gbps", ".0f"), ("of copy", "fused_of_copy", ".2f"),
        ("same-bytes copy us", "copy_us", ".2f"), ("fused/copy", "fused_over_copy", ".2f"),
        ("unfused/fused", "unfused_over_fused", ".2f"), ("eager/fused", "eager_over_fused", ".2f"),
        ("fused/launch", "fused_launch_floors", ".2f"), ("fused launched us", "fused_launched_us", ".2f"),
    ], title=f"attention inputs, Qwen3-4B shapes ({HQ}/{HKV} heads, d={D}, page {PAGE}, bf16, q/k norm), "
             f"CUDA-graph replay times; copy {common.fmt(copy_gbps, '.0f')} GB/s; "
             f"one trivial launch {floor_graph.median_us:.2f} us (graph)")

    payload = {"env": env, "ceilings": ceil, "shapes": {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": D,
               "page_size": PAGE, "rotary_dim": ROT, "dtype": str(DTYPE), "decode_ctx": DECODE_CTX,
               "norms": True}, "launch_floor": {"graph": floor_graph, "events": floor_events},
               "accuracy": accuracy, "rows": rows, "errors": errors}
    common.save(NAME, payload, args)


if __name__ == "__main__":
    main()
