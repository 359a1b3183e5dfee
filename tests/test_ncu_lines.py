"""scripts/ncu_lines.py on a source-page CSV and SASS text of known shape (no
GPU, no Nsight Compute, no nvdisasm): kernels read from the CSV, names matched
across the two tools' spellings, samples summed per source line, and a build
whose opcodes differ told apart."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
module_spec = importlib.util.spec_from_file_location("ncu_lines", ROOT / "scripts" / "ncu_lines.py")
ncu_lines = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(ncu_lines)

# Two kernels, as `ncu --page source --csv --print-source sass` writes them
# (only the columns the script reads; the real page has ~70).
HEADER = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait",' \
         '"stall_short_sb","stall_wait (Not Issued)"'
CSV = f'''"Kernel Name","void ns::kern<ns::Tile<__half, (int)128, signed char, (bool)1>, (bool)0>(ns::Params)",
{HEADER}
"0x7f0000000000","      MOV R1, c[0x0][0x28]","1","10","1","0","1"
"0x7f0000000010","      LDS.128 R8, [R2]","2","10","0","2","0"
"0x7f0000000020","      FMUL R4, R8, R4","30","10","5","25","5"
"0x7f0000000030","      @!P0 BRA `(.L_x_1)","7","10","7","0","7"
"Kernel Name","void other(int)",
{HEADER}
"0x7f0000001000","      EXIT","3","1","3","0","3"
'''

SASS = """.text._Z4kern:
        //## File "/x/prefill_kernel.cuh", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        //## File "/x/prefill_consumer.cuh", line 199
        /*0010*/                   LDS.128 R8, [R2] ;
        /*0020*/                   FMUL R4, R8, R4 ;
        //## File "/x/prefill_smem.cuh", line 143
        /*0030*/              @!P0 BRA `(.L_x_1) ;
"""


def test_samples_summed_per_source_line(tmp_path):
    path = tmp_path / "rep.csv"
    path.write_text(CSV)
    kernels = ncu_lines.read_csv(str(path))
    assert [len(rows) for _, rows in kernels] == [4, 1]
    name, rows = kernels[0]
    ins = ncu_lines.sass_check.parse(SASS)[0]["_Z4kern"]
    per_line, total, mismatched = ncu_lines.join(rows, ins)
    assert mismatched == 0 and total[ncu_lines.SAMPLES] == 40
    consumer = per_line["prefill_consumer.cuh:199"]
    assert consumer[ncu_lines.SAMPLES] == 32 and consumer["stall_short_sb"] == 27 and consumer["stall_wait"] == 5
    assert per_line["prefill_smem.cuh:143"]["stall_wait"] == 7
    assert all("Not Issued" not in key for key in total)


def test_names_match_across_the_two_spellings():
    csv_name = "void ns::kern<ns::Tile<__half, (int)128, signed char, (bool)1>, (bool)0>(ns::Params)"
    demangled = "void ns::kern<ns::Tile<__half, 128, signed char, true>, false>(ns::Params)"
    assert ncu_lines.normalize(csv_name) == ncu_lines.normalize(demangled)
    assert ncu_lines.normalize(csv_name) != ncu_lines.normalize(demangled.replace("true", "false"))


def test_another_build_is_told_apart(tmp_path):
    path = tmp_path / "rep.csv"
    path.write_text(CSV)
    _, rows = ncu_lines.read_csv(str(path))[0]
    shifted = [("NOP", None)] + ncu_lines.sass_check.parse(SASS)[0]["_Z4kern"]
    _, _, mismatched = ncu_lines.join(rows, shifted)
    assert mismatched == 4
    assert ncu_lines.opcode("@!P0 BRA `(.L_x_1)") == "BRA" and ncu_lines.opcode("LDS.128 R8, [R2]") == "LDS"


def test_samples_grouped_by_execution_count(tmp_path):
    # The FMUL of the first kernel ran twice as often as its other instructions: a loop level of its own.
    path = tmp_path / "rep.csv"
    path.write_text(CSV.replace('FMUL R4, R8, R4","30","10"', 'FMUL R4, R8, R4","30","20"'))
    _, rows = ncu_lines.read_csv(str(path))[0]
    ins = ncu_lines.sass_check.parse(SASS)[0]["_Z4kern"]
    groups = ncu_lines.by_count(rows, ins)
    assert sorted(groups) == [10, 20]
    n, lines = groups[20]
    assert n == 1 and lines["prefill_consumer.cuh:199"][ncu_lines.SAMPLES] == 30
    n, lines = groups[10]
    assert n == 3 and lines["prefill_consumer.cuh:199"][ncu_lines.SAMPLES] == 2
    assert lines["prefill_kernel.cuh:10"][ncu_lines.SAMPLES] == 1 and lines["prefill_smem.cuh:143"]["stall_wait"] == 7
