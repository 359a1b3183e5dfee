"""The short table scripts/gpu_check.sh prints last: key figures of the
benchmark JSON files (common.write_json's format: {"ceilings": {...}, "rows":
[{"case", "impl", "us", "gbps"/"tflops", ...}]}) and the test counts.

    python3 benchmarks/summary.py --results DIR [--tests-log FILE] [--build-log FILE]
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

OURS_DECODE = "tileinfer decode (attention op)"
OURS_PREFILL = "tileinfer prefill"
INT8_DECODE, BF16_DECODE = "tileinfer int8 (attention op)", "tileinfer bf16 (attention op)"
INT8_PREFILL, BF16_PREFILL = "tileinfer int8 prefill", "tileinfer bf16 prefill"


def latest(results: Path, name: str):
    files = sorted(results.glob(f"{name}_*.json"))
    if not files:
        return None
    with open(files[-1]) as f:
        return json.load(f)


def row(data, case, impl):
    for r in (data or {}).get("rows", []) + (data or {}).get("verify", []):
        if r.get("case") == case and r.get("impl") == impl:
            return r
    return None


def find(rows, case, impl):
    return next((r for r in rows or [] if r.get("case") == case and r.get("impl") == impl), None)


def int8_lines(data) -> list:
    """bench_int8.py: decode and prefill int8 vs bf16 (our ops), and the accuracy table."""
    out = ["int8 decode (attention op; speedup = t_bf16 / t_int8; GB/s of int8 k+v + fp32 scales):"]
    for case in dict.fromkeys(r.get("case") for r in data.get("rows", [])):
        i8, b16 = find(data["rows"], case, INT8_DECODE), find(data["rows"], case, BF16_DECODE)
        out.append(f"  {case:7s} int8 {f(i8 and i8['us'], '.1f'):>7s} us {f(i8 and i8.get('gbps')):>5s} GB/s "
                   f"{f(i8 and i8.get('pct_copy')):>3s}% copy | bf16 {f(b16 and b16['us'], '.1f'):>7s} us | "
                   f"speedup {ratio(b16, i8)}")
    prefill = data.get("prefill", [])
    if prefill:
        out.append("int8 prefill TFLOP/s (causal), int8 | bf16:")
        for case in dict.fromkeys(r.get("case") for r in prefill):
            i8, b16 = find(prefill, case, INT8_PREFILL), find(prefill, case, BF16_PREFILL)
            out.append(f"  {case:6s} int8 {f(i8 and i8.get('tflops')):>4s} | bf16 {f(b16 and b16.get('tflops')):>4s} "
                       f"| speedup {ratio(b16, i8)}")
    acc = data.get("accuracy", [])
    if acc:
        out.append("int8 accuracy, relative error vs float64 on the unquantized bf16 inputs "
                   "(in parentheses: float64 on the dequantized cache, the quantization alone):")
        for keys in dict.fromkeys(r.get("keys") for r in acc):
            err = {r.get("impl"): r.get("rel_error") for r in acc if r.get("keys") == keys}
            out.append(f"  {keys:16s} bf16 {f(err.get('bf16 cache (attention op)'), '.1e')} | int8 "
                       f"{f(err.get('int8 cache (attention op)'), '.1e')} "
                       f"({f(err.get('int8: float64 on the dequantized cache'), '.1e')}) | int8 smoothed "
                       f"{f(err.get('int8 smoothed cache (attention op)'), '.1e')} "
                       f"({f(err.get('int8 smoothed: float64 on the dequantized cache'), '.1e')})")
    return out


def f(x, spec=".0f"):
    return "-" if x is None else format(x, spec)


def ratio(a, b):
    """a / b for two rows' times (how many times faster b is than a)."""
    return f"{a['us'] / b['us']:.2f}x" if a and b else "-"


