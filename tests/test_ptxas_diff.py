"""scripts/ptxas_diff.py on ptxas reports of known shape (no GPU, no nvcc):
the kernels it reads, and which it lists as differing."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
module_spec = importlib.util.spec_from_file_location("ptxas_diff", ROOT / "scripts" / "ptxas_diff.py")
ptxas_diff = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(ptxas_diff)

# compile_check.sh's report: the demangled name, its frame line, its
# registers; a global line before them and the file's end line after.
BASE = """ptxas info    : 28 bytes gmem
void tileinfer::combine_kernel<float, 128, false, 1>(tileinfer::AttentionParams)
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 166 registers, used 0 barriers
void tileinfer::attention_tile_kernel<A, tileinfer::DecodeWalkWork>(tileinfer::AttentionParams)
    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
void tileinfer::gone_kernel(tileinfer::AttentionParams)
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
compiled csrc/ops/decode.cu
"""
CAND = BASE.replace("12 bytes spill stores, 12 bytes spill loads", "0 bytes spill stores, 0 bytes spill loads") \
    .replace("16 bytes stack frame", "0 bytes stack frame").replace("""void tileinfer::gone_kernel(tileinfer::AttentionParams)
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
""", "")


def test_parse_reads_every_kernel():
    kernels = ptxas_diff.parse(BASE)
    assert kernels == {
        "void tileinfer::combine_kernel<float, 128, false, 1>(tileinfer::AttentionParams)": (166, 0, 0, 0),
        "void tileinfer::attention_tile_kernel<A, tileinfer::DecodeWalkWork>(tileinfer::AttentionParams)":
            (255, 12, 12, 16),
        "void tileinfer::gone_kernel(tileinfer::AttentionParams)": (32, 0, 0, 0),
    }


def test_short_drops_the_namespace_and_parameters():
    assert ptxas_diff.short("void tileinfer::rows_kernel<__half, 128>(tileinfer::InputsParams)") == \
        "rows_kernel<__half, 128>"


def test_rows_lists_what_differs():
    lines = ptxas_diff.rows(ptxas_diff.parse(BASE), ptxas_diff.parse(CAND))
    assert len(lines) == 2
    assert "spill st     12 -> 0" in lines[0] and "attention_tile_kernel<A, DecodeWalkWork>" in lines[0]
    assert "regs     32 -> -" in lines[1] and lines[1].endswith("gone_kernel")
    assert len(ptxas_diff.rows(ptxas_diff.parse(BASE), ptxas_diff.parse(CAND), show_all=True)) == 3
    assert ptxas_diff.rows(ptxas_diff.parse(BASE), ptxas_diff.parse(BASE)) == []
    assert len(ptxas_diff.rows(ptxas_diff.parse(BASE), ptxas_diff.parse(CAND), pattern="Walk")) == 1
