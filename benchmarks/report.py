"""Renders README's performance tables from the committed result files, so every
figure in README comes from benchmarks/results/<name>.json.

README holds one block per benchmark between the markers

    <!-- results:NAME -->
    ...
    <!-- /results:NAME -->

(NAME: prefill, decode, int8, inputs, model). This script replaces what lies
between them with a table rendered from benchmarks/results/NAME.json, headed by
the GPU, commit, date and command it came from and the ceilings measured in
the same run. A missing JSON leaves its block as it is (a note says so); a
missing marker pair is reported too. No torch needed.

    python3 benchmarks/report.py             # rewrites README.md in place
    python3 benchmarks/report.py --check     # exit 1 when README.md is out of date
    python3 benchmarks/report.py --print [--names decode,int8]   # the tables on stdout
                                             # (scripts/gpu_check.sh's summary)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import figures

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("prefill", "decode", "int8", "inputs", "model")

# Peers that get a column of their own in the prefill and decode tables (the
# fastest peer of each case, whichever it is, is named in the last columns).
PEER_COLUMNS = (("sdpa cudnn (contiguous)", "cuDNN SDPA"), ("sdpa flash (contiguous)", "flash SDPA"),
                ("flashinfer paged (auto backend)", "FlashInfer"), ("flashinfer paged decode", "FlashInfer"))
SHORT = dict(PEER_COLUMNS + (("gather+sdpa flash", "gather + flash SDPA"), ("eager reference", "eager")))


def f(x, fmt_spec: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt_spec)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list:
    """A Markdown table; the first column left-aligned, the others right-aligned."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def provenance(data: dict, source: str) -> list:
    """Where the figures come from: GPU, driver, versions, commit, date, command, ceilings."""
    env = data.get("env") or {}
    commit = env.get("commit")
    commit = f"`{commit[:12]}`" if commit else "unknown"
    if env.get("dirty"):
        commit += " with uncommitted changes"
    ceil = data.get("ceilings") or {}
    ceilings = []
    if ceil.get("copy_gbps"):
        ceilings.append(f"copy {ceil['copy_gbps']:.0f} GB/s")
    if ceil.get("gemm_tflops"):
        ceilings.append(f"bf16 GEMM {ceil['gemm_tflops']:.0f} TFLOP/s")
    lines = [f"{env.get('gpu', 'unknown GPU')} (driver {env.get('driver') or '?'}), torch {env.get('torch', '?')}, "
             f"CUDA {env.get('cuda', '?')}; commit {commit}, {env.get('date', '?')};",
             f"`{env.get('command', '?')}` ({source}).",
             "Ceilings measured in the same run: " + ", ".join(ceilings) + "." if ceilings else
             "No ceilings measured in this run."]
    return ["*" + " ".join(lines) + "*", ""]


def _row(rows, case, impl):
    return next((r for r in rows if r.get("case") == case and r.get("impl") == impl), None)


def _vs_peers(rows, value_key: str, value_head: str, pct_key: str, pct_head: str) -> list:
    """One line per case: ours (us, rate, % of ceiling), the peer columns
    present, and the fastest peer with t_peer / t_ours."""
    rows = [r for r in rows if r.get("role", "peer") != "dev"]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    present = {impl for impl in (r["impl"] for r in rows)}
    peers = [(impl, head) for impl, head in PEER_COLUMNS if impl in present]
    header = ["case", "ours us", value_head, pct_head] + [f"{h} us" for _, h in peers] + ["fastest peer",
                                                                                          "t_peer / t_ours"]
    out = []
    for c in cases:
        o, best = figures.ours(rows, c), figures.best_peer(rows, c)
        cells = [c, f(o and o["us"], ".1f"), f(o and o.get(value_key)), f(o and o.get(pct_key))]
        cells += [f((r := _row(rows, c, impl)) and r["us"], ".1f") for impl, _ in peers]
        cells += [SHORT.get(best["impl"], best["impl"]) if best else "-",
                  f(best["us"] / o["us"], ".2f") if best and o else "-"]
        out.append(cells)
    return table(header, out)