def test_counts(path: Path) -> str:
    if not path or not path.exists():
        return "tests: not run"
    text = path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", ln)]
    last = lines[-1].strip("= ") if lines else "no pytest summary line (crashed or timed out?)"
    return f"tests: {last}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--tests-log", type=Path)
    p.add_argument("--build-status", default="")
    p.add_argument("--sanitize-log", type=Path, help="scripts/sanitize.sh output: its verdict lines are shown")
    p.add_argument("--failed", default="", help="the steps that failed (gpu_check.sh), shown last")
    a = p.parse_args()
    dec, pre, inp, i8 = (latest(a.results, n) for n in ("bench_decode", "bench_prefill", "bench_inputs", "bench_int8"))
    out = ["", "================ gpu_check summary ================"]
    env = (dec or pre or inp or i8 or {}).get("env", {})
    out.append(f"card {env.get('card', '?')}  date {env.get('date', '?')}  torch {env.get('torch', '?')}"
               + (f"  build: {a.build_status}" if a.build_status else ""))
    for name, data in (("decode", dec), ("prefill", pre), ("inputs", inp), ("int8", i8)):
        ceil = (data or {}).get("ceilings") or {}
        if ceil.get("copy_gbps"):
            out.append(f"ceilings ({name} run): copy {f(ceil.get('copy_gbps'))} GB/s, "
                       f"bf16 GEMM {f(ceil.get('gemm_tflops'))} TFLOP/s")
    out.append(test_counts(a.tests_log))
    if a.sanitize_log and a.sanitize_log.exists():
        verdicts = [ln for ln in a.sanitize_log.read_text(errors="replace").splitlines()
                    if re.match(r"(memcheck|racecheck|initcheck|synccheck): ", ln)]
        out.extend(f"sanitize {ln}" for ln in verdicts or ["no verdict line (crashed or timed out?)"])

    if dec:
        out.append("decode (ours vs cuDNN SDPA on contiguous KV; ratio = t_peer / t_ours, >1: ours faster):")
        for case in ("1x32k", "32x4k", "128x2k", "8x32k", "1x1k"):
            o, c = row(dec, case, OURS_DECODE), row(dec, case, "sdpa cudnn (contiguous)")
            fl = row(dec, case, "flashinfer paged decode")
            if not (o or c):
                continue
            out.append(f"  {case:7s} ours {f(o and o['us'], '.1f'):>7s} us {f(o and o['gbps']):>5s} GB/s "
                       f"{f(o and o.get('pct_copy')):>3s}% copy | cudnn {f(c and c['us'], '.1f'):>7s} us "
                       f"{f(c and c['gbps']):>5s} GB/s | vs cudnn {ratio(c, o)}"
                       + (f" | flashinfer {f(fl['us'], '.1f')} us, vs ours {ratio(fl, o)}" if fl else ""))
        for case in ("verify n=16 L=2048", "verify n=16 L=256", "verify n=16 L=8192"):
            d, pf = row(dec, case, "decode path (attention op)"), row(dec, case, "prefill op")
            if d or pf:
                out.append(f"  {case}: decode path {f(d and d['us'], '.1f')} us, prefill op "
                           f"{f(pf and pf['us'], '.1f')} us, prefill/decode {ratio(pf, d)}")
    if pre:
        out.append("prefill TFLOP/s (causal), ours | flash | cudnn; ratio = t_peer / t_ours:")
        for case in ("1x512", "1x2k", "1x8k", "1x16k", "4x2k"):
            o = row(pre, case, OURS_PREFILL)
            fl, cu = row(pre, case, "sdpa flash (contiguous)"), row(pre, case, "sdpa cudnn (contiguous)")
            if not (o or fl or cu):
                continue
            out.append(f"  {case:6s} ours {f(o and o['tflops']):>4s} | flash {f(fl and fl['tflops']):>4s} "
                       f"({ratio(fl, o)}) | cudnn {f(cu and cu['tflops']):>4s} ({ratio(cu, o)})")
    if inp:  # bench_inputs.py: one row per step size, fused / unfused / eager times (graph replays)
        rows = [r for r in inp.get("rows", []) if r.get("fused_us") is not None]
        out.append("inputs (attention_inputs, graph replay; ratio = t_unfused / t_fused):" + ("" if rows else " no rows"))
        for r in rows[:8]:
            pct = r.get("fused_of_copy")
            out.append(f"  {r.get('case', '?'):15s} fused {f(r.get('fused_us'), '.1f'):>6s} us "
                       f"{f(r.get('fused_gbps')):>5s} GB/s {f(pct and 100 * pct):>3s}% copy | same-bytes copy "
                       f"{f(r.get('copy_us'), '.1f'):>6s} us | unfused "
                       f"{f(r.get('unfused_us'), '.1f'):>6s} us ({f(r.get('unfused_over_fused'), '.2f')}x)")
    if i8:
        out += int8_lines(i8)
    for name, data in (("decode", dec), ("prefill", pre), ("inputs", inp), ("int8", i8)):
        if data is None:
            out.append(f"{name}: no results")
        elif data.get("errors"):
            out.append(f"{name}: {len(data['errors'])} skipped/failed measurements (see log)")
    out.append(f"FAILED STEPS: {a.failed}" if a.failed.strip() else "every step that ran exited 0")
    print("\n".join(out))


if __name__ == "__main__":
    main()
