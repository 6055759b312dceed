#!/usr/bin/env bash
# Quick start, command 2: builds and runs every test (C++ via CTest, Python via
# pytest). Installs what is missing first, so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
# Every test must run here (setup.sh installed MPI, torch, ...): a test that
# would skip for a missing dependency fails instead (tests/mpi/tests.cmake,
# tests/python/conftest.py, the AMX check of tests/core/peak_test.cpp).
export TILEATTN_REQUIRE_ALL=1
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j "$jobs"
scripts/sanitize.sh ci  # ASan+UBSan tests, 20 s per fuzzer, TSan (docs/reliability.md)
if [ -x scripts/test_python.sh ]; then
  scripts/test_python.sh
fi