def render_prefill(data: dict) -> list:
    rows = data.get("rows") or []
    full = any(r.get("causal") is False for r in rows)
    out = (["Causal prefill over the paged cache (bf16, page 64); TFLOP/s of causal FLOPs "
            "(2 * 2 * L * L / 2 * d * Hq per prompt)"
            + ("; cases marked `full` are non-causal (2 * 2 * L * L * d * Hq)." if full else "."), ""]
           + _vs_peers(rows, "tflops", "TFLOP/s", "pct_gemm", "% of GEMM"))
    mixed = data.get("mixed") or []
    if mixed:
        out += ["", "Mixed steps (prompt chunks and single-query decodes in one step, Qwen3-4B heads) through "
                "the `attention` op, against the chunks and the decodes run alone, the same op with the parts one "
                "after the other (`TILEINFER_MIXED_DECODE_SMS=0`) and the prefill op over the whole step; the last "
                "rows are prompts without decodes:", ""]
        out += table(["step", "us", "chunks alone us", "decodes alone us", "t / (chunks + decodes)",
                      "in turn us", "t_in_turn / t", "prefill op us", "t / prefill op"],
                     [[r["case"], f(r.get("mixed_us"), ".1f"), f(r.get("chunks_us"), ".1f"),
                       f(r.get("decodes_us"), ".1f"), f(r.get("over_parts"), ".2f"),
                       f(r.get("in_turn_us"), ".1f"), f(r.get("in_turn_over_mixed"), ".2f"),
                       f(r.get("whole_prefill_us"), ".1f"), f(r.get("over_whole_prefill"), ".2f")]
                      for r in mixed])
    variants = data.get("variants") or []
    if variants:
        out += ["", "Per-layer variants on a causal prompt (attention op; Qwen3-4B heads, and gpt-oss's 64 / 8 "
                "heads of 64), against the same prompt without them; at d 64 also the variant on the kernels of two "
                "and of three consumer warpgroups (the first column takes the dispatcher's choice):", ""]
        out += table(["case", "variant us", "plain us", "t / plain", "2 consumers us", "3 consumers us"],
                     [[r["case"], f(r.get("variant_us"), ".1f"), f(r.get("plain_us"), ".1f"),
                       f(r.get("over_plain"), ".2f"), f(r.get("two_consumers_us"), ".1f"),
                       f(r.get("three_consumers_us"), ".1f")] for r in variants])
    return out


def render_decode(data: dict) -> list:
    out = (["Decode, one query per sequence (bf16, page 64), CUDA-graph replays; GB/s of the keys and values "
            "read once.", ""]
           + _vs_peers(data.get("rows") or [], "gbps", "GB/s", "pct_copy", "% of copy"))
    verify = data.get("verify") or []
    if verify:
        dec, pre = "decode path (attention op)", "prefill op"
        out += ["", "Verify steps (n queries at the end of one sequence of L positions): the `attention` op's "
                "decode path against the prefill op on the same inputs.", ""]
        out += table(["step", "decode path us", "prefill op us", "t_prefill / t_decode"],
                     [[c, f(d and d["us"], ".1f"), f(p and p["us"], ".1f"),
                       f(p["us"] / d["us"], ".2f") if d and p else "-"]
                      for c in dict.fromkeys(r["case"] for r in verify)
                      for d, p in [(_row(verify, c, dec), _row(verify, c, pre))]])
    variants = data.get("variants") or []
    if variants:
        out += ["", "Per-layer variants on the decode path: against plain decode on the same inputs, and against "
                "plain decode of the context a window reads.", ""]
        out += table(["case", "variant us", "plain us", "t / plain", "plain at", "us", "t / that"],
                     [[r["case"], f(r.get("variant_us"), ".1f"), f(r.get("plain_us"), ".1f"),
                       f(r.get("over_plain"), ".2f"), r.get("plain_reads", "-"), f(r.get("plain_reads_us"), ".1f"),
                       f(r.get("over_reads"), ".2f")] for r in variants])
    return out


# The quantized caches of bench_int8 (column label, decode row, prefill row).
QUANT_CACHES = (("int8", "tileinfer int8 (attention op)", "tileinfer int8 prefill"),
                ("fp8/tensor", "tileinfer fp8 per tensor (attention op)", "tileinfer fp8 per tensor prefill"),
                ("fp8/vector", "tileinfer fp8 per vector (attention op)", "tileinfer fp8 per vector prefill"))
FI_FP8 = "flashinfer fp8 decode (per tensor)"  # bench_int8's FlashInfer row
# The accuracy table's caches (bench_int8.ACCURACY_CACHES), bf16 first.
ACCURACY_CACHES = ("bf16", "int8", "int8 + smoothing", "fp8 per tensor", "fp8 per vector",
                   "fp8 per vector + smoothing")


