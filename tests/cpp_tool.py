"""Helper of the tests that compile a program of their own: a C++ program over
the kernels' host-and-device headers, or a CUDA test kernel (not a test module)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def compile_tool(tmp_path_factory, source: str, command: list[str] | None = None, suffix: str = "") -> Path:
    """tests/<source> built into a private folder (each test worker its own:
    no shared build lock), named after it plus `suffix`. By default an
    executable from the machine's C++ compiler against csrc/include, and the
    test skips when there is none; `command` replaces that compiler and its
    flags (the source and `-o <output>` follow it)."""
    if command is None:
        cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        if not cxx:
            pytest.skip("no C++ compiler on PATH (g++, c++ or clang++; or set CXX)")
        # _FORTIFY_SOURCE set here as some toolchains set it by default: the
        # warnings it adds (an unchecked scanf) fail every machine alike.
        command = [cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2",
                   "-I", str(ROOT / "csrc" / "include")]
    out = tmp_path_factory.mktemp(Path(source).stem) / (Path(source).stem + suffix)
    subprocess.run([*command, str(ROOT / "tests" / source), "-o", str(out)], check=True, timeout=300)
    return out
