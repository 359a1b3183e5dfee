#!/usr/bin/env python3
"""What a change does to the kernels' registers, spills and stack, without a
GPU: two ptxas reports of scripts/compile_check.sh (a base and a candidate),
kernel by kernel, the kernels that differ (or all of them).

    (cd .ab/base && bash scripts/compile_check.sh csrc/ops/decode.cu) > /tmp/base.log
    bash scripts/compile_check.sh csrc/ops/decode.cu > /tmp/cand.log
    python3 scripts/ptxas_diff.py /tmp/base.log /tmp/cand.log [--filter DecodeWalkWork] [--all]

Each line: registers, spill stores / loads and stack frame bytes, base ->
candidate ("-" for a kernel one report lacks), and the kernel's name without
the namespace and the parameter list. Exit status 0 either way.
"""
import argparse
import re
import sys

USED = re.compile(r"Used (\d+) registers")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse(text):
    """{kernel name: (registers, spill stores, spill loads, stack bytes)} of one report."""
    kernels, name, frame = {}, None, (0, 0, 0)
    for line in text.splitlines():
        m = FRAME.search(line)
        if m and name:
            frame = (int(m.group(2)), int(m.group(3)), int(m.group(1)))
            continue
        m = USED.search(line)
        if m and name:
            kernels[name] = (int(m.group(1)),) + frame
            name, frame = None, (0, 0, 0)
            continue
        if line and not line[0].isspace() and not line.startswith(("ptxas", "compiled ", "nvcc")):
            name = line.strip()
    return kernels


def short(name):
    """The name without `void`, the namespace and the parameter list."""
    name = re.sub(r"\([^()]*\)$", "", name)
    return re.sub(r"^void ", "", name).replace("tileinfer::", "")


def cell(v, i):
    return "-" if v is None else str(v[i])


def rows(base, cand, show_all=False, pattern=None):
    """Lines for the kernels of either report (in the candidate's order, then
    the base's), those that differ unless show_all."""
    out = []
    for name in list(cand) + [n for n in base if n not in cand]:
        if pattern and not re.search(pattern, name):
            continue
        a, b = base.get(name), cand.get(name)
        if a == b and not show_all:
            continue
        cols = [f"{cell(a, i)} -> {cell(b, i)}" for i in range(4)]
        out.append(f"regs {cols[0]:>11}  spill st {cols[1]:>11}  ld {cols[2]:>11}  stack {cols[3]:>11}  {short(name)}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("cand")
    ap.add_argument("--filter", help="regular expression on the kernel names")
    ap.add_argument("--all", action="store_true", help="every kernel, not only those that differ")
    args = ap.parse_args(argv)
    with open(args.base) as f:
        base = parse(f.read())
    with open(args.cand) as f:
        cand = parse(f.read())
    lines = rows(base, cand, args.all, args.filter)
    print("\n".join(lines) if lines else "no kernel differs")
    print(f"({len(base)} kernels in {args.base}, {len(cand)} in {args.cand})", file=sys.stderr)


if __name__ == "__main__":
    main()
