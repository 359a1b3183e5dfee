"""scripts/sass_check.py on SASS text of known shape (no GPU, no nvdisasm):
the key loop it finds, its spills and where its exp2s fall against the wait
for the products in flight, and the kernel names it prints."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
module_spec = importlib.util.spec_from_file_location("sass_check", ROOT / "scripts" / "sass_check.py")
sass_check = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(sass_check)

# A function with an outer loop (items) around an inner loop (tiles) that
# issues both products; the inner loop holds one spill, one exp2 before the
# wait for every product and two after it.
SASS = """
.text._Z6kernel:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        //## File "/x/prefill_consumer.cuh", line 300
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3 ;
.L_x_2:
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88, gsb0 ;
        //## File "/x/softmax.cuh", line 54
        /*0040*/                   MUFU.EX2 R5, R5 ;
        //## File "/x/prefill_mask.cuh", line 61
        /*0050*/                   LDL R6, [R1+0x8] ;
        //## File "/x/wgmma.cuh", line 64
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        //## File "/x/softmax.cuh", line 54
        /*0070*/                   MUFU.EX2 R7, R7 ;
        /*0080*/                   MUFU.EX2 R8, R8 ;
        /*0090*/              @!P0 BRA `(.L_x_2) ;
        /*00a0*/                   STL [R1], R9 ;
        /*00b0*/              @!P1 BRA `(.L_x_1) ;
        /*00c0*/                   EXIT ;
.text._Z5other:
        /*0000*/                   EXIT ;
"""


def test_the_innermost_loop_that_issues_both_products():
    funcs, labels = sass_check.parse(SASS)
    assert set(funcs) == {"_Z6kernel", "_Z5other"}
    ins = funcs["_Z6kernel"]
    first, last = sass_check.key_loop(ins, labels["_Z6kernel"])
    assert ins[first][0].startswith("HGMMA") and ins[last][0].startswith("@!P0 BRA")
    assert sass_check.loop_report(ins, labels["_Z6kernel"]) == (8, ["prefill_mask.cuh:61"], 2)
    assert sass_check.key_loop(funcs["_Z5other"], labels["_Z5other"]) is None


def test_a_softmax_ahead_of_the_wait_has_no_exp2_after_it():
    moved = SASS.replace("""        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        //## File "/x/softmax.cuh", line 54
        /*0070*/                   MUFU.EX2 R7, R7 ;
        /*0080*/                   MUFU.EX2 R8, R8 ;""", """        /*0070*/                   MUFU.EX2 R7, R7 ;
        /*0080*/                   MUFU.EX2 R8, R8 ;
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;""")
    assert moved != SASS
    funcs, labels = sass_check.parse(moved)
    assert sass_check.loop_report(funcs["_Z6kernel"], labels["_Z6kernel"])[2] == 0


def test_a_loop_with_one_product_is_not_the_key_loop():
    funcs, labels = sass_check.parse(SASS.replace("R88, R152, gdesc", "R88, gdesc"))
    assert sass_check.key_loop(funcs["_Z6kernel"], labels["_Z6kernel"]) is None


def test_short_names():
    full = ("void tileinfer::sm90::prefill_kernel<tileinfer::sm90::PrefillTile<__nv_bfloat16, 128, "
            "__nv_fp8_e4m3, true, 2>, false, (tileinfer::sm90::CapForm)2>(tileinfer::sm90::PrefillParams)")
    assert sass_check.short_name(full) == "bf16 d128 fp8 vec uncapped"
    full = ("void tileinfer::sm90::prefill_kernel<tileinfer::sm90::PrefillTile<__half, 64, __half, false, 2>, "
            "true, (tileinfer::sm90::CapForm)0>(tileinfer::sm90::PrefillParams)")
    assert sass_check.short_name(full) == "fp16 d64 hand-out"
    full = ("void tileinfer::sm90::prefill_kernel<tileinfer::sm90::PrefillTile<__nv_bfloat16, 64, "
            "__nv_bfloat16, false, 3>, false, (tileinfer::sm90::CapForm)1>(tileinfer::sm90::PrefillParams)")
    assert sass_check.short_name(full) == "bf16 d64 3 consumers fixed-offset"
