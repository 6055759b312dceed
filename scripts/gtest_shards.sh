#!/usr/bin/env bash
# Runs GoogleTest executables whole, in gtest shards, JOBS at a time (default: the
# core count), each into its own log; used by scripts/sanitize.sh (the ASan tests)
# and scripts/test.sh (the Release test executables whose per-test start-up would
# dominate under CTest).
#
#   scripts/gtest_shards.sh BUILD_DIR "EXECUTABLE SHARDS FILTER"...
#
# Each EXECUTABLE is BUILD_DIR/bin/EXECUTABLE; with SHARDS > 1 it runs as that many
# gtest shards (GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX: each test in exactly one
# shard). The runs start in the order given (longest first), in the directory
# GTEST_SHARDS_CWD (default: the current one), each into BUILD_DIR/test-logs/<run>.log.
# Then one line per run (gtest's PASSED / FAILED / SKIPPED counts, seconds); a failed
# run (any non-zero exit: a failing test, a sanitizer report, a crash) or one that
# ran no test gets its whole log printed, and the script exits 1.
set -euo pipefail
dir=$(cd "$1" && pwd)
shift
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
cwd=${GTEST_SHARDS_CWD:-.}
logs=$dir/test-logs
names=() failed=() running=0
rm -rf "$logs"
mkdir -p "$logs"
for spec in "$@"; do
  read -r t shards filter <<<"$spec"
  [ -x "$dir/bin/$t" ] || { echo "gtest_shards: no $dir/bin/$t" >&2; exit 1; }
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
      cd "$cwd"
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
        "$dir/bin/$t" --gtest_filter="$filter" --gtest_brief=1 >"$logs/$name.log" 2>&1 || status=$?
      echo "$status $((SECONDS - start))" >"$logs/$name.status"
    ) &
    running=$((running + 1))
    echo "gtest_shards: started $name ($dir/bin/$t, filter $filter)" >&2
  done
done
wait
for name in "${names[@]}"; do
  status=1 seconds=?
  [ -f "$logs/$name.status" ] && read -r status seconds <"$logs/$name.status"
  counts=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$logs/$name.log" | tr -s ' ' | tr '\n' ' ' || true)
  echo "gtest_shards: $name: exit $status, ${seconds} s: ${counts:-no gtest summary}" >&2
  if [ "$status" = 0 ] && ! grep -qE '^\[==========\] [1-9][0-9]* tests? from' "$logs/$name.log"; then
    status="ran no test"
  fi
  if [ "$status" != 0 ]; then
    failed+=("$name")
    echo "gtest_shards: ---- $logs/$name.log ($status) ----" >&2
    cat "$logs/$name.log" >&2
    echo "gtest_shards: ---- end of $logs/$name.log ----" >&2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "gtest_shards: FAILED: ${failed[*]} (logs above and in $logs/)" >&2
  exit 1
fi