def render_int8(data: dict) -> list:
    bf16 = "tileinfer bf16 (attention op)"
    rows = data.get("rows") or []
    cases = list(dict.fromkeys(r["case"] for r in rows))
    out = ["Decode on quantized caches (int8; fp8 e4m3 with per-tensor or per-vector scales) vs a bf16 cache "
           "holding the same data (our attention op, CUDA-graph replays): t_bf16 / t of each cache, and GB/s of "
           "the bytes each must read (k + v, plus fp32 scales per vector).", ""]
    quant = [(label, name) for label, name, _ in QUANT_CACHES if any(r["impl"] == name for r in rows)]
    out += table(["case", "bf16 us"] + [h for label, _ in quant for h in (f"{label} us", f"{label} speedup",
                                                                          f"{label} GB/s")],
                 [[c, f(b and b["us"], ".1f")] + [x for _, name in quant for i in [_row(rows, c, name)]
                                                  for x in (f(i and i["us"], ".1f"),
                                                            f(b["us"] / i["us"], ".2f") if i and b else "-",
                                                            f(i and i.get("gbps")))]
                  for c in cases for b in [_row(rows, c, bf16)]])
    fi = [r for r in rows if r["impl"] == FI_FP8]
    if fi:
        ours = QUANT_CACHES[1][1]
        out += ["", "FlashInfer's paged decode (tensor-core path) on the same fp8 pools with the same per-tensor "
                "scales: t_flashinfer / t_ours above 1 when ours is faster.", ""]
        out += table(["case", "fp8/tensor us", "FlashInfer fp8 us", "t_flashinfer / t_ours"],
                     [[r["case"], f(o and o["us"], ".1f"), f(r["us"], ".1f"), f(o and r["us"] / o["us"], ".2f")]
                      for r in fi for o in [_row(rows, r["case"], ours)]])
    prefill = data.get("prefill") or []
    if prefill:
        pb = "tileinfer bf16 prefill"
        pq = [(label, name) for label, _, name in QUANT_CACHES if any(r["impl"] == name for r in prefill)]
        out += ["", "Causal prefill on the quantized caches vs the bf16 cache (TFLOP/s; t_bf16 / t):", ""]
        out += table(["case", "bf16 TFLOP/s"] + [h for label, _ in pq for h in (f"{label} TFLOP/s",
                                                                                 f"{label} speedup")],
                     [[c, f(b and b.get("tflops"))] + [x for _, name in pq for i in [_row(prefill, c, name)]
                                                       for x in (f(i and i.get("tflops")),
                                                                 f(b["us"] / i["us"], ".2f") if i and b else "-")]
                      for c in dict.fromkeys(r["case"] for r in prefill) for b in [_row(prefill, c, pb)]])
    mixed = [r for r in data.get("mixed") or [] if r.get("role") == "ours"]
    if mixed:
        caches = [("bf16", bf16)] + [(label, name) for label, name, _ in QUANT_CACHES
                                     if any(r["impl"] == name for r in mixed)]
        out += ["", "Steps through the attention op on each cache (graph replays, us; in parentheses the time of "
                "the dev row over it: a step of two sequences or more with its parts in turn, a lone prompt "
                "with its decode launches first):", ""]
        out += table(["step"] + [label for label, _ in caches],
                     [[c] + [f"{f(r and r['us'], '.1f')} ({f(d and d.get('dev_over_default'), '.2f')})"
                             for _, name in caches for r in [_row(mixed, c, name)]
                             for d in [next((x for x in data["mixed"] if x["case"] == c and x["role"] == "dev"
                                             and x["impl"].startswith(name + ",")), None)]]
                      for c in dict.fromkeys(r["case"] for r in mixed)])
    acc = data.get("accuracy") or []
    if acc:
        out += ["", "Relative error ||out - exact|| / ||exact|| of a decode step against float64 attention on the "
                "unquantized bf16 inputs (in parentheses: float64 on the dequantized cache, the quantization "
                "alone). fp8 per tensor: a calibrated scale, amax / 448 of the layer's keys (values).", ""]
        lines = []
        for keys in dict.fromkeys(r.get("keys") for r in acc):
            e = {r.get("impl"): r.get("rel_error") for r in acc if r.get("keys") == keys}
            ctx = next((f"{r.get('batch')} x {r.get('ctx')}" for r in acc if r.get("keys") == keys), "")
            line = [f"{keys} ({ctx})", f(e.get("bf16 cache (attention op)"), ".1e")]
            for name in ACCURACY_CACHES[1:]:
                line.append(f"{f(e.get(f'{name} cache (attention op)'), '.1e')} "
                            f"({f(e.get(f'{name}: float64 on the dequantized cache'), '.1e')})")
            lines.append(line)
        out += table(["keys"] + list(ACCURACY_CACHES), lines)
    return out


