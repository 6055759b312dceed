#!/usr/bin/env bash
# Sanitizer builds and runs (see docs/reliability.md).
#
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer (build-asan):
#                              the library and every C++ test executable, all run
#   scripts/sanitize.sh tsan   ThreadSanitizer (build-tsan): the threaded tests
#   scripts/sanitize.sh ci     the CI-sized run: ASan+UBSan (clang, build-fuzz) over core, io,
#                              inference, capi and reliability tests (TILEATTN_TEST_QUICK=1), the
#                              training tests without the generic/AVX-512 backward table and the
#                              determinism sweep, 20 s of each fuzzer, then TSan over the
#                              concurrency tests. The ASan test executables run JOBS at a time,
#                              the long ones in gtest shards (scripts/gtest_shards.sh).
#
# Any sanitizer report fails the run: UBSan halts on its first finding.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-ci}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

# build DIR KIND CLI [CMAKE_OPTION...] -- TARGET...: configures and builds the
# targets in DIR with sanitizer KIND (gcc, the project's compiler; -O1 keeps the
# runs short and the reports exact; -g1, line tables, is what the reports' stack
# traces use, and compiles faster than -g). The CLI is built only for the full ASan
# run (its tests run the binary).
# TILEATTN_UNITY_TESTS=ON|OFF in the environment sets that option here and in
# scripts/fuzz.sh (scripts/test.sh turns it on).
build() {
  local dir=$1 kind=$2 cli=$3 generator=() options=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    options+=("$1")
    shift
  done
  shift
  # Ninja, where installed, for a new build dir: it builds the several targets
  # asked for at once (Unix Makefiles builds them one after another).
  [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1" \
    -DTILEATTN_SANITIZE="$kind" -DTILEATTN_SANITIZE_DEBUG_INFO=-g1 -DTILEATTN_BUILD_PYTHON=OFF -DTILEATTN_BUILD_MPI=OFF \
    -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_BUILD_CLI="$cli" \
    ${TILEATTN_UNITY_TESTS:+-DTILEATTN_UNITY_TESTS=$TILEATTN_UNITY_TESTS} "${options[@]}" >/dev/null
  cmake --build "$dir" -j "$jobs" --target "$@"
}

# run_tests DIR FILTER TEST_EXECUTABLE...: runs each executable's tests matching
# FILTER; fails on a failing test, a sanitizer report, or a filter that matches no
# test.
run_tests() {
  local dir=$1 filter=$2 out status
  shift 2
  for t in "$@"; do
    echo "sanitize: $dir/bin/$t ($filter)" >&2
    status=0
    out=$("$dir/bin/$t" --gtest_filter="$filter" --gtest_brief=1 2>&1) || status=$?
    printf '%s\n' "$out"
    [ "$status" -eq 0 ] || return "$status"
    if ! grep -qE '^\[==========\] [1-9][0-9]* tests? from' <<<"$out"; then
      echo "sanitize: $dir/bin/$t: no test matches $filter" >&2
      return 1
    fi
  done
}


# The whole training suite is the longest under ASan even with TILEATTN_TEST_QUICK=1
# (the float64 backward reference per case); CI leaves out the generic/AVX-512
# backward table and the determinism sweep, and runs each case of the bf16 rungs'
# tables (Bf16Rungs/*) on one of the two rungs (docs/reliability.md, "CI"). `asan`
# runs it all.
# bf16_rung_split: gtest negative patterns leaving each Bf16Rungs/* case of the training
# tests on one of the two bf16 rungs (index i = 2 x case + rung: keeps i mod 4 = 0 on
# avx512bf16 and i mod 4 = 3 on amx).
bf16_rung_split() {
  local r patterns=() rung
  for r in 2 6; do patterns+=("Bf16Rungs/*_avx512bf16_$r"); done
  for r in 1 5 9; do patterns+=("Bf16Rungs/*_amx_$r"); done
  for ((r = 0; r < 100; r++)); do
    [ $((r % 4)) = 2 ] && patterns+=("Bf16Rungs/*_avx512bf16_*$(printf %02d $r)")
    [ $((r % 4)) = 1 ] && patterns+=("Bf16Rungs/*_amx_*$(printf %02d $r)")
  done
  local IFS=:
  echo "${patterns[*]}"
}
# The *Show tests repeat, case for case, the library calls of the Bf16Probabilities
# tests (run_bf16_probabilities, BackwardData with the same flags) to count how
# often the rounding shows: nothing more for ASan to see; they run in CTest.
training_filter_ci="-BackwardDeterminism.*:Table/BackwardCases.*generic*:Table/BackwardCases.*avx512*:BackwardBf16ProbabilitiesShow.*:$(bf16_rung_split)"
core_filter_ci='-Bf16ProbabilitiesShow.*'
# The CI's ASan+UBSan runs, "EXECUTABLE SHARDS FILTER" (scripts/gtest_shards.sh),
# longest first. Shard seconds in a clean-clone CI run (2026-12-03, two shards at a
# time beside CTest): training ~390, core ~230 (Bf16ProbabilitiesShow.* ~65 of it),
# inference ~110, the rest ~20 -- before the rung split and the *Show filters.
asan_runs_ci=("training_tests 4 $training_filter_ci" "core_tests 3 $core_filter_ci" "inference_tests 2 *"
              "capi_tests 1 *" "reliability_tests 1 *" "io_tests 1 *")
tsan_filter='Concurrency.*:CApiErrors.LastErrorIsPerThread'

# CI's TSan build compiles only the test files of the tests it runs (TILEATTN_TEST_FILES,
# tests/CMakeLists.txt); run_tests fails if a filter matches no test, so a test that
# moves to another file is noticed.
tsan_files_ci='core/thread_pool_test.cpp;core/thread_runtime_test.cpp;capi/errors_test.cpp;reliability/concurrency_test.cpp'

ci_asan() {
  # One clang ASan+UBSan build (build-fuzz) serves these tests and the
  # fuzzers, so CI compiles the library once for both.
  FUZZ_BUILD_ONLY=1 FUZZ_ALSO_BUILD="$(for r in "${asan_runs_ci[@]}"; do printf '%s ' "${r%% *}"; done)" scripts/fuzz.sh
  TILEATTN_TEST_QUICK=1 JOBS=$jobs scripts/gtest_shards.sh build-fuzz "${asan_runs_ci[@]}"
  scripts/fuzz.sh 20
}

ci_tsan() {
  build build-tsan thread OFF -DTILEATTN_TEST_FILES="$tsan_files_ci" -DTILEATTN_LIBRARY_OPTIMIZATION=-O1 \
    -- reliability_tests capi_tests core_tests
  run_tests build-tsan "$tsan_filter" reliability_tests capi_tests
  # The thread pool's own tests (polling, late workers, region closing) and
  # the regions on another runtime's threads.
  run_tests build-tsan 'ThreadPool.*:ThreadRuntime.*' core_tests
}

case "$mode" in
  asan)
    build build-asan address,undefined ON -DTILEATTN_TEST_FILES= -DTILEATTN_LIBRARY_OPTIMIZATION=-O3 -- all
    for t in build-asan/bin/*_tests; do run_tests build-asan '*' "$(basename "$t")"; done
    ;;
  tsan)
    build build-tsan thread OFF -DTILEATTN_TEST_FILES= -DTILEATTN_LIBRARY_OPTIMIZATION=-O3 \
      -- reliability_tests capi_tests core_tests
    run_tests build-tsan "$tsan_filter" reliability_tests capi_tests
    # The core tests drive the pool from one thread with every thread count.
    run_tests build-tsan '*Thread*:*thread*' core_tests
    ;;
  ci)
    ci_asan
    ci_tsan
    ;;
  ci-asan) ci_asan ;;  # scripts/test.sh runs these two at the same time
  ci-tsan) ci_tsan ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan|ci|ci-asan|ci-tsan" >&2
    exit 2
    ;;
esac
echo "sanitize: $mode clean" >&2
