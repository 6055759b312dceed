#!/usr/bin/env bash
# Installs PyTorch (CPU use only) into .venv for the Python package's tests.
# See docs/python.md for the measured cost of each way to install it.
#
# PyPI's only Linux x86-64 torch wheel is the CUDA build: `pip install torch`
# pulls ~2.3 GB of nvidia-* CUDA wheels on top of the 515 MB torch wheel
# (5.3 GB installed). `import torch` needs the CUDA libraries to load even on
# the CPU (libtorch_cuda.so links them), so `--no-deps` alone does not work.
# Where a CUDA 13 runtime is already installed system-wide (the CUDA toolkit on
# this project's machines), torch without its dependencies, its pure-Python
# dependencies and the four CUDA libraries the toolkit lacks or has too old
# are enough: ~1 GB to download, 2.1 GB installed. If `import torch` still
# fails, the full default install follows.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TORCH_VERSION=2.15.0
# torch 2.15.0's own pins for these (its wheel METADATA).
TORCH_CUDA_EXTRAS=(nvidia-cufile==1.17.1.22 nvidia-cusparselt-cu13==0.8.1
                   nvidia-nvshmem-cu13==3.7.2 nvidia-nccl-cu13==2.30.7)
TORCH_PURE_DEPS=(filelock "typing-extensions>=4.13.0" "setuptools>=77.0.3" "sympy>=1.13.3"
                 "networkx>=2.5.1" jinja2 "fsspec>=0.8.5")

torch_works() { "$PY" -c "import torch; torch.ones(1) + 1" >/dev/null 2>&1; }

if torch_works; then
  exit 0
fi
echo "setup: installing torch $TORCH_VERSION (light: system CUDA runtime + 4 CUDA wheels)" >&2
"$PY" -m pip install -q "${TORCH_PURE_DEPS[@]}"
"$PY" -m pip install -q --no-deps "torch==$TORCH_VERSION" "${TORCH_CUDA_EXTRAS[@]}"
if ! torch_works; then
  echo "setup: no usable CUDA runtime on this machine; installing torch with its default CUDA wheels (~2.8 GB)" >&2
  "$PY" -m pip install -q "torch==$TORCH_VERSION"
fi
torch_works || { echo "setup: import torch fails after installing it" >&2; exit 1; }
