#!/usr/bin/env bash
# Builds the CUDA extension on a machine without a GPU, for the GPU machine's
# Python and torch, so that a call there skips its own build (about 150 s of
# device time on 16 cores): carry the file this prints, and run
# scripts/gpu_check.sh with SKIP_BUILD=1 (or the tests directly).
#
#   bash scripts/device_prebuild.sh                  # torch 2.11.0, CPython 3.12, sm_90a
#   TORCH_VERSION=2.11.0 PY_VERSION=3.12 bash scripts/device_prebuild.sh
#
# The extension links against libtorch of the version it was built with, so
# TORCH_VERSION must be the GPU machine's (its `python3 -c "import torch;
# print(torch.__version__)"`); the file is named for PY_VERSION's ABI
# (tileinfer_attn/_C.cpython-312-x86_64-linux-gnu.so), which other Pythons
# ignore, so it can sit beside a local build. Needs: a CPython of PY_VERSION
# (on PATH as python3.12, or through pyenv), nvcc, and about 1 GB of disk
# under PREBUILD_DIR (default /tmp/tileinfer_prebuild) for torch's wheel and
# a virtual environment; about 3 minutes on 2 cores once the wheel is there.
#
# torch's import needs its CUDA libraries (cuDNN, cuBLAS, ...), not the build:
# where another Python here has them (a CUDA build of torch installed), the
# environment links to those; otherwise pip installs the ones the wheel names.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
torch_version=${TORCH_VERSION:-2.11.0}
py=${PY_VERSION:-3.12}
dir=${PREBUILD_DIR:-/tmp/tileinfer_prebuild}
tag=cp${py/./}
venv=$dir/venv-$tag-torch$torch_version
mkdir -p "$dir"

if command -v "python$py" >/dev/null && "python$py" -c "" 2>/dev/null; then
  pyexe=("python$py")
elif command -v pyenv >/dev/null && full=$(pyenv versions --bare | grep -E "^$py\.[0-9]+$" | tail -1) && [ -n "$full" ]; then
  pyexe=(env "PYENV_VERSION=$full" pyenv exec python)
else
  echo "device_prebuild: no CPython $py here (python$py or pyenv)"; exit 2
fi

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  rm -rf "$venv"
  "${pyexe[@]}" -m venv "$venv"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --platform manylinux_2_28_x86_64 -d "$dir" "torch==$torch_version"
  wheel=$(ls "$dir"/torch-"$torch_version"-"$tag"-*.whl | head -1)
  "$venv/bin/pip" install -q --no-deps "$wheel"
  "$venv/bin/pip" install -q "setuptools<82" ninja numpy typing_extensions sympy filelock jinja2 networkx fsspec
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  theirs=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null || true)
  if [ -n "$theirs" ] && [ -d "$theirs/cudnn" ]; then
    ln -s "$theirs" "$site/nvidia"
  else
    unzip -p "$wheel" '*/METADATA' | sed -nE 's/^Requires-Dist: (nvidia-[^;]*).*platform_system == "Linux".*/\1/p' \
      | tr -d ' ' | xargs "$venv/bin/pip" install -q --no-deps
  fi
  "$venv/bin/python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
fi

# A copy of the tracked tree (an in-place build here would leave objects of
# another ABI in build/), built with the machine's nvcc for sm_90a. The copy
# is made anew but for build/, with the files' mtimes, so that ninja rebuilds
# what changed and no deleted source lingers (setup.py globs csrc/cpu/).
src=$dir/src-$tag
mkdir -p "$src"
find "$src" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$src"
(cd "$src" && TILEINFER_BUILD=cuda TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-2} \
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} "$venv/bin/python" setup.py -q build_ext --inplace >"$dir/build-$tag.log" 2>&1) \
  || { tail -30 "$dir/build-$tag.log"; echo "device_prebuild: build failed (log $dir/build-$tag.log)"; exit 1; }
so=$(cd "$src" && ls tileinfer_attn/_C.cpython-"${tag#cp}"-*.so)
cp "$src/$so" "$root/$so"
"$venv/bin/python" -c "import sys; sys.path.insert(0, '$src'); import tileinfer_attn, torch; torch.ops.tileinfer_attn.attention"
echo "$so"
