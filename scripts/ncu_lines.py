#!/usr/bin/env python3
"""Nsight Compute's warp stall samples per source line, without Nsight Compute here.

`ncu --page source --csv --print-source sass` gives each SASS instruction of a
profiled kernel its stall samples (by reason) and execution count, but no
source lines. This joins them, by offset in the function, with `nvdisasm -g`
of a cubin built here from the same sources and flags (refusing it where
more than 1% of the opcodes differ), and sums the samples per source line:

    # on the GPU machine (the extension built from these sources):
    ncu --clock-control none -k regex:prefill_kernel -s 1 -c 1 --section WarpStateStats \\
        --section SourceCounters -o /tmp/rep python3 benchmarks/profile_prefill.py --calls 0
    ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass | gzip > $OUT/rep.csv.gz
    # here:
    scripts/compile_check.sh --cubin /tmp/prefill.cubin csrc/ops/prefill.cu
    python3 scripts/ncu_lines.py rep.csv.gz --cubin /tmp/prefill.cubin [--kernel "signed char"] \\
        [--top 30] [--lines prefill_consumer.cuh:199,softmax.cuh:54]

`--kernel` picks, by a substring of its name, one of the kernels in the CSV
(default: the first); `--lines` lists the instructions of those lines (offset,
times executed, samples, SASS); `--by-count K` groups the instructions by
how many times they ran (a loop level each: per key tile, per work item, per
launch) and gives the K groups with the most samples. Samples are over all
of the kernel's warps: a line's share of them is its share of warp time,
whichever role runs it.
Needs nvdisasm (scripts/sass_check.py says where it looks).
"""
import argparse
import collections
import csv
import gzip
import io
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_check  # noqa: E402  (find_nvdisasm, parse, demangle)


def normalize(name):
    """A kernel signature as both tools can spell it: no namespaces, casts or spaces."""
    name = re.sub(r"\(bool\)0\b", "false", re.sub(r"\(bool\)1\b", "true", name))
    name = re.sub(r"\((int|unsigned int|long)\)", "", name)
    name = re.sub(r"\b\w+::", "", name)
    return re.sub(r"\s+", "", name)


