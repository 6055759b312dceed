#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan, build-fuzz) and runs
# each over its corpus for SECONDS seconds (default 20; see docs/reliability.md).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     e.g. scripts/fuzz.sh 600 fuzz_npy
#
# New inputs that reach new code are added to fuzz/corpus/<target without
# fuzz_>/ only when FUZZ_GROW_CORPUS=1 (CI leaves the tree unchanged). A
# crash leaves its input in build-fuzz/findings/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_forward fuzz_npy fuzz_kv_cache fuzz_backward)
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# FUZZ_ALSO_BUILD: more targets of this ASan+UBSan build (scripts/sanitize.sh ci
# builds its test executables here, so CI compiles the library once for both).
# Ninja, where installed, for a new build-fuzz: it builds the several targets
# asked for at once (Unix Makefiles builds them one after another).
generator=()
[ ! -f build-fuzz/CMakeCache.txt ] && command -v ninja >/dev/null && generator=(-G Ninja)
# -g1: line tables (the reports' file:line), a faster compile than -g. The
# library at -O2 as well (not the release -O3): its ASan+UBSan objects compile
# in ~0.75 of the time (docs/reliability.md, "CI").
CC=${CC:-clang-14} CXX=${CXX:-clang++-14} cmake -S . -B build-fuzz "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DTILEATTN_SANITIZE_DEBUG_INFO=-g1 -DTILEATTN_LIBRARY_OPTIMIZATION=-O2 \
  -DTILEATTN_BUILD_FUZZERS=ON -DTILEATTN_SANITIZE=address,undefined -DTILEATTN_BUILD_TESTS=ON \
  -DTILEATTN_BUILD_CLI=OFF -DTILEATTN_BUILD_PYTHON=OFF -DTILEATTN_BUILD_MPI=OFF \
  -DTILEATTN_BUILD_EXAMPLES=OFF ${TILEATTN_UNITY_TESTS:+-DTILEATTN_UNITY_TESTS=$TILEATTN_UNITY_TESTS} >/dev/null
read -r -a also <<<"${FUZZ_ALSO_BUILD:-}"
cmake --build build-fuzz -j "$jobs" --target "${targets[@]}" "${also[@]}"
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
mkdir -p build-fuzz/findings
for t in "${targets[@]}"; do
  corpus=fuzz/corpus/${t#fuzz_}
  work=build-fuzz/corpus-${t#fuzz_}
  mkdir -p "$corpus" "$work"
  dirs=("$work" "$corpus")
  [ "${FUZZ_GROW_CORPUS:-0}" = 1 ] && dirs=("$corpus")
  echo "fuzz: $t for ${seconds}s over $corpus" >&2
  # -timeout: one input may take at most 10 s; -rss_limit_mb: the harness
  # allocates at most a few MB per view.
  status=0
  "build-fuzz/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -artifact_prefix=build-fuzz/findings/ -print_final_stats=1 "${dirs[@]}" >"build-fuzz/$t.log" 2>&1 ||
    status=$?
  if [ "$status" -ne 0 ]; then
    tail -n 60 "build-fuzz/$t.log" >&2
    echo "fuzz: $t found a problem (see build-fuzz/findings/ and build-fuzz/$t.log)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "build-fuzz/$t.log" >&2 || true
done
echo "fuzz: ${targets[*]} clean after ${seconds}s each" >&2
