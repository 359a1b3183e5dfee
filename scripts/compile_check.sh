#!/usr/bin/env bash
# Compiles CUDA/C++ sources of the extension one by one with the flags of
# setup.py, into a scratch folder: a quick check on a machine without a GPU
# that the code compiles, plus the register / spill report of every kernel.
#   scripts/compile_check.sh csrc/ops/prefill.cu [more files...]
#   scripts/compile_check.sh --cubin out.cubin csrc/ops/prefill.cu   # one .cu to a cubin (scripts/sass_check.py)
set -euo pipefail
cd "$(dirname "$0")/.."
cubin=""
if [ "${1:-}" = "--cubin" ]; then cubin=$2; shift 2; fi
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
inc=$(python3 -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I'+p for p in include_paths()))" 2>/dev/null)
pyinc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
common="-I$CUDA_HOME/include -Icsrc -Icsrc/include $inc -I$pyinc -DTILEINFER_WITH_CUDA -DTILEINFER_SM90A -DTORCH_EXTENSION_NAME=_C -D_GLIBCXX_USE_CXX11_ABI=1 -std=c++20 -O3"
cuda="-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo"
[ -z "$cubin" ] || exec nvcc $common $cuda -cubin "$1" -o "$cubin"
out=$(mktemp -d)
for f in "$@"; do
  case "$f" in
    *.cu) nvcc $common $cuda -Xptxas=-v -Xcompiler -fPIC -c "$f" -o "$out/$(basename "$f").o" 2>&1 \
            | grep -v -E "^ptxas info\s+: (Function properties|Compile time)" | sed -E "s/^ptxas info +: Compiling entry function .(_Z[^ ]*). for .*/\1/" | c++filt || exit 1 ;;
    *) g++ $common -fPIC -c "$f" -o "$out/$(basename "$f").o" || exit 1 ;;
  esac
  echo "compiled $f"
done
rm -rf "$out"