def read_csv(path):
    """[(kernel name, [row dicts])] of an `ncu --page source --csv` file (plain or gzip)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        text = f.read()
    kernels, header = [], None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append((row[1], []))
            header = None
        elif row[0] == "Address":
            header = row
        elif header and kernels and len(row) == len(header):
            kernels[-1][1].append(dict(zip(header, row)))
    return kernels


def read_cubin(cubin):
    """sass_check.parse of a cubin's `nvdisasm -c -g` ({kernel: [(SASS text, file:line)]}, one
    instruction per 16 bytes), keyed by normalized (demangled) kernel names."""
    sass = subprocess.run([sass_check.find_nvdisasm(), "-c", "-g", cubin], capture_output=True, text=True,
                          check=True).stdout
    funcs, _ = sass_check.parse(sass)
    names = sass_check.demangle(list(funcs))
    return {normalize(names[k]): v for k, v in funcs.items()}


def opcode(text):
    """The opcode of a SASS instruction, without its predicate and modifiers."""
    text = re.sub(r"^@!?U?P\w+\s+", "", text.strip())
    return text.split(" ")[0].split(".")[0]


SAMPLES = "Warp Stall Sampling (All Samples)"


def at(ins, offset):
    """(SASS text, file:line) of the instruction at `offset` bytes into its function."""
    k = offset // 16
    return ins[k] if offset % 16 == 0 and 0 <= k < len(ins) else ("", None)


def join(rows, ins, base=None):
    """Samples per source line ({line: Counter of stall reasons and SAMPLES}),
    their total, and how many instructions' opcodes differ from the cubin's
    (`ins`: one function of read_cubin; `base`: the function's first address,
    by default that of the first row)."""
    base = int(rows[0]["Address"], 16) if base is None else base
    reasons = [h for h in rows[0] if h.startswith("stall_") and "Not Issued" not in h]
    per_line = collections.defaultdict(collections.Counter)
    total = collections.Counter()
    mismatched = 0
    for r in rows:
        text, line = at(ins, int(r["Address"], 16) - base)
        mismatched += opcode(r["Source"]) != opcode(text)
        for key in reasons + [SAMPLES]:
            v = int(r[key] or 0)
            per_line[line][key] += v
            total[key] += v
    return per_line, total, mismatched


def by_count(rows, ins):
    """The rows grouped by how many times the kernel's warps executed them:
    {count: (instructions, per-line samples as join gives them)}. The
    instructions of one loop level share a count (once a key tile, once a
    work item, once a launch), so the groups tell the levels apart."""
    base = int(rows[0]["Address"], 16)
    groups = collections.defaultdict(list)
    for r in rows:
        groups[int(r["Instructions Executed"] or 0)].append(r)
    return {count: (len(rs), join(rs, ins, base)[0]) for count, rs in groups.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    ap.add_argument("--cubin", required=True, help="the same sources compiled here (compile_check.sh --cubin)")
    ap.add_argument("--kernel", default="", help="a substring of the kernel's name in the CSV (default: the first)")
    ap.add_argument("--top", type=int, default=30, help="source lines to print, most samples first")
    ap.add_argument("--lines", default="", help="comma-separated file:line whose instructions to list")
    ap.add_argument("--by-count", type=int, default=0, metavar="K",
                    help="also the K execution counts with the most samples, each with its top lines")
    args = ap.parse_args()

    kernels = [k for k in read_csv(args.csv) if args.kernel in k[0]]
    if not kernels:
        sys.exit(f"ncu_lines: no kernel matching {args.kernel!r} in {args.csv}")
    name, rows = kernels[0]
    funcs = read_cubin(args.cubin)
    ins = funcs.get(normalize(name))
    if ins is None:
        sys.exit(f"ncu_lines: {name[:120]} is not in {args.cubin} (other sources or flags?)")
    per_line, total, mismatched = join(rows, ins)
    reasons = [k for k in total if k != SAMPLES]
    if mismatched > len(rows) // 100:
        sys.exit(f"ncu_lines: {mismatched} of {len(rows)} opcodes differ: the cubin is not the profiled build")
    samples = total[SAMPLES]
    print(f"{name[:160]}\n{len(rows)} instructions ({mismatched} opcodes differ), {samples} samples")
    print("reasons: " + ", ".join(f"{k[6:]} {100 * v / samples:.1f}%" for k, v in total.most_common()
                                   if k in reasons and v >= samples / 100))
    ranked = sorted(per_line.items(), key=lambda kv: -kv[1][SAMPLES])
    for line, c in ranked[:args.top]:
        share = 100 * c[SAMPLES] / samples
        top = ", ".join(f"{k[6:]} {v}" for k, v in c.most_common() if k in reasons and v > 0)
        print(f"{share:5.1f}%  {line}: {top[:120]}")
    groups = sorted(by_count(rows, ins).items(), key=lambda kv: -sum(c[SAMPLES] for c in kv[1][1].values())) \
        if args.by_count > 0 else []
    for count, (n, lines) in groups[:args.by_count]:
        share = 100 * sum(c[SAMPLES] for c in lines.values()) / samples
        print(f"== executed {count} times: {n} instructions, {share:.1f}% of samples")
        for line, c in sorted(lines.items(), key=lambda kv: -kv[1][SAMPLES])[:6]:
            print(f"  {100 * c[SAMPLES] / samples:5.1f}%  {line}")
    base = int(rows[0]["Address"], 16)
    for want in filter(None, args.lines.split(",")):
        print(f"== {want}  (offset, executed, samples, SASS)")
        for r in rows:
            off = int(r["Address"], 16) - base
            text, line = at(ins, off)
            if line == want:
                print(f"  {off:6x} {int(r['Instructions Executed'] or 0):9d} "
                      f"{int(r[SAMPLES] or 0):6d}  {text[:90]}")


if __name__ == "__main__":
    main()
