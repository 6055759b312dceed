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
#                              the long ones in gtest shards (run_parallel_tests below).
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

# run_parallel_tests DIR SPEC...: each SPEC is "TEST_EXECUTABLE SHARDS FILTER"; an
# executable with SHARDS > 1 runs as that many gtest shards (GTEST_TOTAL_SHARDS /
# GTEST_SHARD_INDEX: each test in exactly one shard). The shards and executables
# run `jobs` at a time, in the order given (longest first), each into its own log
# under DIR/test-logs/. Then one line per run (gtest's PASSED / FAILED / SKIPPED
# counts, seconds); a failed run (any non-zero exit: a failing test, a sanitizer
# report, a crash) gets its whole log printed and fails the call.
run_parallel_tests() {
  local dir=$1
  shift
  local logs=$dir/test-logs names=() failed=() spec t shards filter i name running=0
  rm -rf "$logs"
  mkdir -p "$logs"
  for spec in "$@"; do
    read -r t shards filter <<<"$spec"
    for ((i = 0; i < shards; i++)); do
      name=$t
      [ "$shards" -gt 1 ] && name=$t.shard$((i + 1))of$shards
      names+=("$name")
      if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
      fi
      (
        start=$SECONDS status=0
        GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
          "$dir/bin/$t" --gtest_filter="$filter" --gtest_brief=1 >"$logs/$name.log" 2>&1 || status=$?
        echo "$status $((SECONDS - start))" >"$logs/$name.status"
      ) &
      running=$((running + 1))
      echo "sanitize: started $name ($dir/bin/$t, filter $filter)" >&2
    done
  done
  wait
  local status seconds counts
  for name in "${names[@]}"; do
    status=1 seconds=?
    [ -f "$logs/$name.status" ] && read -r status seconds <"$logs/$name.status"
    counts=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$logs/$name.log" | tr -s ' ' | tr '\n' ' ')
    echo "sanitize: $name: exit $status, ${seconds} s: ${counts:-no gtest summary}" >&2
    if [ "$status" != 0 ]; then
      failed+=("$name")
      echo "sanitize: ---- $logs/$name.log ----" >&2
      cat "$logs/$name.log" >&2
      echo "sanitize: ---- end of $logs/$name.log ----" >&2
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "sanitize: FAILED: ${failed[*]} (logs above and in $logs/)" >&2
    return 1
  fi
}

# The whole training suite is the longest under ASan even with TILEATTN_TEST_QUICK=1
# (the float64 backward reference per case); CI leaves out the generic/AVX-512
# backward table and the determinism sweep. `asan` runs it all.
training_filter_ci='-BackwardDeterminism.*:Table/BackwardCases.*generic*:Table/BackwardCases.*avx512*'
# The CI's ASan+UBSan runs, "EXECUTABLE SHARDS FILTER" (run_parallel_tests), longest
# first. CPU seconds on the 2-core AMX Xeon (2026-12-03, before the coverage hooks
# left the tests): training ~410 (half of it Bf16Rungs/BackwardBf16Probabilities.*,
# nearly all of that the float64 reference), core ~200 (Bf16ProbabilitiesShow.* alone
# ~60), inference ~60, the rest ~10.
asan_runs_ci=("training_tests 6 $training_filter_ci" "core_tests 3 *" "inference_tests 2 *"
              "capi_tests 1 *" "reliability_tests 1 *" "io_tests 1 *")
tsan_filter='Concurrency.*:CApiErrors.LastErrorIsPerThread'

# CI's TSan build compiles only the test files of the tests it runs (TILEATTN_TEST_FILES,
# tests/CMakeLists.txt); run_tests fails if a filter matches no test, so a test that
# moves to another file is noticed.
tsan_files_ci='core/thread_pool_test.cpp;capi/errors_test.cpp;reliability/concurrency_test.cpp'

ci_asan() {
  # One clang ASan+UBSan build (build-fuzz) serves these tests and the
  # fuzzers, so CI compiles the library once for both.
  FUZZ_BUILD_ONLY=1 FUZZ_ALSO_BUILD="$(for r in "${asan_runs_ci[@]}"; do printf '%s ' "${r%% *}"; done)" scripts/fuzz.sh
  TILEATTN_TEST_QUICK=1 run_parallel_tests build-fuzz "${asan_runs_ci[@]}"
  scripts/fuzz.sh 20
}

ci_tsan() {
  build build-tsan thread OFF -DTILEATTN_TEST_FILES="$tsan_files_ci" -DTILEATTN_LIBRARY_OPTIMIZATION=-O1 \
    -- reliability_tests capi_tests core_tests
  run_tests build-tsan "$tsan_filter" reliability_tests capi_tests
  # The thread pool's own tests (polling, late workers, region closing).
  run_tests build-tsan 'ThreadPool.*' core_tests
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