def render_inputs(data: dict) -> list:
    rows = data.get("rows") or []
    floor = ((data.get("launch_floor") or {}).get("graph") or {}).get("median_us")
    out = ["attention_inputs (q/k RMSNorm + RoPE + paged cache write, Qwen3-4B shapes, bf16), CUDA-graph replays; "
           "GB/s of the fewest bytes a step moves" + (f"; one trivial launch: {floor:.2f} us." if floor else "."), ""]
    out += table(["step", "fused us", "fused % of copy", "same-bytes copy us", "separate ops us", "eager us",
                  "separate / fused", "eager / fused"],
                 [[r["case"], f(r.get("fused_us"), ".2f"), f(r.get("fused_of_copy") and 100 * r["fused_of_copy"]),
                   f(r.get("copy_us"), ".2f"), f(r.get("unfused_us"), ".2f"), f(r.get("eager_us"), ".2f"),
                   f(r.get("unfused_over_fused"), ".2f"), f(r.get("eager_over_fused"), ".2f")] for r in rows])
    return out


def render_model(data: dict) -> list:
    rows = data.get("rows") or []
    layers = data.get("layers") or (data.get("args") or {}).get("layers", "?")
    out = [f"Decode step of {layers} Qwen3-4B layers, both models captured in CUDA graphs: ours (paged cache, "
           "attention_inputs + attention) vs eager norms / RoPE + cuDNN SDPA on a contiguous cache.", ""]
    out += table(["batch x context", "ours us", "SDPA us", "ours tokens/s", "SDPA tokens/s", "t_sdpa / t_ours"],
                 [[r["label"], f(r.get("ours_us"), ".1f"), f(r.get("sdpa_us"), ".1f"), f(r.get("ours_tok_s")),
                   f(r.get("sdpa_tok_s")), f(r.get("speedup"), ".2f")] for r in rows])
    return out


RENDER: dict[str, Callable[[dict], list]] = {"prefill": render_prefill, "decode": render_decode,
                                             "int8": render_int8, "inputs": render_inputs, "model": render_model}


def render(name: str, data: dict, source: str) -> str:
    return "\n".join(provenance(data, source) + RENDER[name](data))


def load(results: Path, name: str) -> Optional[dict]:
    path = results / f"{name}.json"
    if not path.exists():
        return None
    with open(path) as fh:
        return json.load(fh)


def source_name(results: Path, name: str) -> str:
    path = (results / f"{name}.json").resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def update(text: str, results: Path, notes: list) -> str:
    """text with every marker block whose JSON exists re-rendered."""
    for name in NAMES:
        pattern = re.compile(rf"(<!-- results:{name} -->\n)(.*?)(<!-- /results:{name} -->)", re.S)
        if not pattern.search(text):
            notes.append(f"{name}: no <!-- results:{name} --> ... <!-- /results:{name} --> markers in the README")
            continue
        data = load(results, name)
        if data is None:
            notes.append(f"{name}: {source_name(results, name)} missing, its block left as it is")
            continue
        block = render(name, data, source_name(results, name)) + "\n"
        text = pattern.sub(lambda m, b=block: m.group(1) + b + m.group(3), text, count=1)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the file to update (default README.md)")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results",
                   help="where <name>.json are (default benchmarks/results)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when the file is out of date")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the tables instead of touching the README")
    p.add_argument("--names", default=",".join(NAMES), help=f"with --print: which (default {','.join(NAMES)})")
    a = p.parse_args(argv)

    if a.print_only:
        for name in a.names.split(","):
            if name not in RENDER:
                print(f"\n## {name}: no such benchmark ({', '.join(NAMES)})")
                continue
            data = load(a.results, name)
            print(f"\n## {name}\n")
            print(render(name, data, source_name(a.results, name)) if data else
                  f"no {source_name(a.results, name)}")
        return 0

    notes: list = []
    old = a.readme.read_text()
    new = update(old, a.results, notes)
    for n in notes:
        print(f"report: {n}")
    if a.check:
        if new != old:
            print(f"report: {a.readme} is out of date; run python3 benchmarks/report.py")
            return 1
        print(f"report: {a.readme} is up to date")
        return 0
    if new != old:
        a.readme.write_text(new)
        print(f"report: updated {a.readme}")
    else:
        print(f"report: {a.readme} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
