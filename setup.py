"""Build of tileinfer_attn's extension (tileinfer_attn._C).

A CUDA extension where nvcc and a CUDA build of torch are present, a CPU-only
one otherwise; the version's local label says which (0.1.0+cu130, 0.1.0+cpu),
and `pip install -v` prints it. Environment (read at build time only):
  TILEINFER_BUILD=cuda|cpu   force one (default: auto)
  TORCH_CUDA_ARCH_LIST       e.g. "9.0a"; default -gencode=arch=compute_90a,code=sm_90a
  MAX_JOBS                   parallel compile jobs (torch's ninja build honours it)
  TILEINFER_PTXAS_VERBOSE=1  print registers / spills of every kernel
"""
import glob
import os
import sys

from setuptools import find_packages, setup

# torch guesses CUDA_HOME from the nvcc on PATH; where that is a wrapper script
# (as on our CI machines), point it at the toolkit itself.
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))


def want_cuda() -> bool:
    mode = os.environ.get("TILEINFER_BUILD", "auto").lower()
    if mode not in ("auto", "cuda", "cpu"):
        raise RuntimeError(f"TILEINFER_BUILD must be auto, cuda or cpu, got {mode!r}")
    have = cpp_extension.CUDA_HOME is not None and torch.version.cuda is not None
    if mode == "cuda" and not have:
        raise RuntimeError(
            "TILEINFER_BUILD=cuda but no CUDA toolchain (CUDA_HOME) or torch is a CPU build "
            f"(torch {torch.__version__}, CUDA_HOME={cpp_extension.CUDA_HOME})"
        )
    return have if mode == "auto" else mode == "cuda"


def rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def extension():
    """The extension to build, and whether it is the CUDA one."""
    cuda = want_cuda()
    sources = rel(
        [f"{ROOT}/csrc/torch_bindings.cpp", f"{ROOT}/csrc/checks.cpp", f"{ROOT}/csrc/attention.cpp"]
        + glob.glob(f"{ROOT}/csrc/cpu/*.cpp")
    )
    # The C++ standard is left to torch's build helper (torch >= 2.10 needs C++20).
    cxx = ["-O3"]
    nvcc = [
        "-O3",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        # torch adds these to keep half operators out of headers; our kernels use
        # the cuda_bf16/cuda_fp16 intrinsics directly, so undo them.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
    ]
    if cuda:
        sources += rel(glob.glob(f"{ROOT}/csrc/ops/*.cu"))
        cxx.append("-DTILEINFER_WITH_CUDA")
        nvcc.append("-DTILEINFER_WITH_CUDA")
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            # Hopper's own target (wgmma / setmaxnreg need the "a" variant). Set
            # TORCH_CUDA_ARCH_LIST to build for other cards instead.
            os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
        # Kernels that exist only as sm_90a code (wgmma prefill) are dispatched
        # only when the build has that code.
        archs = os.environ["TORCH_CUDA_ARCH_LIST"].replace(";", " ").split()
        if any(a.startswith("9.0a") for a in archs):
            cxx.append("-DTILEINFER_SM90A")
            nvcc.append("-DTILEINFER_SM90A")
        if os.environ.get("TILEINFER_PTXAS_VERBOSE"):
            nvcc.append("-Xptxas=-v")
        ext = cpp_extension.CUDAExtension
    else:
        ext = cpp_extension.CppExtension
    what = "CUDA" if cuda else "CPU-only"
    # Shown by `pip install -v` and by a failed build; a quiet install shows the
    # version's label instead (below).
    print(f"tileinfer_attn: building the {what} extension ({len(sources)} sources)", file=sys.stderr)
    return ext(
        name="tileinfer_attn._C",
        sources=sources,
        include_dirs=[f"{ROOT}/csrc", f"{ROOT}/csrc/include"],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc} if cuda else {"cxx": cxx},
    ), cuda


ext, cuda = extension()
# The local version label names the build (as torch's own: 2.x+cu130), so that
# `pip install .` reports it: "Successfully installed tileinfer_attn-0.1.0+cpu".
label = f"cu{torch.version.cuda.replace('.', '')}" if cuda else "cpu"

# Name, description, Python and torch requirements: pyproject.toml.
setup(
    version=f"0.1.0+{label}",
    packages=find_packages(include=["tileinfer_attn", "tileinfer_attn.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
