#!/usr/bin/env bash
# Configures and builds tileattn (Release) into ./build. Extra arguments go to cmake.
# TILEATTN_UNITY_TESTS=ON|OFF in the environment sets that option (tests/CMakeLists.txt;
# scripts/test.sh turns it on); unset, the build directory keeps what it had.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${TILEATTN_UNITY_TESTS:+-DTILEATTN_UNITY_TESTS=$TILEATTN_UNITY_TESTS} "$@" >/dev/null
cmake --build build -j "$jobs"
