#!/usr/bin/env bash
# Installs what tileattn needs on a fresh Debian 12 machine (idempotent; skips
# what is already there). Python packages go into .venv at the repository root.
#
#   scripts/setup.sh          everything
#   scripts/setup.sh system   the Debian packages and an empty .venv (what the C++
#                             builds need; CMake finds .venv/bin/python)
#   scripts/setup.sh python   the Python packages into .venv (scripts/test.sh runs
#                             this while the C++ builds compile)
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
case "$part" in
  all | system | python) ;;
  *) echo "usage: scripts/setup.sh [system|python]" >&2; exit 2 ;;
esac

# Debian packages: one list, each feature adds its own here.
APT_PACKAGES=(
  build-essential cmake pkg-config git
  ninja-build                                  # the sanitizer builds (scripts/fuzz.sh, scripts/sanitize.sh)
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and micro-benchmarks
  libopenblas-dev                              # the naive GEMM+softmax+GEMM baseline of `bench`
  python3 python3-venv python3-dev              # the Python package and its tests
  libopenmpi-dev openmpi-bin                    # ring attention across processes (tileattn-ring)
  doxygen                                      # the API reference (`cmake --build build --target docs`)
  clang-14 libclang-rt-14-dev                  # libFuzzer targets (scripts/fuzz.sh)
)

install_system() {
  local missing=() pkg SUDO=""
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
}
[ "$part" = python ] || install_system
[ "$part" = system ] && exit 0

# Python packages (PyPI), into .venv.
PIP_PACKAGES=(numpy pytest nanobind scikit-build-core safetensors
              matplotlib onnx onnxruntime  # bench/report.py plots (~100 MB installed); ONNX Runtime peer of the benchmarks (~115 MB)
              "openvino~=2026.4.0"  # OpenVINO SDPA peer (bench/sweep_peers.py, bench/compare_bf16.py), ~180 MB installed (+0.3 MB openvino-telemetry)
              "transformers>=5.0")  # tileattn.transformers and its tests (~145 MB with tokenizers); tested with 5.24
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q "${PIP_PACKAGES[@]}"
# PyTorch for the Python package (its tests must run): a lighter install when the
# machine has a CUDA runtime, see scripts/install_torch.sh and docs/python.md.
scripts/install_torch.sh
