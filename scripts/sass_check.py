#!/usr/bin/env python3
"""What ptxas made of the Hopper prefill kernels' key loop, without a GPU.

For each warp-specialized prefill kernel, from its SASS: the consumers'
steady-state key loop (the innermost loop that issues both products: S from
shared memory, P V with P from registers), its length in instructions, the
spill loads and stores inside it (with their source lines), and how many of
its exp2s come after the wait for every product in flight
(`WARPGROUP.DEPBAR.LE gsb0, 0x0`, the wait for the P V of the tile before):
0 means the softmax runs under the warpgroup's own P V; as many as a
thread's scores of a tile (64 at d 128, plus its rows' factors) mean that
it waits for it first (prefill_consumer.cuh, "intra-warpgroup"). Counts
are static: the loop's branches (masked tiles, soft-caps) hold
instructions of their own.

    python3 scripts/sass_check.py                     # compiles csrc/ops/prefill.cu (scripts/compile_check.sh --cubin)
    python3 scripts/sass_check.py --cubin prefill.cubin [--filter "bf16 d128"]

Needs nvdisasm: on PATH, in $CUDA_HOME/bin, named by $NVDISASM, or from the
nvidia-cuda-nvdisasm wheel (pip install nvidia-cuda-nvdisasm).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_nvdisasm():
    cands = [os.environ.get("NVDISASM"), shutil.which("nvdisasm"),
             os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvdisasm")]
    cands += glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "*", "bin", "nvdisasm"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("sass_check: nvdisasm not found (set NVDISASM, or pip install nvidia-cuda-nvdisasm)")


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out))


# The kernels' CapForm (prefill_consumer.cuh) as its demangled value: what short_name adds for it.
CAP_FORMS = {"0": "", "1": " fixed-offset", "2": " uncapped"}


def short_name(full):
    """'bf16 d128 fp8 vec hand-out fixed-offset' (or 'bf16 d64 3 consumers ...',
    'bf16 d128 int8 vec uncapped') from the demangled signature."""
    m = re.search(r"PrefillTile<([^>]*)>\s*,\s*(true|false)\s*,\s*\([\w:]*CapForm\)(\d)", full)
    if not m:
        return full[:100]
    t, d, cache, vec, *consumers = [x.strip() for x in m.group(1).split(",")]
    names = {"__nv_bfloat16": "bf16", "__half": "fp16", "__nv_fp8_e4m3": "fp8", "signed char": "int8"}
    cache = names.get(cache, cache)
    s = f"{names.get(t, t)} d{d}" + ("" if cache in ("bf16", "fp16") else f" {cache}" + (" vec" if vec == "true" else " tensor"))
    s += " 3 consumers" if consumers == ["3"] else ""
    return s + (" hand-out" if m.group(2) == "true" else "") + CAP_FORMS.get(m.group(3), f" cap form {m.group(3)}")


def parse(sass):
    """{function: [(instruction, source 'file:line')]} and each function's labels -> instruction index."""
    funcs, labels, cur, loc = {}, {}, None, "?"
    for line in sass.split("\n"):
        if line.startswith(".text."):
            cur = line[len(".text."):].rstrip(":")
            funcs[cur], labels[cur], loc = [], {}, "?"
            continue
        if cur is None:
            continue
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            labels[cur][m.group(1)] = len(funcs[cur])
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            loc = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            funcs[cur].append((m.group(1).strip(), loc))
    return funcs, labels


def key_loop(ins, labels):
    """(first, last) of the innermost loop issuing both products, or None."""
    best = None
    for i, (text, _) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", text)
        if not m or labels.get(m.group(1), i) >= i:
            continue
        j = labels[m.group(1)]
        body = [t for t, _ in ins[j:i + 1] if "HGMMA" in t]
        has_ss = any(re.search(r"HGMMA\S* R\d+, gdesc", t) for t in body)
        has_rs = any(re.search(r"HGMMA\S* R\d+, R\d+, gdesc", t) for t in body)
        if has_ss and has_rs and (best is None or i - j < best[1] - best[0]):
            best = (j, i)
    return best


def loop_report(ins, labels):
    """(loop length, spill sources in it, exp2s after its last wait<0> or None), or None without a key loop."""
    span = key_loop(ins, labels)
    if span is None:
        return None
    body = ins[span[0]:span[1] + 1]
    spills = [loc for t, loc in body if re.match(r"(@!?P\d+\s+)?(LDL|STL)\b", t)]
    waits = [k for k, (t, _) in enumerate(body) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in t]
    ex2 = [k for k, (t, _) in enumerate(body) if "MUFU.EX2" in t]
    # The steady state's wait for the P V (the first tile's comes before the loop).
    after = sum(k > waits[-1] for k in ex2) if waits else None
    return len(body), spills, after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cubin", help="a cubin of csrc/ops/prefill.cu (default: compile it)")
    ap.add_argument("--filter", default="", help="only kernels whose short name contains this")
    args = ap.parse_args()
    nvdisasm = find_nvdisasm()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = args.cubin
        if cubin is None:
            cubin = os.path.join(tmp, "prefill.cubin")
            subprocess.run(["bash", os.path.join(ROOT, "scripts", "compile_check.sh"), "--cubin", cubin,
                            "csrc/ops/prefill.cu"], check=True, cwd=ROOT)
        sass = subprocess.run([nvdisasm, "-c", "-g", cubin], capture_output=True, text=True, check=True).stdout
    funcs, labels = parse(sass)
    names = demangle([f for f in funcs if "prefill_kernel" in f])
    print(f"{'kernel':36} {'loop':>5} {'spills':>6} {'exp2 after wait<0>':>19}  spill sources")
    for f in sorted(names, key=lambda f: short_name(names[f])):
        name = short_name(names[f])
        if args.filter not in name:
            continue
        report = loop_report(funcs[f], labels[f])
        if report is None:
            print(f"{name:36} no key loop found")
            continue
        length, spills, after = report
        after = "-" if after is None else str(after)
        print(f"{name:36} {length:5} {len(spills):6} {after:>19}  {', '.join(sorted(set(spills)))}")


if __name__ == "__main__":
    main()
