"""Helper of the CPU tests that compile a C++ program over the kernels'
host-and-device headers (not a test module)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def compile_tool(tmp_path_factory, source: str) -> Path:
    """tests/<source> built with the machine's C++ compiler against
    csrc/include; skips the test when there is none."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        pytest.skip("no C++ compiler on PATH (g++, c++ or clang++; or set CXX)")
    exe = tmp_path_factory.mktemp(Path(source).stem) / Path(source).stem
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", str(ROOT / "csrc" / "include"),
                    str(ROOT / "tests" / source), "-o", str(exe)], check=True)
    return exe
